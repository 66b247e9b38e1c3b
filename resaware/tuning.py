"""Tuning a model under budgets: MetaSchedule searches, resaware decides where it measures and what it keeps.

For each budget: realise it as a core set, open that budget's slot in the store, and run
MetaSchedule's evolutionary search (in resaware's weighted task order) with a builder pool and a
measuring worker confined to the budget's cores. The tuner's own threads (search, XGBoost, builds)
are pinned to the other cores; when the budget takes them all, measuring is serialised with the
tuner's work instead.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import RunnerInput
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler

from . import confine, hardware, intrinsics, quiet
from .budget import Budget, CpuShare, announce
from .errors import ResawareError
from .measure import ConfinedRunner, PooledBuilder, Timing, remove_artifact
from .model import Model, resolve
from .store import FAILED, Slot, Store
from .tasks import Task, extract, lower


@dataclass
class TaskResult:
    name: str
    weight: int
    flops: float
    trials: int
    best_s: float | None


@dataclass
class Verification:
    """A best schedule re-measured alone after tuning, against what tuning recorded."""

    task: str
    recorded_s: float
    remeasured_s: float

    @property
    def ratio(self) -> float:
        return self.remeasured_s / self.recorded_s


@dataclass
class BudgetResult:
    budget: str  # as asked
    realised: float  # fraction of the usable cores
    cores: list[int]
    tuner_cores: list[int]
    slot: str
    trials_before: int
    trials_total: int
    wall_s: float
    stopped_by: str  # "trials", "time", "search space" or "already tuned"
    tasks: list[TaskResult] = field(default_factory=list)
    # After each measured batch: (seconds since this budget started, trials in the store, estimated
    # model latency in seconds once every task has a valid record, else None).
    history: list[tuple[float, int, float | None]] = field(default_factory=list)
    verification: list[Verification] = field(default_factory=list)

    @property
    def trials_run(self) -> int:
        return self.trials_total - self.trials_before

    @property
    def estimated_s(self) -> float | None:
        """Sum of weight x best task latency, when every task has a record."""
        if not self.tasks or any(t.best_s is None for t in self.tasks):
            return None
        return sum(t.weight * t.best_s for t in self.tasks)


@dataclass
class TuneReport:
    model: str
    hardware: str
    store: str
    budgets: list[BudgetResult]

    def to_json(self) -> dict:
        data = asdict(self)
        for result, raw in zip(self.budgets, data["budgets"]):
            raw["trials_run"] = result.trials_run
            raw["estimated_s"] = result.estimated_s
        return data

    def table(self) -> str:
        lines = [f"model {self.model} on {self.hardware}, store {self.store}",
                 f"{'budget':>7} {'cores':>6} {'trials':>13} {'tuned tasks':>11} {'est. latency':>13} {'wall':>8} {'re-measured':>12}  stopped by"]  # fmt: skip
        for b in self.budgets:
            tuned = sum(1 for t in b.tasks if t.best_s is not None)
            est = f"{b.estimated_s * 1e3:.2f} ms" if b.estimated_s is not None else "n/a"
            drift = f"{max(v.ratio for v in b.verification):.2f}x max" if b.verification else "-"
            lines.append(
                f"{b.budget:>7} {len(b.cores):>6} {f'{b.trials_run}+{b.trials_before}={b.trials_total}':>13} "
                f"{f'{tuned}/{len(b.tasks)}':>11} {est:>13} {b.wall_s:>7.0f}s {drift:>12}  {b.stopped_by}"
            )
        return "\n".join(lines)


def _mean(secs) -> float | None:
    values = [float(s) for s in (secs or [])]
    return sum(values) / len(values) if values and max(values) < FAILED else None


@derived_object
class _Progress(PyMeasureCallback):
    """Advances the progress bar and the history after each batch, and ends tuning at the deadline."""

    def __init__(self, bar, tasks: list[Task], best: dict[int, float], trials: int, start: float,
                 deadline: float | None):  # fmt: skip
        super().__init__()
        self.bar, self.names, self.deadline = bar, [t.name for t in tasks], deadline
        self.weights = [t.weight for t in tasks]
        self.best, self.trials, self.start = dict(best), trials, start
        self.history: list[tuple[float, int, float | None]] = []
        self.timed_out = False

    def estimate(self) -> float | None:
        if len(self.best) < len(self.weights):
            return None
        return sum(w * self.best[i] for i, w in enumerate(self.weights))

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for result in runner_results:
            mean = _mean(result.run_secs) if result.error_msg is None else None
            if mean is not None:
                self.best[task_id] = min(self.best.get(task_id, mean), mean)
        self.trials += len(runner_results)
        self.history.append((time.monotonic() - self.start, self.trials, self.estimate()))
        if self.bar is not None:
            self.bar.update(len(runner_results))
            best = self.best.get(task_id)
            shown = f"{best * 1e6:.0f}us" if best is not None else "-"
            self.bar.set_postfix_str(f"{self.names[task_id][:28]} best {shown}", refresh=False)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            # Runs after MetaSchedule's own callbacks, so this batch is already in the database and
            # the cost model; raising is the one way to end the task scheduler's loop early.
            self.timed_out = True
            raise TimeoutError("tuning time limit reached")


def _batch_size(trials: int, n_tasks: int) -> int:
    return max(4, min(64, trials // max(n_tasks, 1)))


def _search(batch: int):
    """MetaSchedule's evolutionary search with a population sized to the batch.

    Its default population (512) costs ~25 s of mutation per batch on one core: fine for batches of
    64, most of the tuning time for the small batches a few hundred trials over many tasks give.
    """
    return ms.search_strategy.EvolutionarySearch(population_size=max(128, min(512, 32 * batch)))


def _contexts(tasks: list[Task], target, threads: int, seed: int, batch: int) -> list:
    logger = logging.getLogger("resaware.metaschedule")
    return [
        ms.TuneContext(
            mod=t.mod,
            target=target,
            space_generator="post-order-apply",
            search_strategy=_search(batch),
            task_name=t.name,
            logger=logger,
            rand_state=seed + i,
            num_threads=threads,
        ).clone()
        for i, t in enumerate(tasks)
    ]


def _verify(slot: Slot, tasks: list[Task], target, builder, runner, top: int = 3) -> list[Verification]:
    """Re-measure the best schedules of the heaviest tasks with nothing else running."""
    database = slot.database()
    stats = slot.stats(database)
    ranked = sorted(
        (t for t in tasks if (s := stats.get(t.workload_hash)) and s.best_s is not None),
        key=lambda t: -t.weight * stats[t.workload_hash].best_s,
    )[:top]
    checks = []
    for task in ranked:
        (record,) = database.get_top_k(database.commit_workload(task.mod), 1)
        sch = tvm.s_tir.Schedule(task.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        (built,) = builder.build([BuilderInput(sch.mod, target)])
        if built.error_msg:
            continue
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        (future,) = runner.run([RunnerInput(built.artifact_path, "llvm", args)])
        remove_artifact(built.artifact_path)
        measured = _mean(future.result().run_secs)
        if measured is not None:
            checks.append(Verification(task.name, _mean(record.run_secs), measured))
    return checks


def _results(tasks: list[Task], slot: Slot) -> list[TaskResult]:
    stats = slot.stats()
    return [
        TaskResult(
            t.name, t.weight, t.flops, s.trials if (s := stats.get(t.workload_hash)) else 0, s.best_s if s else None
        )
        for t in tasks
    ]


@derived_object
class _WeightedScheduler(PyTaskScheduler):
    """Gives every task one batch (heaviest first), then batches in proportion to weight x FLOPs.

    Finished batches are joined before the next task is picked, so each one reaches the store and
    the progress bar at once. TVM's gradient scheduler holds every result until all tasks have had a
    batch (369 candidates for ResNet-50 at --trials 400), where a crash or a time limit loses them.
    """

    def __init__(self, shares: list[float]):
        super().__init__()
        self.shares = shares
        self.sent = [0] * len(shares)

    def next_task_id(self) -> int:
        scheduler = self._outer()
        records = scheduler.tasks_
        for i in range(len(records)):
            scheduler.touch_task(i)  # joins a finished batch: database, cost model, callbacks
        alive = [i for i, record in enumerate(records) if not record.is_terminated]
        if not alive:
            return -1
        fresh = [i for i in alive if self.sent[i] == 0]
        if fresh:
            pick = fresh[0]
        else:
            sent, total = sum(self.sent[i] for i in alive), sum(self.shares[i] for i in alive)
            pick = max(alive, key=lambda i: (self.shares[i] / total * sent - self.sent[i], -i))
        self.sent[pick] += 1
        return pick


def _search_rounds(
    tasks, target, slot, trials, done, seed, tuner_cores, builder, runner, cost_model, callback, counted
) -> str:
    """Run MetaSchedule until the store holds `trials` records of these tasks; say what stopped it."""
    database = slot.database()
    shares = [max(t.weight * t.flops, 1.0) for t in tasks]
    while done < trials:
        remaining = trials - done
        batch = min(_batch_size(remaining, len(tasks)), remaining)
        try:
            with quiet.native_stderr(), quiet.xgboost_warnings():
                ms.tune_tasks(
                    task_scheduler=_WeightedScheduler(shares),
                    tasks=_contexts(tasks, target, len(tuner_cores), seed + done, batch),
                    task_weights=[float(t.weight) for t in tasks],
                    work_dir=str(slot.path),
                    # Whole batches, then a smaller last round; a batch that comes back short can still make
                    # the total overshoot `trials` by less than one batch.
                    max_trials_global=remaining - remaining % batch,
                    num_trials_per_iter=batch,
                    builder=builder,
                    runner=runner,
                    database=database,
                    cost_model=cost_model,
                    measure_callbacks=[*ms.MeasureCallback.create("default"), callback],
                )
        except Exception:
            if not callback.timed_out:
                raise
        slot.save_cost_model(cost_model)
        now = counted()
        if callback.timed_out:
            return "time"
        if now == done:
            return "search space"  # MetaSchedule found nothing new to measure
        done = now
    return "trials"


def _tune_budget(model: Model, share: CpuShare, slot: Slot, trials: int, seed: int,
                 time_limit: float | None, progress: bool, timing: Timing) -> BudgetResult:  # fmt: skip
    start = time.monotonic()
    intrinsics.register("llvm")
    target = hardware.llvm_target(share.count)
    tasks = extract(model, target, lower(model, target))
    if not tasks:
        raise ResawareError(f"model {model.name} has no tunable kernels")
    slot.remember_tasks(tasks, model.name)
    hashes = {t.workload_hash for t in tasks}

    def counted() -> int:
        return sum(s.trials for k, s in slot.stats().items() if k in hashes)

    before = counted()
    # Where cores remain, the tuner works there; where none do, measuring waits for it (synchronous).
    tuner_cores = share.rest or share.cores
    stopped_by, verification, callback = "already tuned", [], None
    if before < trials:
        builder = PooledBuilder(tuner_cores)
        runner = ConfinedRunner(share.cores, timing)
        bar = _progress_bar(progress, share, trials - before, model.name)
        stats = slot.stats()
        best = {i: s.best_s for i, t in enumerate(tasks) if (s := stats.get(t.workload_hash)) and s.best_s is not None}
        callback = _Progress(bar, tasks, best, before, start, start + time_limit if time_limit else None)
        try:
            with confine.pinned(tuner_cores) if share.rest else nullcontext():
                stopped_by = _search_rounds(
                    tasks, target, slot, trials, before, seed, tuner_cores, builder, runner,
                    slot.load_cost_model(len(tuner_cores)), callback, counted,
                )  # fmt: skip
            verification = _verify(slot, tasks, target, builder, runner)
        finally:
            if bar is not None:
                bar.close()
                bar.fp.close()
            builder.close()
            runner.close()
    return BudgetResult(
        budget=str(share.asked), realised=share.fraction, cores=list(share.cores),
        tuner_cores=list(tuner_cores), slot=str(slot.path), trials_before=before,
        trials_total=counted(), wall_s=time.monotonic() - start, stopped_by=stopped_by,
        tasks=_results(tasks, slot), verification=verification, history=callback.history if callback else [],
    )  # fmt: skip


def _progress_bar(enabled: bool, share: CpuShare, total: int, name: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # Its own handle on the terminal: TVM's native stderr is muted while tuning.
    stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
    return tqdm(
        total=total, desc=f"{name} @ {share.asked} ({share.count}c)", unit="trial", dynamic_ncols=True, file=stream
    )


def tune(model, budgets, trials: int, store=None, seed: int = 0, time_limit: float | None = None,
         progress: bool = True, shapes=None, timing: Timing = Timing()) -> TuneReport:  # fmt: skip
    """Tune `model` at each budget until the store holds `trials` measured candidates for it there.

    `model` is a Model, an ONNX path, `zoo:NAME` or a ModelProto; `budgets` are fractions or
    percents; `time_limit` is wall-clock seconds per budget. Reruns tune only the remainder.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise ResawareError(f"trials must be a whole number >= 0, got {trials!r}")
    if time_limit is not None and (not math.isfinite(time_limit) or time_limit <= 0):
        raise ResawareError(f"time limit must be a positive number of seconds, got {time_limit!r}")
    budgets = [Budget.parse(b) for b in ([budgets] if isinstance(budgets, (str, int, float, Budget)) else budgets)]
    if not budgets:
        raise ResawareError("no budget given: e.g. budgets=['50%', '100%']")
    model = resolve(model, shapes)
    store = Store.open(store)
    hw = hardware.detect()
    usable = confine.usable_cores()
    results = []
    for budget in dict.fromkeys(budgets):
        share = budget.cpu(usable)
        announce(share)
        slot = store.slot(
            hw, "llvm", share.key, share.fraction, hardware.target_json(hardware.llvm_target(share.count))
        )
        with slot.locked():
            results.append(_tune_budget(model, share, slot, trials, seed, time_limit, progress, timing))
    return TuneReport(model.name, hw.id, str(store.root), results)
