"""Builder overhead per batch: resaware's PooledBuilder against TVM's default LocalBuilder, in one run.

Overhead = wall time of building a batch minus the LLVM compile time of its candidates (measured
in-process, warm, divided by the builder's worker count). TVM's LocalBuilder starts a fresh worker
pool for every batch and imports every backend's tensor intrinsics in each worker; resaware keeps
its pool and registers only the target family's intrinsics.

    python benchmarks/builder_overhead.py [--batches 3] [--batch-size 8] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import tvm
from tvm.s_tir.meta_schedule.builder import BuilderInput, LocalBuilder

from common import add_output_args, output_dir, sample_candidates, write
from resaware.platform import confine, hardware
from resaware.tuning import measure


def compile_seconds(mods, target) -> float:
    start = time.perf_counter()
    for mod in mods:
        path = measure.build_one(mod, target)
        measure.remove_artifact(path)
    return time.perf_counter() - start


def time_batches(builder, mods, target, batches: int) -> list[float]:
    walls = []
    for _ in range(batches):
        start = time.perf_counter()
        results = builder.build([BuilderInput(m, target) for m in mods])
        walls.append(time.perf_counter() - start)
        assert all(r.error_msg is None for r in results), [r.error_msg for r in results if r.error_msg]
        for r in results:
            measure.remove_artifact(r.artifact_path)
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    add_output_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.batch_size = 1, 2
    cores = tuple(confine.usable_cores())
    target = hardware.llvm_target(len(cores))
    ((name, mods),) = sample_candidates("zoo:squeezenet", target, per_task=args.batch_size, tasks=1)
    compile_s = statistics.median(compile_seconds(mods, target) for _ in range(2))

    pooled = measure.PooledBuilder(cores)
    pooled_walls = time_batches(pooled, mods, target, args.batches)
    pooled.close()
    # Its default 30 s timeout is shorter than the intrinsics import on a small machine: every
    # build then times out. Give it room, so what is measured is its overhead, not a failure.
    default_fails = sum(
        r.error_msg is not None for r in LocalBuilder(max_workers=len(cores)).build([BuilderInput(mods[0], target)])
    )
    local = LocalBuilder(max_workers=len(cores), timeout_sec=600)
    local_walls = time_batches(local, mods, target, args.batches)

    ideal = compile_s / len(cores)
    rows = {
        # Below zero means the pool compiled in parallel faster than one warm process: no overhead.
        "resaware PooledBuilder": [max(0.0, w - ideal) for w in pooled_walls],
        "TVM LocalBuilder": [max(0.0, w - ideal) for w in local_walls],
    }
    # The pooled builder pays its workers' start once; steady state is every batch after the first.
    pooled_steady = statistics.median(rows["resaware PooledBuilder"][1:] or rows["resaware PooledBuilder"])
    local_steady = statistics.median(rows["TVM LocalBuilder"])
    lines = [
        f"builder overhead per batch of {len(mods)} candidates ({name}), {len(cores)} workers, "
        f"LLVM compile time {compile_s:.2f} s serial ({ideal:.2f} s ideal parallel)",
        f"{'builder':<24} {'batch walls (s)':<28} {'overhead/batch (s)':>18}",
    ]
    for label, walls, steady in [
        ("resaware PooledBuilder", pooled_walls, pooled_steady),
        ("TVM LocalBuilder", local_walls, local_steady),
    ]:
        lines.append(f"{label:<24} {' '.join(f'{w:6.2f}' for w in walls):<28} {steady:>18.2f}")
    lines.append(f"first pooled batch (worker start included): {rows['resaware PooledBuilder'][0]:.2f} s overhead")
    lines.append(
        f"TVM LocalBuilder with its default 30 s timeout: {'every build timed out' if default_fails else 'builds succeeded'}"
    )
    wall_ratio = statistics.median(local_walls) / statistics.median(pooled_walls[1:] or pooled_walls)
    lines.append(f"ratio of batch wall time, TVM / resaware: {wall_ratio:.1f}x")
    table = "\n".join(lines)
    print(table)
    data = {
        "task": name, "batch_size": len(mods), "workers": len(cores), "compile_serial_s": compile_s,
        "pooled_walls_s": pooled_walls, "local_walls_s": local_walls,
        "pooled_overhead_s": pooled_steady, "local_overhead_s": local_steady,
        "wall_ratio": wall_ratio, "local_default_timeout_failed": bool(default_fails),
        "cpu": hardware.detect().describe(), "tvm": tvm.__version__, "pid": os.getpid(),
    }  # fmt: skip
    write(output_dir(args), "builder_overhead", data, table, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
