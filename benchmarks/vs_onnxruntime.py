"""resaware's tuned module against ONNX Runtime, per model and budget, outputs checked equal.

Each model is tuned (or the store reused) at each budget and compiled for it; the module and ONNX
Runtime (as many intra-op threads as cores, sequential) are timed in children confined to the
budget's cores, interleaved over rounds. Outputs must agree: max|tvm - ort| / max|ort| < 1e-4.

    python benchmarks/vs_onnxruntime.py --store DIR --trials 400
    python benchmarks/vs_onnxruntime.py --store DIR --time 3m   # as many trials as 3 minutes allow
    python benchmarks/vs_onnxruntime.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys

from common import add_output_args, output_dir, write
from resaware.analysis.bench import ONNXRUNTIME, cross_budget, tuned_label
from resaware.cli.parser import parse_duration

MODELS = "zoo:resnet50,zoo:squeezenet,zoo:shufflenet,zoo:inception_v1,zoo:densenet121,zoo:encoder"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--budgets", default="50%,100%")
    parser.add_argument(
        "--trials",
        type=int,
        help="per model and budget (default 400, or with --time as many as it allows); a store holding more keeps them",
    )
    parser.add_argument("--store", help="store to tune into / reuse (default: resaware's user store)")
    parser.add_argument("--time", help="tuning wall-clock limit per model and budget (e.g. 3m)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    limit = parse_duration(args.time) if args.time else None
    if args.trials is None and limit is None:
        args.trials = 400
    if args.quick:
        args.models, args.budgets, args.trials, args.rounds = "zoo:encoder", "100%", 8, 1
    out = output_dir(args)
    store = args.store or (os.path.join(out, "store") if args.quick else None)
    rows = []
    header = f"{'model':<14} {'budget':>6} {'cores':>5} {'trials':>6} {'resaware ms':>12} {'ORT ms':>9} {'resaware/ORT':>13} {'max rel err':>12}"
    print(header, flush=True)
    lines = [header]
    for name in args.models.split(","):
        for budget in args.budgets.split(","):
            result = cross_budget(name, [budget], [budget], args.trials, store=store, rounds=args.rounds,
                                  time_limit=limit, untuned=False, progress=False)  # fmt: skip
            (label,) = result.run_at
            tuned, ort = result.cell(tuned_label(label), label), result.cell(ONNXRUNTIME, label)
            row = {"model": result.model, "budget": label, "cores": result.cores[label],
                   "trials": result.trials[label], "resaware_ms": tuned.median_ms, "onnxruntime_ms": ort.median_ms,
                   "ratio": tuned.median_ms / ort.median_ms, "max_rel_error": result.max_rel_error[tuned.row],
                   "rounds_ms": {"resaware": tuned.rounds_ms, "onnxruntime": ort.rounds_ms}}  # fmt: skip
            rows.append(row)
            lines.append(f"{row['model']:<14} {label:>6} {row['cores']:>5} {row['trials']:>6} {row['resaware_ms']:>12.2f} "
                         f"{row['onnxruntime_ms']:>9.2f} {row['ratio']:>12.2f}x {row['max_rel_error']:>12.1e}")  # fmt: skip
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    write(out, "vs_onnxruntime", {"rows": rows, "trials": args.trials, "time_limit_s": limit, "rounds": args.rounds}, table,
          "python " + " ".join(sys.argv))  # fmt: skip


if __name__ == "__main__":
    main()
