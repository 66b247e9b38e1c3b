"""Measuring on disjoint partitions at once: throughput and fidelity, one worker against k, in one run.

Real candidates (seeded samples of the design spaces of SqueezeNet's heaviest kernels) are built
once for the budget's target, then timed round after round in three arrangements:

  alone          one worker on partition 0, nothing else running;
  k workers      k workers on partitions 0..k-1 at once, the candidates dealt between them
                 (what `resaware tune --concurrency k` measures with);
  beside builds  one worker on partition 0 while the other partitions compile candidates without
                 pause (what a neighbouring client does between its measurements).

Throughput = candidates timed per wall second of measuring. Fidelity = each candidate's time in an
arrangement divided by its time alone (median over rounds), so 1.00 means concurrency changed nothing.

    python benchmarks/concurrent_measurement.py [--budget 50%] [--tasks 4] [--per-task 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RunnerInput

from common import add_output_args, output_dir, sample_candidates, write
from resaware.budget import Budget
from resaware.platform import confine, hardware
from resaware.store import mean_seconds
from resaware.tuning import measure


def build(candidates, target) -> list[tuple[str, str, list]]:
    """(task, artifact path, argument info) per candidate that builds."""
    built = []
    for name, mods in candidates:
        for mod in mods:
            try:
                path = measure.build_one(mod, target)
            except Exception:  # noqa: S112 - a sample that does not build is not a candidate
                continue
            built.append((name, path, ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)))
    return built


def time_on(runner, items) -> list[float | None]:
    futures = runner.run([RunnerInput(path, "llvm", args) for _, path, args in items])
    return [mean_seconds(f.result().run_secs) for f in futures]


def concurrently(runners, built) -> tuple[float, list[float | None]]:
    """Deal the candidates round-robin to the runners and time them all at once; (wall s, seconds each)."""
    times: list[float | None] = [None] * len(built)

    def work(j: int) -> None:
        mine = list(range(j, len(built), len(runners)))
        for i, t in zip(mine, time_on(runners[j], [built[i] for i in mine])):
            times[i] = t

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(runners))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, times


def beside_builds(runner, built, builders, mods, target) -> tuple[float, list[float | None]]:
    """Time every candidate on one worker while `builders` compile in their own processes."""
    # One submission per builder worker: each compiles without pause until the flag file appears.
    flag = os.path.join(measure.ARTIFACT_ROOT, f"stop-{os.getpid()}")
    busy = [builders.pool.submit(_compile_until, mods, target, flag) for _ in builders.cores]
    time.sleep(2.0)  # let them reach full speed
    start = time.perf_counter()
    times = time_on(runner, built)
    wall = time.perf_counter() - start
    open(flag, "w").close()
    for future in busy:
        future.result()
    os.unlink(flag)
    return wall, times


def _compile_until(mods, target, flag: str) -> int:
    n = 0
    while not os.path.exists(flag):
        measure.remove_artifact(measure.build_one(mods[n % len(mods)], target))
        n += 1
    return n


def summary(rounds: list[list[float | None]], alone: list[float | None], tasks: list[str]) -> dict[str, float]:
    """Every single timing against the candidate's median time alone, and whether each round would
    still have picked a schedule within 5% of each kernel's best."""
    ratios = [t / a for got in rounds for t, a in zip(got, alone) if t is not None and a is not None]
    deviation = sorted(abs(r - 1) for r in ratios)
    picks = []
    for got in rounds:
        for name in dict.fromkeys(tasks):
            ids = [i for i, t in enumerate(tasks) if t == name and got[i] is not None and alone[i] is not None]
            if ids:
                chosen = min(ids, key=lambda i: got[i])
                picks.append(alone[chosen] <= 1.05 * min(alone[i] for i in ids))
    return {
        "median_ratio": statistics.median(ratios),
        "p90_deviation": deviation[int(0.9 * (len(deviation) - 1))],
        "within_5pct": sum(d <= 0.05 for d in deviation) / len(deviation),
        "good_picks": sum(picks) / len(picks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--tasks", type=int, default=4, help="heaviest kernels sampled")
    parser.add_argument("--per-task", type=int, default=8, help="candidates per kernel")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.per_task, args.rounds = 2, 2, 1
    share = Budget.parse(args.budget).cpu(confine.usable_cores())
    k = share.max_concurrency
    if k < 2:
        raise SystemExit(
            f"budget {args.budget} leaves room for one partition of {share.count} cores here: nothing to compare"
        )
    partitions = [p.cores for p in share.partitions(k)]
    target = hardware.llvm_target(share.count)
    candidates = sample_candidates(args.model, target, args.per_task, args.tasks)
    built = build(candidates, target)
    runners = [measure.ConfinedRunner(cores) for cores in partitions]
    others = tuple(c for p in partitions[1:] for c in p)
    builders = measure.PooledBuilder(others)
    walls: dict[str, list[float]] = {"alone": [], "k workers": [], "beside builds": []}
    times: dict[str, list[list[float | None]]] = {name: [] for name in walls}
    try:
        time_on(runners[0], built[:1])  # warm the workers before anything is timed
        for runner in runners[1:]:
            time_on(runner, built[:1])
        for r in range(args.rounds):
            # Rotate the order so no arrangement always runs first or last.
            for name in list(walls)[r % 3 :] + list(walls)[: r % 3]:
                if name == "alone":
                    start = time.perf_counter()
                    got = time_on(runners[0], built)
                    wall = time.perf_counter() - start
                elif name == "k workers":
                    wall, got = concurrently(runners, built)
                else:
                    wall, got = beside_builds(
                        runners[0], built, builders, [m for _, ms_ in candidates for m in ms_], target
                    )
                walls[name].append(wall)
                times[name].append(got)
    finally:
        for runner in runners:
            runner.close()
        builders.close()
        for _, path, _ in built:
            measure.remove_artifact(path)

    alone = [statistics.median(t) if None not in (t := [rnd[i] for rnd in times["alone"]]) else None
             for i in range(len(built))]  # fmt: skip
    tasks = [name for name, _, _ in built]
    data_rows = {}
    for name in walls:
        throughput = len(built) / statistics.median(walls[name])
        data_rows[name] = {"wall_s": walls[name], "throughput": throughput, **summary(times[name], alone, tasks),
                           "times_s": times[name]}  # fmt: skip
    base = data_rows["alone"]["throughput"]
    lines = [
        f"measuring {len(built)} candidates ({args.tasks} kernels of {args.model}) at {args.budget}: "
        f"partitions {[list(p) for p in partitions]}, {args.rounds} rounds",
        f"{'arrangement':<14} {'wall s':>7} {'cand./s':>8} {'vs alone':>9} {'time ratio':>10} {'p90 |dev|':>9} "
        f"{'within 5%':>9} {'good picks':>10}",
    ]
    for name, row in data_rows.items():
        lines.append(
            f"{name:<14} {statistics.median(row['wall_s']):>7.2f} {row['throughput']:>8.2f} "
            f"{row['throughput'] / base:>8.2f}x {row['median_ratio']:>10.3f} {row['p90_deviation']:>9.1%} "
            f"{row['within_5pct']:>9.0%} {row['good_picks']:>10.0%}"
        )
    lines += [
        "time ratio, |dev|, within 5%: every single timing against the candidate's median time alone (the alone",
        "row is the machine's own round-to-round noise); good picks: rounds x kernels whose fastest candidate",
        "there is within 5% of the kernel's fastest alone (what the tuner would keep)",
    ]
    table = "\n".join(lines)
    print(table)
    data = {"model": args.model, "budget": args.budget, "partitions": [list(p) for p in partitions],
            "candidates": len(built), "rounds": args.rounds, "arrangements": data_rows,
            "throughput_ratio": data_rows["k workers"]["throughput"] / base,
            "cpu": hardware.detect().describe(), "tvm": tvm.__version__}  # fmt: skip
    write(output_dir(args), "concurrent_measurement", data, table, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
