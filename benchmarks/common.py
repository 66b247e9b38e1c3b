"""What every benchmark script shares: where results go, and how they are written.

Full runs write to `benchmarks/results/` (the committed figures); `--quick` runs write to a
temporary directory unless `--out` names one, so a smoke test never overwrites them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI-sized smoke run (writes to a temporary directory)")
    parser.add_argument("--out", help="directory for the JSON, table and plots (default: benchmarks/results)")


def output_dir(args: argparse.Namespace) -> Path:
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="resaware-bench-"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def result_name(kind: str, model: str, budget: str) -> str:
    """`<kind>-<model>-<pct>pct`, the results' name for one model at one budget (`zoo:` and paths alike)."""
    from resaware.budget import Budget

    return f"{kind}-{Path(model.removeprefix('zoo:')).stem}-{Budget.parse(budget).percent:g}pct"


def write(out: Path, name: str, data: dict, table: str, command: str) -> None:
    """`<name>.json` (numbers + provenance) and `<name>.md` (the printed table and the command)."""
    data = {**data, "command": command, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node()}
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    (out / f"{name}.md").write_text(f"```\n$ {command}\n{table}\n```\n")
    print(f"wrote {out / name}.json, .md")


def sample_candidates(model: str, target, per_task: int, tasks: int = 1) -> list[tuple[str, list]]:
    """Real candidates without tuning: (task name, scheduled modules) for the model's `tasks`
    heaviest kernels, `per_task` seeded samples of each one's design space."""
    import resaware
    from resaware.frontend import intrinsics
    from resaware.frontend.tasks import extract
    from resaware.tuning.candidates import sample

    intrinsics.register("llvm")
    found = []
    for task in extract(resaware.load_onnx(model), target)[:tasks]:
        found.append((task.name, [c.sch.mod for c in sample(task, target, per_task, seed=0)[:per_task]]))
    return found


def _bounce(name: str, core: int, trips: int) -> None:
    signal.alarm(30)  # never outlive a parent that died mid-probe: SIGALRM's default ends the process
    os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name)
    flag = shm.buf
    flag[0] = 1  # ready
    for _ in range(trips):
        while flag[0] != 2:
            pass
        flag[0] = 1
    del flag
    shm.close()


def _expired(*_) -> None:
    raise TimeoutError("the cross-core probe's partner stopped answering")


def round_trip_ns(a: int, b: int, trips: int = 20000) -> float:
    """Nanoseconds for a byte in shared memory to go from core `a` to core `b` and back, spun on by two
    Python processes (main thread only: it bounds itself with SIGALRM). On this VM it reads ~200 ns while
    the host keeps both vCPUs close and ~450 ns when it has moved them apart; every kernel that reads what
    a thread on the other core just wrote pays for it."""
    shm = shared_memory.SharedMemory(create=True, size=64)
    flag = shm.buf
    flag[0] = 0
    # fork: the child needs nothing from the parent's state, and forking is the fastest start.
    child = multiprocessing.get_context("fork").Process(target=_bounce, args=(shm.name, b, trips), daemon=True)
    mask = os.sched_getaffinity(0)
    previous = signal.signal(signal.SIGALRM, _expired)
    try:
        os.sched_setaffinity(0, {a})
        signal.setitimer(signal.ITIMER_REAL, 20)
        child.start()
        while flag[0] != 1:
            if child.exitcode is not None:
                raise RuntimeError(f"the cross-core probe's partner exited with code {child.exitcode}")
            time.sleep(0.001)
        time.sleep(0.1)  # let both processes finish their copy-on-write faults after the fork
        t0 = time.perf_counter()
        for _ in range(trips):
            flag[0] = 2
            while flag[0] != 1:
                pass
        elapsed = time.perf_counter() - t0
        child.join(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if child.is_alive():
            child.kill()
            child.join(1)
        os.sched_setaffinity(0, mask)
        del flag
        shm.close()
        shm.unlink()
    return elapsed / trips * 1e9


def probed(timer, trips: list[float], cores: list[int]):
    """Call `timer`, then append to `trips` how far apart the host has put two of `cores` (the state the
    timing ran in, `round_trip_ns`); its result."""
    result = timer()
    trips.append(round_trip_ns(*cores[:2]))
    return result


def read_slow(trips: list[float]) -> list[bool] | None:
    """Which probes read slow: over 1.5x the fastest, where the probes differ by that much at all (None
    where they do not: one state throughout, and the probes alone cannot tell which)."""
    if not trips or max(trips) <= 1.5 * min(trips):
        return None
    return [ns > 1.5 * min(trips) for ns in trips]
