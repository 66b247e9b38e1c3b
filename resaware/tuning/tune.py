"""Tuning a model under budgets: MetaSchedule searches, resaware decides where it measures and what it keeps.

For each budget: realise it as a core set, open that budget's slot in the store, and run
MetaSchedule's evolutionary search (`resaware.tuning.search`, in resaware's weighted task order) with a
builder pool and a measuring worker confined to the budget's cores. The tuner searches and builds on
those cores and on any no measuring worker has; while a batch is timed it keeps off the measuring
cores, searching and building the next batch on the others if it has any, else waiting
(`measure.TunerCores`). With `concurrency` k > 1 the budget's tasks are sharded across k client
processes, each on its own partition (`resaware.tuning.clients`).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RunnerInput

from resaware.budget import Budget, CpuShare, announce, apart_from
from resaware.errors import ResawareError
from resaware.frontend import intrinsics
from resaware.frontend.model import Model, resolve
from resaware.frontend.plan import Plan
from resaware.frontend.tasks import Task, extract, lower
from resaware.platform import confine, hardware, quiet
from resaware.store import Slot, Store, mean_seconds
from resaware.tuning import clients, remote, transfer
from resaware.tuning.measure import ConfinedRunner, Timing, build_one, remove_artifact
from resaware.tuning.report import BudgetResult, ClientReport, TaskResult, TuneReport, Verification
from resaware.tuning.search import UNLIMITED


class _Tally:
    """Counts trials, best task latencies and the model estimate as batches land; drives the bar."""

    def __init__(self, bar, tasks: list[Task], best: dict[int, float], trials: int, start: float):
        self.bar, self.names, self.weights = bar, [t.name for t in tasks], [t.weight for t in tasks]
        self.best, self.trials, self.start = dict(best), trials, start
        # After each batch: (seconds since start, trials in the store, estimate in seconds or None).
        self.history: list[tuple[float, int, float | None]] = []

    def estimate(self) -> float | None:
        if len(self.best) < len(self.weights):
            return None
        return sum(w * self.best[i] for i, w in enumerate(self.weights))

    def add(self, task: int, n: int, best: float | None) -> None:
        if best is not None:
            self.best[task] = min(self.best.get(task, best), best)
        self.trials += n
        self.history.append((time.monotonic() - self.start, self.trials, self.estimate()))
        if self.bar is not None:
            self.bar.update(n)
            shown = f"{self.best[task] * 1e6:.0f}us" if task in self.best else "-"
            self.bar.set_postfix_str(f"{self.names[task][:28]} best {shown}", refresh=False)


def _verify(slot: Slot, tasks: list[Task], target, runners: list, top: int = 3, rounds: int = 5) -> list[Verification]:
    """Re-measure the best schedules of the heaviest tasks with nothing else of resaware running: on
    `runners[0]` alone, and, given more runners, on all at once; rounds interleave the two.

    A drift from what tuning recorded shows measurements disturbed while tuning (by concurrent
    clients, or by the machine); the together/alone ratio tells the two apart."""
    database = slot.database()
    stats = slot.stats(database)
    ranked = sorted(
        (t for t in tasks if (s := stats.get(t.workload_hash)) and s.best_s is not None),
        key=lambda t: -t.weight * stats[t.workload_hash].best_s,
    )[:top]
    built = []
    try:
        for task in ranked:
            (record,) = database.get_top_k(database.commit_workload(task.mod), 1)
            sch = tvm.s_tir.Schedule(task.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            try:
                artifact = build_one(sch.mod, target)
            except Exception:  # noqa: S112 - a record that no longer builds has nothing to verify
                continue
            args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            built.append((task.name, mean_seconds(record.run_secs), RunnerInput(artifact, "cpu", args)))
        inputs = [item for _, _, item in built]
        alone, together = [], []
        for _ in range(rounds):
            alone.append(_times(runners[0], inputs))
            if len(runners) > 1:
                with ThreadPoolExecutor(len(runners)) as pool:
                    together.append(list(pool.map(lambda r: _times(r, inputs), runners))[0])
        checks = []
        for i, (name, recorded, _) in enumerate(built):
            mine = [r[i] for r in alone]
            both = [r[i] for r in together]
            if None not in mine and None not in both:
                checks.append(Verification(name, recorded, statistics.median(mine),
                                           statistics.median(both) if both else None))  # fmt: skip
        return checks
    finally:
        for _, _, item in built:
            remove_artifact(item.artifact_path)
        for runner in runners:
            if hasattr(runner, "close"):
                runner.close()


def _times(runner, inputs) -> list[float | None]:
    futures = runner.run(inputs)
    return [mean_seconds(f.result().run_secs) for f in futures]


def _results(tasks: list[Task], slot: Slot) -> list[TaskResult]:
    stats = slot.stats()
    return [
        TaskResult(
            t.name, t.weight, t.flops, s.trials if (s := stats.get(t.workload_hash)) else 0, s.best_s if s else None
        )
        for t in tasks
    ]


def _stopped_by(reports: list[ClientReport]) -> str:
    """What ended the budget: a time limit if it stopped any client, else what stopped the last one."""
    reasons = [r.stopped_by for r in reports]
    return "time" if "time" in reasons else max(reasons, key=["trials", "search space"].index)


def _tune_budget(model: Model | Plan, slot: Slot, target, asked: Budget, cores, concurrency: int, trials: int,
                 time_limit: float | None, progress: str | None, measure, verifier,
                 warm_from: Store | None) -> BudgetResult:  # fmt: skip
    """Tune one budget's slot: `measure(tasks, before, deadline, on_batch, donor, first_batch)` runs the
    clients and returns their reports; `verifier(clients)` gives the runners that re-measure the best
    schedules; `progress` labels the progress bar (None: no bar); `warm_from` is the store whose other
    budgets may warm-start this one (None: start cold)."""
    start = time.monotonic()
    intrinsics.register("llvm")
    if isinstance(model, Plan):
        tasks, layout = model.tasks, None
        for name in model.models:
            mine = [replace(t, weight=w[name]) for t, w in zip(tasks, model.weights) if name in w]
            slot.remember_tasks(mine, name, complete=True)
    else:
        lowered, layout = lower(model, target)
        tasks = extract(model, target, lowered)
        slot.remember_tasks(tasks, model.name, complete=True)
    if not tasks:
        raise ResawareError(f"model {model.name} has no tunable kernels")
    slot.commit_workloads([t.mod for t in tasks])  # before any tuner appends (see SharedAppends)
    stats = slot.stats()
    before = sum(s.trials for t in tasks if (s := stats.get(t.workload_hash)))
    stopped_by, verification, tally, reports, donor = "already tuned", [], None, [], None
    if before < trials:
        if warm_from is not None:
            donor, first_batch = transfer.begin(slot, warm_from, {t.workload_hash for t in tasks}, before == 0,
                                                len(confine.usable_cores()))  # fmt: skip
        else:
            first_batch = None
        if donor is not None and progress is not None:
            print(
                f"resaware: {progress}: warm start from the {donor.fraction:.0%} budget ({donor.key})", file=sys.stderr
            )
        bar = _progress_bar(progress, None if trials == UNLIMITED else trials - before)
        best = {i: s.best_s for i, t in enumerate(tasks) if (s := stats.get(t.workload_hash)) and s.best_s is not None}
        tally = _Tally(bar, tasks, best, before, start)
        try:
            deadline = time.time() + time_limit if time_limit else None
            reports = measure(tasks, before, deadline, tally.add, donor, first_batch)
        finally:
            if bar is not None:
                bar.close()
                if bar.fp_owned:
                    bar.fp.close()
        stopped_by = _stopped_by(reports)
        verification = _verify(slot, tasks, target, verifier(len(reports)))
    stats = slot.stats()
    return BudgetResult(
        budget=str(asked), realised=slot.fraction, cores=list(cores), concurrency=min(concurrency, len(tasks)),
        slot=str(slot.path), trials_before=before, trials_total=sum(s.trials for t in tasks if (s := stats.get(t.workload_hash))),
        wall_s=time.monotonic() - start, stopped_by=stopped_by, tasks=_results(tasks, slot), verification=verification,
        history=tally.history if tally else [], clients=reports, warm_from=donor.key if donor is not None else None,
        layout=layout,
    )  # fmt: skip


def _partition_runners(share: CpuShare, timing: Timing, k: int) -> list[ConfinedRunner]:
    return [ConfinedRunner(p.cores, timing) for p in share.partitions(k)]


def _slot_timing(slot: Slot, timing: Timing, label: str) -> Timing:
    """`timing`, flushed or warm as the budget's records were timed (`Slot.time_as`), saying so when
    that is not what was asked."""
    asked = timing.caches
    caches = slot.time_as(asked)
    if caches != asked:
        print(f"resaware: {label}: its records were timed {caches}, so this run times candidates {caches} too, "
              f"to rank them alike (tune into another store to time them {asked})", file=sys.stderr)  # fmt: skip
    return replace(timing, flush=caches == "flushed")


def _here(share: CpuShare, k: int, slot: Slot, target, trials: int, seed: int, timing: Timing):
    """Measuring on this machine: one client in this process, or `k` client processes."""

    def measure(tasks, before, deadline, on_batch, donor, first_batch):
        k_ = min(k, len(tasks))
        if k_ == 1:
            tuner = tuple(sorted({*share.cores, *share.spare(1)}))
            return [clients.tune_shard(tasks, slot, transfer.shared_database(slot, donor), target, share.cores, tuner, trials,
                                       before, seed, deadline, timing, on_batch, first_batch=first_batch)]  # fmt: skip
        partitions = [p.cores for p in share.partitions(k_)]
        # Some client is always timing a batch: no client's own work goes on a sibling of any partition's core.
        spare = apart_from(share.spare(k_), [c for cores in partitions for c in cores])
        return clients.run(tasks, slot, partitions, spare, trials - before, seed, deadline, timing, on_batch,
                           donor, first_batch)  # fmt: skip

    return measure


def _through(tracker: str, name: str, servers: int, slot: Slot, target, cores, trials: int, seed: int, timing: Timing):
    """Measuring on every server under `name`: one client here, searching and building on this machine."""

    def measure(tasks, before, deadline, on_batch, donor, first_batch):
        here = tuple(confine.usable_cores())
        runner = remote.runner(tracker, name, servers, timing)
        return [clients.tune_shard(tasks, slot, transfer.shared_database(slot, donor), target, cores, here, trials, before, seed,
                                   deadline, timing, on_batch, runner=runner, first_batch=first_batch)]  # fmt: skip

    return measure


def _progress_bar(label: str | None, total: int | None):
    if label is None:
        return None
    from tqdm import tqdm  # text bars: Jupyter draws them too, without ipywidgets

    # Its own handle on the terminal, as TVM's native stderr is muted while tuning; Jupyter's stream is not fd 2.
    owned = quiet.stderr_is_fd2()
    stream = os.fdopen(os.dup(2), "w", buffering=1) if owned else sys.stderr
    bar = tqdm(total=total, desc=label, unit="trial", dynamic_ncols=True, file=stream)
    bar.fp_owned = owned  # closed with the bar
    return bar


def _concurrency(value, share: CpuShare) -> int:
    """Clients for this budget: `auto` is as many partitions as the usable cores hold."""
    if value == "auto":
        return share.max_concurrency
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ResawareError(f"concurrency must be a whole number >= 1 or 'auto', got {value!r}")
    if value > share.max_concurrency:
        raise ResawareError(
            f"concurrency {value} at budget {share.asked} needs {value} partitions of {share.count} cores, but "
            f"{len(share.usable)} usable cores hold {share.max_concurrency}: give 1..{share.max_concurrency} or auto"
        )
    return value


def _tune_cuda(model, budgets, trials, store, seed, shapes, arch, layout) -> dict[str, int]:
    from resaware.platform import cuda
    from resaware.tuning import candidates

    cuda.prepare_build()
    intrinsics.register("cuda")
    if cuda.detect() is None:
        raise ResawareError(
            "tuning for CUDA measures on a GPU and this machine has none: build candidates here "
            "(resaware candidates build MODEL --target cuda -o DIR), measure them where the GPU is "
            "(python -m resaware.runtime.measure_built DIR --budgets ...) and fold them in (resaware candidates fold DIR)"
        )
    if isinstance(model, Plan) or not budgets:
        raise ResawareError("CUDA tuning takes a model and its budgets (e.g. budgets=['25%', '100%']), not a plan")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise ResawareError(f"trials must be a whole number >= 0, got {trials!r}")
    budgets = [budgets] if isinstance(budgets, (str, int, float, Budget)) else budgets
    return candidates.tune(resolve(model, shapes, layout), "cuda", budgets, trials, store, arch=arch, seed=seed)


def tune(model, budgets, trials: int | None = None, store=None, seed: int = 0, time_limit: float | None = None,
         progress: bool = True, shapes=None, timing: Timing = Timing(), concurrency: int | str = 1,
         tracker: str | None = None, target: str = "llvm", arch: str | None = None,
         warm_start: bool = False, layout: str | None = None) -> TuneReport:  # fmt: skip
    """Tune `model` at each budget until the store holds `trials` measured candidates for it there, or
    for `time_limit` seconds (whichever comes first; `trials=None`: for the time limit alone).

    `model` is a Model, an ONNX path, `zoo:NAME`, a ModelProto or a `Plan` (its tasks, at its budgets
    unless `budgets` says otherwise); `budgets` are fractions or percents; `time_limit` is wall-clock
    seconds per budget; `concurrency` is how many clients tune a budget at once, each measuring on its
    own partition of the budget's size (`auto`: as many as fit). With `tracker` ("HOST:PORT" of a TVM
    RPC tracker) candidates are measured on every server that `resaware serve` registered there for the
    budget, and stored under the servers' hardware. Reruns tune only the remainder. With `warm_start`,
    a budget tuned for the first time starts from the nearest tuned budget's cost model and best
    schedules (`resaware.tuning.transfer`; CPU budgets). `layout` sets the convolutions' layout (auto, NCHW,
    NHWC, NHWC-winograd; default: the model's, auto unless it was loaded with another; `resaware.frontend.layout`).

    `target="cuda"` tunes the GPU here by rounds of build, measure (each budget an MPS client) and fold,
    and returns the records each budget holds (`candidates.tune`; `time_limit`, `concurrency`, `tracker`
    and `progress` are for CPU budgets); with no GPU here it says how to split the work with a GPU machine.
    """
    if layout is not None and isinstance(model, Plan):
        raise ResawareError("a plan's tasks were lowered when it was recorded: give the layout to `plan.record`")
    if target == "cuda":
        return _tune_cuda(model, budgets, trials, store, seed, shapes, arch, layout)
    if target != "llvm":
        raise ResawareError(f"target {target!r} is not one resaware tunes for: use llvm (CPU) or cuda")
    if trials is None and time_limit is None:
        raise ResawareError("give a trial count, a time limit, or both (e.g. trials=256 or time_limit=1800)")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 0):
        raise ResawareError(f"trials must be a whole number >= 0, got {trials!r}")
    if time_limit is not None and (not math.isfinite(time_limit) or time_limit <= 0):
        raise ResawareError(f"time limit must be a positive number of seconds, got {time_limit!r}")
    trials = UNLIMITED if trials is None else trials
    if budgets is None:
        if not isinstance(model, Plan):
            raise ResawareError("no budget given: e.g. budgets=['50%', '100%'] (only a Plan brings its own)")
        budgets = model.budgets
    budgets = [Budget.parse(b) for b in ([budgets] if isinstance(budgets, (str, int, float, Budget)) else budgets)]
    if not budgets:
        raise ResawareError("no budget given: e.g. budgets=['50%', '100%']")
    if tracker is not None:
        if concurrency != 1:
            raise ResawareError("concurrency is for measuring on this machine; with a tracker every server measures")
        remote.parse_address(tracker)
        return _tune_through(model if isinstance(model, Plan) else resolve(model, shapes, layout), budgets, trials, Store.open(store), seed, time_limit, progress,
                             timing, tracker, warm_start)  # fmt: skip
    usable = confine.usable_cores()
    shares = {budget: budget.cpu(usable) for budget in budgets}
    ks = {budget: _concurrency(concurrency, share) for budget, share in shares.items()}  # all checked up front
    model = model if isinstance(model, Plan) else resolve(model, shapes, layout)
    store = Store.open(store)
    hw = hardware.detect()
    results = []
    for budget, share in shares.items():
        announce(share)
        target = hardware.llvm_target(share.count)
        slot = store.slot(hw, "llvm", share.key, share.fraction, hardware.target_json(target))
        with slot.locked():
            label = f"{model.name} @ {budget} ({share.count}c{f' x{ks[budget]}' if ks[budget] > 1 else ''})"
            timed = _slot_timing(slot, timing, label)
            measure = _here(share, ks[budget], slot, target, trials, seed, timed)
            verifier = functools.partial(_partition_runners, share, timed)
            result = _tune_budget(model, slot, target, budget, share.cores, ks[budget], trials, time_limit,
                                  label if progress else None, measure, verifier, store if warm_start else None)  # fmt: skip
            results.append(replace(result, caches=timed.caches))
    return TuneReport(model.name, hw.id, str(store.root), results)


def _tune_through(model, budgets, trials, store, seed, time_limit, progress, timing, tracker, warm_start) -> TuneReport:
    """Tune each budget on the servers registered for it at `tracker`; records go under their hardware."""
    results, ids = [], []
    for budget in budgets:
        for name, servers in remote.find_servers(tracker, budget).items():
            info = remote.server_info(tracker, name)
            hw, cores = info["hardware"], tuple(info["cores"])
            ids.append(hw.id)
            share_key = name.rsplit(".", 1)[1]
            target = hardware.llvm_target(len(cores), hw.mcpu)
            slot = store.slot(hw, "llvm", share_key, len(cores) / hw.usable_cores, hardware.target_json(target))
            with slot.locked():
                label = f"{model.name} @ {budget} on {servers} server{'s' if servers > 1 else ''}"
                timed = _slot_timing(slot, timing, label)
                measure = _through(tracker, name, servers, slot, target, cores, trials, seed, timed)
                verifier = lambda _, name=name, timed=timed: [remote.runner(tracker, name, 1, timed)]  # noqa: E731
                result = _tune_budget(model, slot, target, budget, cores, servers, trials, time_limit,
                                      label if progress else None, measure, verifier, store if warm_start else None)  # fmt: skip
                results.append(replace(result, caches=timed.caches))
    return TuneReport(model.name, ",".join(dict.fromkeys(ids)), str(store.root), results)
