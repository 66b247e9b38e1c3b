"""Convolution layout: the model as imported (NCHW) against its convolutions in NHWC (resaware's
default on CPU, `resaware.frontend.layout`) or in NHWC with its 3x3 ones as Winograd (`--layouts`), each tuned
by `resaware.tune` for the same minutes (or `--trials`) at one budget, compiled from its own store and
timed with ONNX Runtime in interleaved rounds.

    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --minutes 10
    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --minutes 15 --layouts NHWC,NHWC-winograd
    python benchmarks/layout.py --model zoo:squeezenet --budget 50% --trials 128 --layouts NHWC,NHWC-winograd
    python benchmarks/layout.py --conv 64,64,56 --budget 50% --minutes 2 --layouts NHWC,NHWC-winograd
    python benchmarks/layout.py --quick

`--conv CIN,COUT,SIZE` times one 3x3 convolution (stride 1, padding 1, seeded random weights) of CIN to
COUT channels on a SIZE x SIZE input instead of a model: one kernel, where the layouts' difference is
not diluted by the rest of a model.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import resaware
from common import add_output_args, output_dir, result_name, write
from side_by_side import ORT, SideBySide, medians


def single_conv(spec: str, path: Path) -> str:
    """Write the one-convolution ONNX model `--conv CIN,COUT,SIZE` names to `path`; return the path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    cin, cout, size = (int(v) for v in spec.split(","))
    weight = np.random.default_rng(0).normal(0, (cin * 9) ** -0.5, (cout, cin, 3, 3)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


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
    parser.add_argument("--conv", metavar="CIN,COUT,SIZE",
                        help="one 3x3 convolution (stride 1, padding 1) of CIN to COUT channels on SIZE x SIZE, "
                        "instead of --model")  # fmt: skip
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--minutes", type=float, default=10.0, help="tuning time per layout")
    parser.add_argument("--trials", type=int, help="tune each layout for this many trials instead of --minutes")
    parser.add_argument("--layouts", default="NCHW,NHWC", help="the layouts to compare (`resaware.frontend.layout`)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    add_output_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.rounds, args.repeat = 0.5, 1, 3
    if args.conv and not re.fullmatch(r"\d+,\d+,\d+", args.conv):
        parser.error(f"--conv {args.conv!r}: give CIN,COUT,SIZE, e.g. 64,64,56")
    out = output_dir(args)
    with tempfile.TemporaryDirectory(prefix="resaware-layout-") as work:  # stores and modules: scratch
        if args.conv:
            args.model = single_conv(args.conv, Path(work) / f"conv{args.conv.replace(',', '-')}.onnx")
        latency, arms, share = compare(args, Path(work))
    model = Path(args.model).stem if args.conv else args.model
    lines = [
        f"layout: {model} at {args.budget} ({share.count} cores), "
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
    data = {"model": model, "conv": args.conv, "budget": args.budget, "cores": share.count, "minutes": args.minutes,
            "trials": args.trials, "onnxruntime_ms": latency[ORT], "layouts": arms}  # fmt: skip
    name = result_name("layout", model, args.budget)
    if args.layouts != "NCHW,NHWC":  # the default's files keep their name
        name += "-" + args.layouts.lower().replace(",", "-")
    if args.trials:
        name += f"-{args.trials}trials"
    write(out, name, data, table, command)


if __name__ == "__main__":
    main()
