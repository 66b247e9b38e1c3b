"""One tuning client: MetaSchedule's evolutionary search over a set of tasks, with a builder, a runner
and a cost model handed to it, until the store holds a number of records for those tasks.

Both the in-process tuner and each concurrent client process (`resaware.tuning.clients`) run this loop; they
differ only in which tasks, cores, database and cost-model file they give it.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler
from tvm.s_tir.meta_schedule.utils import shash2hex

from resaware.errors import last_line
from resaware.frontend.tasks import Task
from resaware.platform import quiet
from resaware.store import mean_seconds, ranks, workload_stats
from resaware.tuning.transfer import pairwise

UNLIMITED = 10**8  # the trial count of a run bounded by time alone (TVM counts trials in int32)
OPEN_BATCH = 8


def open_ended(trials: int) -> bool:
    """Whether a run (or what remains of it, or a client's part) is bounded by time alone."""
    return trials > UNLIMITED // 2


def batch_size(trials: int, n_tasks: int) -> int:
    """Candidates per batch: the trials spread over every task, 4 to 64; a run bounded by time alone
    takes small batches, so that every task has records early and the time goes where latency is."""
    if open_ended(trials):
        return OPEN_BATCH
    return max(4, min(64, trials // max(n_tasks, 1)))


def evolutionary(batch: int, lean: bool = True):
    """MetaSchedule's evolutionary search sized to the batch. Lean (CPU): a population of 16 per
    candidate measured, at least 128 and at most 512, over 2 generations for batches up to 16 and TVM's 4
    above. Not lean (CUDA, where building and measuring a candidate cost more than searching): 32 per
    candidate, same bounds, over 4 generations.

    On CPU the search, not building or measuring, is what a small batch costs: with a population of 256
    over 4 generations, mutating and scoring took 5.5 s of each 9 s batch of 8 on one core. Ten minutes of
    SqueezeNet at 50 %, one run each: 887 trials and 10.5 ms with 128 over 2 against 487 and 12.2 ms with
    256 over 4 (128 over 4: 679, 11.7 ms; 256 over 2: 567, 11.6 ms; 64 over 4: 935, 11.3 ms).
    """
    if not lean:
        return ms.search_strategy.EvolutionarySearch(population_size=max(128, min(512, 32 * batch)))
    return ms.search_strategy.EvolutionarySearch(
        population_size=max(128, min(512, 16 * batch)), genetic_num_iters=2 if batch <= 16 else 4
    )


def _contexts(tasks: list[Task], target, threads: int, seed: int, batch: int) -> list:
    logger = logging.getLogger("resaware.metaschedule")
    return [
        ms.TuneContext(
            mod=t.mod,
            target=target,
            space_generator="post-order-apply",
            search_strategy=evolutionary(batch),
            task_name=t.name,
            logger=logger,
            rand_state=seed + i,
            num_threads=threads,
        ).clone()
        for i, t in enumerate(tasks)
    ]


@derived_object
class Progress(PyMeasureCallback):
    """Reports every measured batch as (task index, candidates, best mean seconds or None), keeps each
    task's best, and ends tuning at the deadline (seconds since the epoch)."""

    def __init__(self, on_batch: Callable[[int, int, float | None], None], deadline: float | None):
        super().__init__()
        self.on_batch, self.deadline = on_batch, deadline
        self.best: dict[int, float] = {}  # task index -> best mean seconds measured (the scheduler's shares)
        self.timed_out = False
        self.stop_asked = False  # Ctrl-C: stop after the batch in flight
        self.ending = False

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        means = [mean_seconds(r.run_secs) for r in runner_results if r.error_msg is None]
        valid = [m for m in means if m is not None]
        if valid:
            self.best[int(task_id)] = min(self.best.get(int(task_id), min(valid)), min(valid))
        self.on_batch(int(task_id), len(runner_results), min(valid) if valid else None)
        if self.ending:
            return
        # Runs after MetaSchedule's own callbacks, so this batch is already in the database and the
        # cost model; raising is the one way to end the task scheduler's loop early.
        if self.stop_asked or (self.deadline is not None and time.time() >= self.deadline):
            self.timed_out = not self.stop_asked
            self._join_the_rest(task_scheduler, int(task_id))
            raise (
                InterruptedError("stopped by Ctrl-C") if self.stop_asked else TimeoutError("tuning time limit reached")
            )

    def _join_the_rest(self, task_scheduler, task_id: int) -> None:
        """Wait for the batches still being timed in the background (`measure.TunerCores`), so that
        they reach the store before the raise ends the loop; their callbacks come back here."""
        self.ending = True
        for i, record in enumerate(task_scheduler.tasks_):
            if i != task_id and record.runner_futures is not None:
                task_scheduler.join_running_task(i)

    @contextmanager
    def ctrl_c_after_batch(self) -> Iterator[None]:
        """While tuning, a first Ctrl-C stops after the batch in flight (a KeyboardInterrupt raised
        inside TVM's native loop would surface as a RuntimeError and lose the batch); a second stops now."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def ask(signum, frame):
            self.stop_asked = True
            print("\nresaware: stopping after the batch in flight (Ctrl-C again to stop now)", file=sys.stderr)
            signal.signal(signal.SIGINT, previous)

        previous = signal.signal(signal.SIGINT, ask)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


@derived_object
class Validation(PyMeasureCallback):
    """Scores each measured batch with the cost model before it trains on that batch, and reports
    (samples it was last trained on, pairs ranked right, pairs compared, RMSE of its predicted
    normalised throughput): how it does on data it has not seen."""

    def __init__(self, cost_model, on_batch: Callable[[int, int, int, float], None]):
        super().__init__()
        self.cost_model, self.on_batch, self.broken = cost_model, on_batch, False

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        if self.broken or not ranks(self.cost_model):
            return  # it ranks at random until then
        costs = [mean_seconds(r.run_secs) if r.error_msg is None else None for r in runner_results]
        if sum(c is not None for c in costs) < 2:
            return
        try:  # an exception here would end tuning before the batch reaches the store
            context = task_scheduler.tasks_[int(task_id)].ctx
            with quiet.xgboost_warnings():
                scores = self.cost_model.predict(context, list(measure_candidates))
            trained_on = getattr(self.cost_model, "last_train_size", self.cost_model.data_size)
            # What XGBModel learns: the workload's best cost so far over each candidate's (1 = as fast).
            group = self.cost_model.data.get(shash2hex(context.mod))
            best = min([c for c in costs if c is not None] + ([float(group.min_cost)] if group is not None else []))
            errors = [(s - best / c) ** 2 for s, c in zip(scores, costs) if c is not None]
            self.on_batch(trained_on, *pairwise(list(scores), costs), float(sum(errors) / len(errors)) ** 0.5)
        except Exception as error:
            self.broken = True
            print(f"resaware: warning: cost model validation off for this run ({last_line(error)})", file=sys.stderr)


@derived_object
class WeightedScheduler(PyTaskScheduler):
    """Gives every task one batch (heaviest first), then batches in proportion to the task's share of
    the model's time: weight x its best latency so far (`best`, task index -> seconds, kept current by
    `Progress`), counting the batches the store already holds (`prior`), so a resumed run continues.

    Time, not FLOPs: after a first round on SqueezeNet a 3x3 conv ran at 34 GFLOP/s and took 26% of the
    kernel time while a 1x1 conv with three times its FLOPs ran at 82 GFLOP/s; FLOPs gave the 1x1 conv
    five times the trials. A task with no valid measurement counts its FLOPs at the median rate measured.

    Finished batches are joined before the next task is picked, so each one reaches the store and
    the progress bar at once (and the task picked is joined even if unfinished). TVM's gradient
    scheduler holds every result until all tasks have had a batch (369 candidates for ResNet-50 at
    --trials 400), where a crash or a time limit loses them.
    """

    def __init__(self, tasks: list[Task], best: dict[int, float], prior: list[float] | None = None):
        super().__init__()
        self.weights = [t.weight for t in tasks]
        self.flops = [max(t.flops, 1.0) for t in tasks]
        self.best = best
        self.sent = list(prior or [0.0] * len(tasks))

    def share(self, i: int) -> float:
        """Seconds task `i` takes per inference (an estimate until it has a valid measurement)."""
        if (best := self.best.get(i)) is not None:
            return self.weights[i] * best
        # At the median rate measured: neither starved (the best rate) nor favoured (the worst).
        rates = sorted(self.flops[j] / b for j, b in self.best.items() if b > 0)
        rate = rates[len(rates) // 2] if rates else 1e10
        return self.weights[i] * self.flops[i] / rate

    def next_task_id(self) -> int:
        scheduler = self._outer()
        records = scheduler.tasks_
        for i in range(len(records)):
            scheduler.touch_task(i)  # joins a finished batch: database, cost model, callbacks
        alive = [i for i, record in enumerate(records) if not record.is_terminated]
        if not alive:
            return -1
        # A task still being timed in the background (an RPC runner, or `TunerCores`) is picked only when
        # nothing else is left: its next batch would wait for this one instead of being searched meanwhile.
        free = [i for i in alive if records[i].runner_futures is None] or alive
        fresh = [i for i in free if self.sent[i] == 0]
        if fresh:
            pick = fresh[0]
        else:
            shares = {i: self.share(i) for i in alive}
            sent, total = sum(self.sent[i] for i in alive), sum(shares.values())
            pick = max(free, key=lambda i: (shares[i] / total * sent - self.sent[i], -i))
        if records[pick].runner_futures is not None:
            # MetaSchedule refuses to send a task again unjoined.
            scheduler.join_running_task(pick)
        self.sent[pick] += 1
        return pick


def search_rounds(
    tasks: list[Task],
    target,
    database,
    work_dir: str,
    trials: int,
    done: int,
    seed: int,
    threads: int,
    builder,
    runner,
    cost_model,
    save_cost_model: Callable[[object], None],
    progress: Progress,
    counted: Callable[[], int],
    on_validation: Callable[[int, int, int, float], None] | None = None,
    first_batch: int | None = None,
) -> str:
    """Run MetaSchedule until the store holds `trials` records of these tasks (it holds `done`);
    say what stopped it: "trials", "time" or "search space". `first_batch` sizes a first round of one
    batch per task (a warm start's); `on_validation` gets each batch's `Validation`."""
    while done < trials:
        remaining = trials - done
        batch = min(batch_size(remaining, len(tasks)), remaining)
        rounds = remaining - remaining % batch  # whole batches, then a smaller last round
        if first_batch:
            batch = min(first_batch, batch)
            rounds, first_batch = min(remaining, batch * len(tasks)), None
        stats = workload_stats(database)
        prior = [s.trials / batch if (s := stats.get(t.workload_hash)) else 0.0 for t in tasks]
        for i, t in enumerate(tasks):  # what earlier runs measured counts too
            if (s := stats.get(t.workload_hash)) and s.best_s is not None:
                progress.best[i] = min(progress.best.get(i, s.best_s), s.best_s)
        try:
            with (
                progress.ctrl_c_after_batch(),
                quiet.native_stderr(),
                quiet.xgboost_warnings(),
                quiet.no_notebook_tables(),
            ):
                ms.tune_tasks(
                    task_scheduler=WeightedScheduler(tasks, progress.best, prior),
                    tasks=_contexts(tasks, target, threads, seed + done, batch),
                    task_weights=[float(t.weight) for t in tasks],
                    work_dir=work_dir,
                    # A batch that comes back short can make the total overshoot `trials` by less than one batch.
                    max_trials_global=rounds,
                    num_trials_per_iter=batch,
                    builder=builder,
                    runner=runner,
                    database=database,
                    cost_model=cost_model,
                    measure_callbacks=[
                        *([Validation(cost_model, on_validation)] if on_validation else []),  # before it trains
                        *ms.MeasureCallback.create("default"),
                        progress,
                    ],
                )
        except KeyboardInterrupt:
            save_cost_model(cost_model)  # what this run learnt survives Ctrl-C, like its records
            raise
        except Exception:  # what a callback raised comes back through TVM as a RuntimeError
            if not (progress.timed_out or progress.stop_asked):
                raise
        save_cost_model(cost_model)
        if progress.stop_asked:
            raise KeyboardInterrupt
        now = counted()
        if progress.timed_out:
            return "time"
        if now == done:
            return "search space"  # MetaSchedule found nothing new to measure
        done = now
    return "trials"


def phases(profile: dict[str, float], wall: float) -> dict[str, float]:
    """MetaSchedule's profiler scopes folded into the phases a user can act on (seconds)."""
    scopes = {k: float(v) for k, v in profile.items() if k != "Total"}
    top = [k for k in scopes if not any(k.startswith(o + "/") for o in scopes if o != k)]  # no double counting
    predict = sum(v for k, v in scopes.items() if k.endswith("PredictNormalizedScore"))
    search = sum(scopes[k] for k in top if k.startswith("EvoSearch")) - predict
    cost = predict + scopes.get("MeasureCallback/UpdateCostModel", 0.0)
    build = scopes.get("SendToBuilder", 0.0)
    run = sum(v for k, v in scopes.items() if k in ("SendToRunner", "JoinRunnerFutures"))
    return {"search": search, "cost_model": cost, "build": build, "run": run,
            "other": max(0.0, wall - search - cost - build - run)}  # fmt: skip
