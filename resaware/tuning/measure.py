"""Building and measuring candidates for MetaSchedule, under a budget.

Two pieces that tuning hands to MetaSchedule's task scheduler:
- `PooledBuilder`: compiles candidates in a pool of worker processes that lives as long as the tuner
  (TVM's `LocalBuilder` starts a fresh pool every batch and imports the tensor intrinsics in each
  worker, ~48 s on a small machine), pinned to the cores the tuner owns.
- `ConfinedRunner`: times each candidate in one persistent worker confined to the budget's cores,
  with TVM's thread count set to match. When the budget takes every core the tuner waits while it
  measures, so the measurement has them to itself. When the tuner has cores of its own besides
  (`TunerCores`), a batch is timed in the background: the tuner searches and builds the next one on
  those cores alone meanwhile, and takes the measuring cores back when the batch is done.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, replace

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, PyRunnerFuture, RunnerResult
from tvm.support.popen_pool import PopenPoolExecutor

from resaware.budget import apart_from
from resaware.platform import confine
from resaware.runtime.measure_built import FLUSH, cold_samples

ARTIFACT_ROOT = os.path.join(tempfile.gettempdir(), "resaware-artifacts")


@dataclass(frozen=True)
class Timing:
    """How each candidate is timed: `repeat` samples, each at least `min_repeat_ms` long (a flushed
    sample of a kernel under 0.2 ms is the mean of 200 runs, however long they take).

    With `flush` (CPU; the default), every run starts with all the kernel's arguments but the first
    (its input) evicted from the caches: the weights, a residual input, the output. That is how a kernel
    finds them inside a model, where the other kernels' weights went through the caches since its last
    call. Timed back to back instead, weights beyond the L2 stay warm and the search ranks schedules by
    a speed the model never sees (`benchmarks/cache_flush.py`). Records of one budget are all timed
    one way (`Slot.time_as`).
    """

    repeat: int = 3
    min_repeat_ms: int = 40
    timeout_s: float = 30.0
    flush: bool = True

    @property
    def caches(self) -> str:
        """How candidates are timed, "flushed" or "warm", as a store writes it down (`Slot.time_as`)."""
        return "flushed" if self.flush else "warm"

    def evaluator(self) -> EvaluatorConfig:
        """MetaSchedule's evaluator settings for these samples (as an RPC runner takes them). TVM
        flushes once a sample, before its runs: flushed, a sample is one run, and there are 10x more."""
        if self.flush:
            return EvaluatorConfig(number=1, repeat=10 * self.repeat, min_repeat_ms=0, enable_cpu_cache_flush=True)
        return EvaluatorConfig(number=1, repeat=self.repeat, min_repeat_ms=self.min_repeat_ms)


def _enter(cores: tuple[int, ...]) -> None:
    # Ctrl-C reaches the whole process group; the tuner finishes its batch and stops its workers
    # itself, so a worker must not die of it and turn the candidates in flight into false failures.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    confine.enter(cores)


class TunerCores:
    """Where the tuner's own work (search, cost model, builds) may run: all of `tuner`, or only those on
    other physical cores than `measuring` (`aside`: not even an SMT sibling) while a batch is timed there
    in the background.

    The tuner process's threads are re-pinned when a batch starts and when it ends (threads that TVM
    and XGBoost start later inherit the mask); build workers pin themselves to `now()` per build.
    """

    def __init__(self, tuner: tuple[int, ...], measuring: tuple[int, ...]):
        self.tuner = tuple(tuner)
        self.aside = apart_from(self.tuner, measuring)
        if not self.aside:
            raise ValueError(
                f"the tuner's cores {self.tuner} leave no physical core aside from the measuring cores {measuring}"
            )
        self._lock = threading.Lock()
        self._measuring = False

    def now(self) -> tuple[int, ...]:
        """The cores a build or search started now may use."""
        with self._lock:
            return self.aside if self._measuring else self.tuner

    def measuring(self, yes: bool) -> None:
        """A batch starts (True) or ends (False) on the measuring cores: move this process accordingly."""
        with self._lock:
            self._measuring = yes
            confine.pin_threads(self.aside if yes else self.tuner)


def build_one(mod, target, cores: tuple[int, ...] | None = None) -> str:
    """Compile one candidate to a shared library in its own directory (the tuner removes it after);
    in a build worker, on `cores` when given."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    if cores:
        confine.pin_threads(cores)

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    try:
        lib = tvm.compile(mod, target=target)
    except Exception as error:
        # Tensorised schedules name intrinsics that are registered only by this (slow) import.
        if "intrin" not in str(error).lower():
            raise
        from resaware.frontend.intrinsics import register

        register(str(target.kind.name))
        lib = tvm.compile(mod, target=target)
    os.makedirs(ARTIFACT_ROOT, exist_ok=True)
    path = os.path.join(tempfile.mkdtemp(dir=ARTIFACT_ROOT), "candidate.so")
    lib.export_library(path)
    return path


@derived_object
class PooledBuilder(PyBuilder):
    """A persistent pool of build workers pinned to `cores` (with `lanes`, to those it allows now)."""

    def __init__(self, cores: tuple[int, ...], workers: int | None = None, timeout_s: float = 60.0,
                 lanes: TunerCores | None = None):  # fmt: skip
        super().__init__()
        self.cores = tuple(cores)
        self.timeout_s = timeout_s
        self.lanes = lanes
        self.pool = PopenPoolExecutor(
            max_workers=workers or len(self.cores),
            timeout=timeout_s,
            initializer=_enter,
            # A worker (re)started while a batch is timed must not start on the measuring cores.
            initargs=(lanes.aside if lanes is not None else self.cores,),
            # Workers leak a little per build in TVM; recycle them now and then, not every batch.
            maximum_process_uses=200,
        )

    def build(self, build_inputs):
        cores = self.lanes.now() if self.lanes is not None else None
        futures = [self.pool.submit(build_one, item.mod, item.target, cores) for item in build_inputs]
        results = []
        for future in futures:
            try:
                results.append(BuilderResult(future.result(), None))
            except FutureTimeout:
                results.append(BuilderResult(None, f"build timed out after {self.timeout_s:g} s"))
            except Exception as error:  # a failed candidate is a record, not a crash
                results.append(BuilderResult(None, f"build failed: {error}"))
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def _random_args(args_info, device):
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    args = []
    for kind, dtype, shape in args_info:
        if kind != "TENSOR":
            raise NotImplementedError(f"argument kind {kind}")
        if "float" in dtype:
            data = rng.uniform(-1, 1, size=shape).astype(dtype)
        else:
            data = rng.integers(0, 8, size=shape).astype(dtype)
        args.append(tvm.runtime.tensor(data, device=device))
    return args


def _measure_one(artifact_path: str, device_type: str, args_info, timing: Timing) -> list[float]:
    """Time one built candidate in this (confined) worker; seconds per run, one per sample."""
    import tvm
    from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

    module = tvm.runtime.load_module(artifact_path)
    device = tvm.runtime.device("cpu" if device_type == "llvm" else device_type, 0)
    args = _random_args(args_info, device)
    if timing.flush and device_type in ("llvm", "cpu"):  # MetaSchedule names the target kind, resaware the device

        def runs(n: int) -> list[float]:
            evaluator = module.time_evaluator(module.entry_name, device, number=1, repeat=n, f_preproc=FLUSH)
            return list(evaluator(*args).results)

        return cold_samples(runs, timing.repeat, timing.min_repeat_ms)
    return run_evaluator_common(module, device, replace(timing, flush=False).evaluator(), [args])


def worker_state() -> dict:
    """What the measuring worker looks like from inside: every thread's mask and its TVM settings."""
    return {
        "pid": os.getpid(),
        "masks": {tid: sorted(mask) for tid, mask in confine.thread_masks().items()},
        "env": {k: os.environ.get(k) for k in confine.environment(1)},
    }


def _spin(seconds: float) -> dict:
    """Busy-loop TVM's thread pool for `seconds` and report where every thread ran (for tests)."""
    import time

    import numpy as np
    import tvm
    from tvm import te

    n = 1 << 20
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0 + 1.0, name="b")
    func = te.create_prim_func([a, b])
    sch = tvm.s_tir.Schedule(func)
    (i,) = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(i)
    lib = tvm.compile(sch.mod, target="llvm")
    x = tvm.runtime.tensor(np.ones(n, "float32"))
    y = tvm.runtime.tensor(np.zeros(n, "float32"))
    cpus, busy = {}, {}
    began = time.time()
    end = began + seconds
    while time.time() < end:
        lib(x, y)
        for tid in confine.thread_ids():
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # "processor" is where a thread last ran, perhaps before it was pinned: count it only
            # for threads that used CPU time since the previous look.
            ticks = int(fields[11]) + int(fields[12])
            if tid in busy and ticks > busy[tid]:
                cpus.setdefault(tid, set()).add(int(fields[36]))
            busy[tid] = ticks
    state = worker_state()
    state["ran_on"] = {tid: sorted(c) for tid, c in cpus.items()}
    state["window"] = (began, time.time())
    return state


@derived_object
class PendingRun(PyRunnerFuture):
    """One candidate's timing in the measuring worker, as MetaSchedule waits for it."""

    def __init__(self, job: Future, timeout_s: float):
        super().__init__()
        self.job, self.timeout_s = job, timeout_s

    def done(self) -> bool:
        return self.job.done()

    def result(self) -> RunnerResult:
        try:
            return RunnerResult(self.job.result(), None)
        except FutureTimeout:
            return RunnerResult(None, f"run timed out after {self.timeout_s:g} s")
        except Exception as error:  # a crashing candidate is a failed record, tuning goes on
            return RunnerResult(None, f"run failed: {error}")


@derived_object
class ConfinedRunner(PyRunner):
    """Times candidates one at a time in a persistent worker confined to `cores`, one batch at a time.

    Without `lanes`, `run` returns once the batch is timed. With them, it returns at once and the
    tuner keeps to `lanes.aside` until the batch is done; the next `run` waits for it first.
    """

    def __init__(self, cores: tuple[int, ...], timing: Timing = Timing(), lanes: TunerCores | None = None):
        super().__init__()
        self.cores = tuple(cores)
        self.timing = timing
        self.lanes = lanes
        self.measuring_s = 0.0  # from each batch's first submission to its last result, summed
        self.batch_done = threading.Event()
        self.batch_done.set()
        self.in_flight: list[Future] = []
        self.closed = False
        self.pool = PopenPoolExecutor(
            max_workers=1,
            timeout=timing.timeout_s,
            initializer=_enter,
            initargs=(self.cores,),
            stderr=subprocess.DEVNULL,
        )

    def call(self, fn, *args):
        """Run `fn(*args)` in the confined worker once no batch is being timed (verification, tests)."""
        self.batch_done.wait()
        return self.pool.submit(fn, *args).result()

    def run(self, runner_inputs):
        self.batch_done.wait()
        jobs = [(str(item.artifact_path), str(item.device_type), tuple(a.as_json() for a in item.args_info))
                for item in runner_inputs]  # fmt: skip
        began = time.monotonic()
        if self.lanes is None or not jobs:
            futures = [self.pool.submit(_measure_one, *job, self.timing) for job in jobs]
            wait_for(futures)
            self.measuring_s += time.monotonic() - began
        else:
            self.batch_done.clear()
            try:
                self.lanes.measuring(True)  # off the measuring cores before the first run starts
                futures = self.in_flight = [self.pool.submit(_measure_one, *job, self.timing) for job in jobs]
            except BaseException:
                self._batch_over()
                raise

            def finished(_: Future) -> None:
                self.measuring_s += time.monotonic() - began
                self._batch_over()

            # The pool's one worker takes its jobs in order (and `close` cancels the rest), so the last is done last.
            futures[-1].add_done_callback(finished)
        return [PendingRun(future, self.timing.timeout_s) for future in futures]

    def _batch_over(self) -> None:
        try:
            if not self.closed:  # closed: the tuner has put its threads back already
                self.lanes.measuring(False)
        finally:
            self.batch_done.set()

    def close(self) -> None:
        """Stop the worker; a batch still queued is dropped (its futures are cancelled), not timed."""
        self.closed = True
        for future in self.in_flight:
            future.cancel()
        self.pool.shutdown(wait=False)


def remove_artifact(path: str) -> None:
    """Delete a built candidate's temporary directory."""
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
