"""Convolution layout: the model as imported (NCHW) against its convolutions in NHWC (resaware's
default on CPU, `resaware.layout`) or in NHWC with its 3x3 ones as Winograd (`--layouts`), each tuned
by `resaware.tune` for the same minutes (or `--trials`) at one budget, compiled from its own store and
timed with ONNX Runtime in interleaved rounds.

    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --minutes 10
    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --minutes 15 --layouts NHWC,NHWC-winograd
    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --trials 128 --layouts NHWC,NHWC-winograd
    python benchmarks/layout.py --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import resaware
from common import add_output_args, output_dir, result_name, write
from side_by_side import ORT, SideBySide, medians


def compare(args, work: Path) -> tuple[dict, dict, object]:
    """Tune, compile and check each layout in `work`, then time both modules and ONNX Runtime in
    interleaved rounds: (median ms by arm, each layout's tuning figures, the budget's CPU share)."""
    models = {layout: resaware.load_onnx(args.model, layout=layout) for layout in args.layouts.split(",")}
    timing = SideBySide(next(iter(models.values())), args.budget, args.repeat)
    arms = {}
    for layout, model in models.items():
        store = work / layout
        limit = None if args.trials else args.minutes * 60  # trials=None: tune for the time alone
        tuned = resaware.tune(model, [args.budget], args.trials, store=store, time_limit=limit, progress=False)
        result = tuned.budgets[0]
        compiled = resaware.compile(model, args.budget, store=store)
        arms[layout] = {
            "layout": compiled.info["layout"], "tasks": len(result.tasks), "trials": result.trials_run, "wall_s": result.wall_s,
            "estimate_ms": result.estimated_s * 1e3 if result.estimated_s else None,
        }  # fmt: skip
        arms[layout]["rel_error"] = timing.module(layout, compiled.export(work / f"{layout}.so"))
        print(f"{layout}: {arms[layout]}", flush=True)
    timing.onnx_runtime()
    runs, _ = timing.run(args.rounds, probe=False)
    return medians(runs), arms, timing.share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--minutes", type=float, default=10.0, help="tuning time per layout")
    parser.add_argument("--trials", type=int, help="tune each layout for this many trials instead of --minutes")
    parser.add_argument("--layouts", default="NCHW,NHWC", help="the layouts to compare (`resaware.layout`)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    add_output_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.rounds, args.repeat = 0.5, 1, 3
    out = output_dir(args)
    with tempfile.TemporaryDirectory(prefix="resaware-layout-") as work:  # stores and modules: scratch
        latency, arms, share = compare(args, Path(work))
    lines = [
        f"layout: {args.model} at {args.budget} ({share.count} cores), "
        + (f"{args.trials} trials" if args.trials else f"{args.minutes:g} min")
        + " of resaware.tune per layout",
        f"{'layout':<13} {'tasks':>5} {'trials':>6} {'tuned s':>7} {'estimate':>9} {'module':>9} {'/ ORT':>6}",
    ]
    for layout, arm in arms.items():
        arm["latency_ms"] = latency[layout]
        estimate = f"{arm['estimate_ms']:.2f}" if arm["estimate_ms"] else "-"
        lines.append(f"{layout:<13} {arm['tasks']:>5} {arm['trials']:>6} {arm['wall_s']:>7.0f} {estimate:>9} {latency[layout]:>9.2f} "
                     f"{latency[layout] / latency[ORT]:>5.2f}x")  # fmt: skip
    lines.append(f"{ORT}: {latency[ORT]:.2f} ms; median of {args.rounds} interleaved rounds; ms")
    table = "\n".join(lines)
    print(table)
    command = "python benchmarks/layout.py " + " ".join(sys.argv[1:])
    data = {"model": args.model, "budget": args.budget, "cores": share.count, "minutes": args.minutes, "trials": args.trials,
            "onnxruntime_ms": latency[ORT], "layouts": arms}  # fmt: skip
    name = result_name("layout", args.model, args.budget)
    if args.layouts != "NCHW,NHWC":  # the default's files keep their name
        name += "-" + args.layouts.lower().replace(",", "-")
    if args.trials:
        name += f"-{args.trials}trials"
    write(out, name, data, table, command)


if __name__ == "__main__":
    main()
