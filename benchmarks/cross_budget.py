"""The paper's headline experiment on this machine: tuned-at x run-at latency matrices for zoo models.

For each model: tune (or reuse the store) at every budget, compile one module per tune-at budget and
time each at every run-at budget in a confined child, beside the untuned module and ONNX Runtime
(`resaware.bench.cross_budget`). Writes per model a JSON, the table, the heatmap, the tuning curves
(`-curves.png`) and per-task bars (`-tasks.png`), and prints a summary.

    python benchmarks/cross_budget.py --store DIR                  # resnet50, squeezenet; 400 trials
    python benchmarks/cross_budget.py --quick                      # CI smoke run (temporary store)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from common import add_output_args, output_dir, write
from resaware.analysis.bench import cross_budget, tuned_label
from resaware.analysis.plot import heatmap, task_bars, tuning_curves
from resaware.platform import confine

QUARTERS = "25%,50%,75%,100%"  # budgets that realise the same cores are measured once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--models", default="zoo:resnet50,zoo:squeezenet")
    parser.add_argument("--budgets", default=QUARTERS, help="tune-at and run-at budgets")
    parser.add_argument("--trials", type=int, default=400, help="per model and tune-at budget")
    parser.add_argument("--store", help="store to tune into / reuse (default: resaware's user store)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.models, args.trials, args.rounds = "zoo:squeezenet", 8, 1
    out = output_dir(args)
    store = args.store or (os.path.join(out, "store") if args.quick else None)
    command = "python " + " ".join(sys.argv)
    summary = []
    for name in args.models.split(","):
        start = time.monotonic()
        result = cross_budget(name, args.budgets.split(","), args.budgets.split(","), args.trials, store=store,
                              rounds=args.rounds, progress=False)  # fmt: skip
        table = result.table()
        print(table, flush=True)
        stem = f"cross_budget_{result.model}"
        write(out, stem, {**result.to_json(), "wall_s": time.monotonic() - start}, table, command)
        heatmap(result, out / f"{stem}.png")
        tuning_curves(result.tuning, out / f"{stem}-curves.png")
        task_bars(result.tuning, out / f"{stem}-tasks.png")
        diagonal = {b: result.cell(tuned_label(b), b).ratio for b in result.run_at if tuned_label(b) in result.rows}
        summary.append(f"{result.model}: robust tune-at {result.robust}; tuned-at-run-at ratio " +
                       ", ".join(f"{b} {r:.2f}x" for b, r in diagonal.items()))  # fmt: skip
    print("\n".join(summary))
    print(f"usable cores: {len(confine.usable_cores())}; results in {out}")


if __name__ == "__main__":
    main()
