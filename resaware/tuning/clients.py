"""Concurrent tuning clients: one budget's tasks sharded across processes, each on its own partition.

The paper behind resaware tuned several clients at once on one device, each confined to its share.
Here a client is a whole tuner in its own process: it measures on its partition, and searches, trains
its cost model and builds there too, plus on the cores no partition has. While it measures it keeps to
those spare cores (searching and building its next batch there) or, with none, waits; no client
touches another's partition: each measurement has its cores to itself while the others share only the
last-level cache and memory.

Tasks are dealt up front, before anything is measured: each client gets one batch per task, then trials
in proportion to its tasks' weight x FLOPs, balanced largest first (within a client, the scheduler then
follows measured time, `search.WeightedScheduler`). Each client trains a
cost model of its own, started from the budget's: XGBoost keeps its training data per workload and the
shards are disjoint, so their union is merged back into the budget's model at the end
(`Slot.merge_cost_models`); sharing one model live would mean shipping every batch's features between
processes and retraining on each. All clients append to the budget's one database (`SharedAppends`).

A client process speaks JSON lines on its stdout: {"batch": [task, candidates, best s]} after every
measured batch, then {"done": {...}}.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from resaware.budget import apart_from
from resaware.errors import ResawareError
from resaware.frontend import intrinsics
from resaware.frontend.tasks import Task
from resaware.platform import confine, hardware
from resaware.store import Slot
from resaware.tuning import transfer
from resaware.tuning.measure import ConfinedRunner, PooledBuilder, Timing, TunerCores, worker_state
from resaware.tuning.report import ClientReport
from resaware.tuning.search import UNLIMITED, Progress, batch_size, open_ended, phases, search_rounds


def shard(tasks: list[Task], k: int, trials: int, existing: list[int] | None = None) -> list[tuple[list[int], int]]:
    """Deal task indices to `k` clients: (indices, trials) each, trials summing to `trials`.

    Each task needs one batch, then its weight x FLOPs' share of the store's final count, minus the
    records it `existing`ly has; largest need first.
    """
    k = max(1, min(k, len(tasks)))
    existing = existing or [0] * len(tasks)
    total = sum(existing) + trials
    batch = batch_size(total, len(tasks))
    shares = [max(t.weight * t.flops, 1.0) for t in tasks]
    extra = max(0, total - batch * len(tasks))
    need = [max(0.0, batch + extra * s / sum(shares) - n) for s, n in zip(shares, existing)]
    if sum(need) <= 0:
        need = shares
    dealt: list[list[int]] = [[] for _ in range(k)]
    load = [0.0] * k
    for i in sorted(range(len(tasks)), key=lambda i: (-need[i], i)):
        j = min(range(k), key=lambda j: (load[j], j))
        dealt[j].append(i)
        load[j] += need[i]
    exact = [trials * x / sum(load) for x in load]
    allotted = [int(x) for x in exact]
    for j in sorted(range(k), key=lambda j: allotted[j] - exact[j])[: trials - sum(allotted)]:
        allotted[j] += 1
    return [(sorted(ids), n) for ids, n in zip(dealt, allotted)]


def _read_lines(index: int, stream, inbox: queue.Queue) -> None:
    for line in stream:
        try:
            inbox.put((index, json.loads(line)))
        except json.JSONDecodeError:
            pass  # not the protocol: stray output is sent to the client's log, not here
    inbox.put((index, None))


# MetaSchedule's XGBModel ranks candidates at random until it holds this many samples.
WARMUP_SAMPLES = 100


def run(
    tasks: list[Task],
    slot: Slot,
    partitions: list[tuple[int, ...]],
    spare: tuple[int, ...],
    trials: int,
    seed: int,
    deadline: float | None,
    timing: Timing,
    on_batch: Callable[[int, int, float | None], None],
    donor: Slot | None = None,
    first_batch: int | None = None,
) -> list[ClientReport]:
    """Tune `tasks` until the store holds `trials` more records of them, one client per partition.

    While the budget's cost model is still warming up, the clients tune only until their samples
    together complete it; then they restart from the merged model. Otherwise each client would guide
    its search by a model of its own shard, which alone stays random k times longer than a serial run's.
    `on_batch(task index, candidates, best seconds)` sees every client's batches as they land; a
    `donor` budget's best schedules seed the clients' searches and `first_batch` sizes their first
    round (a warm start, `resaware.tuning.transfer`).
    """
    have = slot.load_cost_model(1).data_size
    rounds = [min(trials, WARMUP_SAMPLES - have), trials] if have < WARMUP_SAMPLES else [trials]
    reports: list[ClientReport] = []
    for i, count in enumerate(rounds):
        count = min(count, trials - sum(r.trials for r in reports))
        if count <= 0:
            continue
        got = _run_once(tasks, slot, partitions, spare, count, seed + 7 * i, deadline, timing, on_batch, donor,
                        first_batch if i == 0 else None)  # fmt: skip
        reports = [_merged(a, b) for a, b in zip(reports, got)] if reports else got
        if any(r.stopped_by == "time" for r in got):
            break
    return reports


def _merged(a: ClientReport, b: ClientReport) -> ClientReport:
    """One partition's client over two rounds."""
    return ClientReport(
        b.cores, b.tuner_cores, max(a.tasks, b.tasks), a.trials + b.trials, a.wall_s + b.wall_s, b.stopped_by,
        {k: a.phases[k] + b.phases[k] for k in a.phases}, (a.window[0], b.window[1]), b.worker_cores,
        a.measuring_s + b.measuring_s if a.measuring_s is not None and b.measuring_s is not None else None,
    )  # fmt: skip


def _run_once(
    tasks: list[Task],
    slot: Slot,
    partitions: list[tuple[int, ...]],
    spare: tuple[int, ...],
    trials: int,
    seed: int,
    deadline: float | None,
    timing: Timing,
    on_batch: Callable[[int, int, float | None], None],
    donor: Slot | None = None,
    first_batch: int | None = None,
) -> list[ClientReport]:
    """One round of `run`: spawn the clients, relay their batches, merge their cost models."""
    stats = slot.stats()
    plan = shard(tasks, len(partitions), trials, [s.trials if (s := stats.get(t.workload_hash)) else 0 for t in tasks])
    with tempfile.TemporaryDirectory(prefix="resaware-clients-") as tmp:
        tasks_file = Path(tmp) / "tasks.json"
        tasks_file.write_text(
            json.dumps([{"name": t.name, "weight": t.weight, "flops": t.flops, "mod": tvm.ir.save_json(t.mod)} for t in tasks])
        )  # fmt: skip
        procs, logs, inbox = [], [], queue.Queue()
        try:
            for i, ((ids, allotted), cores) in enumerate(zip(plan, partitions)):
                tuner = tuple(sorted({*cores, *spare}))
                before = sum(s.trials for t in ids if (s := stats.get(tasks[t].workload_hash)))
                spec = {
                    "client": i, "slot": str(slot.path), "tasks": str(tasks_file), "ids": ids,
                    "before": before, "seed": seed + 100_003 * i,
                    "trials": UNLIMITED if open_ended(trials) else before + allotted,  # time alone: each client too
                    "cores": list(cores), "tuner_cores": list(tuner), "deadline": deadline, "timing": asdict(timing),
                    "donor": str(donor.path) if donor is not None else None, "first_batch": first_batch,
                }  # fmt: skip
                spec_file = Path(tmp) / f"client{i}.json"
                spec_file.write_text(json.dumps(spec))
                log = open(Path(tmp) / f"client{i}.log", "w+")
                logs.append(log)
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import sys; from resaware.tuning.clients import main; main(sys.argv[1])",
                        str(spec_file),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env={**os.environ, **confine.environment(len(tuner))},
                    preexec_fn=lambda tuner=tuner: os.sched_setaffinity(0, tuner),
                    start_new_session=True,  # killing a client takes its build and measure workers too
                )
                procs.append(proc)
                threading.Thread(target=_read_lines, args=(i, proc.stdout, inbox), daemon=True).start()
            reports: dict[int, ClientReport] = {}
            open_streams = len(procs)
            while open_streams:
                i, item = inbox.get()
                if item is None:
                    open_streams -= 1
                elif "batch" in item:
                    on_batch(*item["batch"])
                elif "done" in item:
                    reports[i] = ClientReport(**{**item["done"], "window": tuple(item["done"]["window"])})
            failed = [i for i, proc in enumerate(procs) if proc.wait() != 0 or i not in reports]
        except KeyboardInterrupt:  # pass Ctrl-C on: each client stops after its batch and saves
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGINT)
            for proc in procs:
                try:
                    proc.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    pass
            raise
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            slot.merge_cost_models([slot.client_cost_model_file(i) for i in range(len(procs))])
        if failed:
            i = failed[0]
            logs[i].seek(0)
            tail = logs[i].read()[-3000:]
            raise ResawareError(
                f"tuning client {i} (cores {list(partitions[i])}) failed with exit code {procs[i].returncode}; "
                f"every record it measured is in the store. Its log ends:\n{tail}"
            )
        return [reports[i] for i in range(len(procs))]


def tune_shard(tasks: list[Task], slot: Slot, database, target, cores: tuple[int, ...], tuner: tuple[int, ...],
               trials: int, before: int, seed: int, deadline: float | None, timing: Timing,
               on_batch: Callable[[int, int, float | None], None], cost_model_file: Path | None = None,
               runner=None, first_batch: int | None = None) -> ClientReport:  # fmt: skip
    """One client's run in this process: measure on `cores` (or with `runner`), search and build on
    `tuner`, until the store holds `trials` records of `tasks` (it holds `before`); `first_batch`
    sizes a warm start's first round."""
    start = time.monotonic()
    intrinsics.register("llvm")
    done = [before]

    def counting(task: int, n: int, best: float | None) -> None:
        done[0] += n
        on_batch(task, n, best)

    confined = runner is None
    # With physical cores of its own besides the measuring ones (an SMT sibling would share the timed core's
    # execution units and caches), the tuner searches and builds there while a batch is timed.
    lanes = TunerCores(tuner, cores) if confined and apart_from(tuner, cores) else None
    builder = PooledBuilder(tuner, lanes=lanes)
    runner = runner or ConfinedRunner(cores, timing, lanes)
    began = time.time()
    try:
        with ms.Profiler() as profiler, confine.pinned(tuner) if lanes else nullcontext():
            stopped_by = search_rounds(
                tasks, target, database, str(slot.path), trials, before, seed, len(tuner), builder, runner,
                slot.load_cost_model(len(tuner)), lambda model: slot.save_cost_model(model, cost_model_file),
                Progress(counting, deadline), lambda: done[0], slot.log_validation, first_batch,
            )  # fmt: skip
        window = (began, time.time())
        worker_cores = sorted(set().union(*runner.call(worker_state)["masks"].values())) if confined else None
    finally:
        builder.close()
        if confined:
            runner.close()
    wall = time.monotonic() - start
    profile = {str(k): float(v) for k, v in profiler.get().items()}
    return ClientReport(list(cores), list(tuner), len(tasks), done[0] - before, wall, stopped_by,
                        phases(profile, wall), window, worker_cores,
                        runner.measuring_s if confined else None)  # fmt: skip


# ---------------------------------------------------------------- inside a client process


def main(spec_path: str) -> None:
    """A tuning client's process: tune the tasks its spec file names, reporting batches on stdout."""
    spec = json.loads(Path(spec_path).read_text())
    # The protocol keeps the real stdout; anything else printed here goes to the client's log.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    every = json.loads(Path(spec["tasks"]).read_text())
    ids = spec["ids"]
    tasks = [Task(d["name"], d["weight"], d["flops"], tvm.ir.load_json(d["mod"])) for d in (every[i] for i in ids)]
    slot = Slot.open(spec["slot"])

    def on_batch(task: int, n: int, best: float | None) -> None:
        protocol.write(json.dumps({"batch": [ids[task], n, best]}) + "\n")

    cores = tuple(spec["cores"])
    donor = Slot.open(spec["donor"]) if spec.get("donor") else None
    report = tune_shard(
        tasks, slot, transfer.shared_database(slot, donor), hardware.llvm_target(len(cores)), cores, tuple(spec["tuner_cores"]),
        spec["trials"], spec["before"], spec["seed"], spec["deadline"], Timing(**spec["timing"]), on_batch,
        slot.client_cost_model_file(spec["client"]),
        first_batch=spec.get("first_batch"),
    )  # fmt: skip
    protocol.write(json.dumps({"done": asdict(report)}) + "\n")
