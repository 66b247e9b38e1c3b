"""Warm or flushed: does timing a kernel with its weights flushed from the caches change which of its
candidates wins?

The model's kernels with the most weight bytes (the arguments between the input and the output) are
tuned one at a time by MetaSchedule with resaware's builder and runner, timing back to back (warm, as
MetaSchedule does). Then the best `--top` records of each are built again and timed both ways in one
worker confined to the budget's cores: warm, and flushed (`measure.Timing`: each run with the weights
and the output evicted from the caches, as a kernel finds them inside a model). Reported per kernel:
the flushed time of the warm pick against the best flushed time among the same records, i.e. what
ranking warm costs inside the model, and how far the two orders agree (Spearman).

    python benchmarks/cache_flush.py --model zoo:resnet50 --budget 50% --tasks 2 --trials 64
    python benchmarks/cache_flush.py --quick
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile

from common import add_output_args, output_dir, result_name, write
from resaware.budget import Budget
from resaware.frontend import intrinsics
from resaware.frontend.model import resolve
from resaware.frontend.tasks import extract, lower
from resaware.platform import confine, hardware
from resaware.store import replay
from resaware.tuning import search
from resaware.tuning.measure import ConfinedRunner, PooledBuilder, Timing, _measure_one, build_one, remove_artifact


def _args(task) -> list:
    from tvm.s_tir import meta_schedule as ms

    (func,) = task.mod.functions.values()
    return [tuple(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(func)]


def weight_bytes(task) -> int:
    """Bytes of the arguments between the first (the input) and the last (the output)."""
    return sum(math.prod(shape) * 4 for _, _, shape in _args(task)[1:-1])


def spearman(a: list[float], b: list[float]) -> float | None:
    """Rank correlation of two timings of the same candidates (None for fewer than three)."""
    from scipy.stats import spearmanr  # comes with XGBoost

    return float(spearmanr(a, b).statistic) if len(a) >= 3 else None


def compare(task, target, cores, builder, trials: int, top: int, seed: int) -> dict:
    """Tune `task` warm for `trials`, then time its `top` best records warm and flushed."""
    from tvm.s_tir import meta_schedule as ms

    work = tempfile.mkdtemp(prefix="resaware-cache-flush-")
    database = ms.database.JSONDatabase(work_dir=work)
    warm, flushed = Timing(flush=False), Timing(flush=True)
    runner = ConfinedRunner(cores, warm)
    try:
        ms.tune_tasks(tasks=search._contexts([task], target, len(cores), seed, 16), task_weights=[1.0], work_dir=work,
                      max_trials_global=trials, num_trials_per_iter=min(16, trials), builder=builder, runner=runner,
                      database=database, cost_model="xgb", task_scheduler="round-robin")  # fmt: skip
        records = database.get_top_k(database.commit_workload(task.mod), top)
        args, rows = _args(task), []
        for record in records:
            path = builder.pool.submit(build_one, replay(record, task.mod).sch.mod, target).result()
            try:
                times = {name: runner.call(_measure_one, path, "llvm", args, timing)
                         for name, timing in (("warm", warm), ("flushed", flushed))}  # fmt: skip
            finally:
                remove_artifact(path)
            rows.append({name: sum(t) / len(t) * 1e3 for name, t in times.items()})
    finally:
        runner.close()
    warm_pick = min(rows, key=lambda r: r["warm"])
    best_flushed = min(r["flushed"] for r in rows)
    return {
        "task": task.name, "weight_kb": weight_bytes(task) // 1024, "trials": trials, "candidates": rows,
        "warm_pick_warm_ms": warm_pick["warm"], "warm_pick_flushed_ms": warm_pick["flushed"],
        "best_flushed_ms": best_flushed, "cost_of_ranking_warm": warm_pick["flushed"] / best_flushed,
        "spearman": spearman([r["warm"] for r in rows], [r["flushed"] for r in rows]),
    }  # fmt: skip


def table(results: list[dict]) -> str:
    lines = [f"{'kernel':<58} {'weights':>8} {'warm pick: warm':>16} {'flushed':>9} {'best flushed':>13} "
             f"{'cost':>6} {'spearman':>9}"]  # fmt: skip
    for r in results:
        rho = f"{r['spearman']:.2f}" if r["spearman"] is not None else "-"
        lines.append(f"{r['task'][:58]:<58} {r['weight_kb']:>6}KB {r['warm_pick_warm_ms']:>13.3f} ms "
                     f"{r['warm_pick_flushed_ms']:>6.3f} ms {r['best_flushed_ms']:>10.3f} ms "
                     f"{r['cost_of_ranking_warm']:>5.2f}x {rho:>9}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--tasks", type=int, default=2, help="kernels with the most weight bytes to tune")
    parser.add_argument("--trials", type=int, default=64, help="warm trials per kernel")
    parser.add_argument("--top", type=int, default=24, help="best records of each kernel timed both ways")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.model, args.tasks, args.trials, args.top = "zoo:squeezenet", 1, 16, 4
    out = output_dir(args)
    share = Budget.parse(args.budget).cpu(confine.usable_cores())
    intrinsics.register("llvm")
    model, target = resolve(args.model), hardware.llvm_target(share.count)
    tasks = sorted(extract(model, target, lower(model, target)[0]), key=weight_bytes, reverse=True)[: args.tasks]
    builder = PooledBuilder(tuple(sorted({*share.cores, *share.spare(1)})))
    try:
        results = [compare(t, target, share.cores, builder, args.trials, args.top, args.seed) for t in tasks]
    finally:
        builder.close()
    text = table(results)
    print(text)
    command = "python benchmarks/cache_flush.py " + " ".join(sys.argv[1:])
    write(out, result_name("cache_flush", args.model, args.budget), {"model": args.model, "budget": args.budget,
          "cores": list(share.cores), "results": results}, text, command)  # fmt: skip


if __name__ == "__main__":
    main()
