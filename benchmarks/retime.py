"""Retime: modules compiled earlier (`resaware compile -o`, or the snapshots a `time_to_quality.py --keep`
run leaves) timed again side by side with ONNX Runtime at one budget, in interleaved rounds.

Runs made on different days meet different states of a shared host (on this VM, whether the two vCPUs
sit close): two modules are compared fairly only when timed in the same rounds. Each module's outputs
are checked against ONNX Runtime's first; with two cores or more the cross-core round trip is probed
after each timing (`common.round_trip_ns`), so every sample says which state it was taken in.

    python benchmarks/retime.py --model zoo:squeezenet --budget 100% --rounds 9 \\
        NHWC=/work/ttq7-sq100/snapshots/9.so NHWC-winograd=/work/ttqw-sq100/snapshots/9.so
    python benchmarks/retime.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import resaware
from common import add_output_args, output_dir, read_slow, result_name, write
from side_by_side import ORT, SideBySide


def retime(args, modules: dict[str, str]) -> dict:
    """Check each module's outputs, then time them all and ONNX Runtime over `args.rounds` rounds:
    per arm its median, each round's median ms, each round's probe (ns) and, for modules, the error."""
    arms = SideBySide(resaware.load_onnx(args.model), args.budget, args.repeat, args.tolerance)
    info = {}
    for label, path in modules.items():
        error = arms.module(label, path)
        info[label] = {
            "path": path,
            "max_rel_error": error,
            **{k: arms.info[label].get(k) for k in ("layout", "records")},
        }
    arms.onnx_runtime()
    info[ORT] = {}
    runs, trips = arms.run(args.rounds)
    for label, latencies in runs.items():
        rounds = [x.median_ms for x in latencies]
        info[label].update(median_ms=statistics.median(rounds), rounds_ms=rounds, round_trip_ns=trips[label])
    return {"model": args.model, "budget": args.budget, "cores": arms.share.count, "rounds": args.rounds, "arms": info}


def table(data: dict) -> str:
    ort = data["arms"][ORT]["median_ms"]
    lines = [
        f"retime: {data['model']} at {data['budget']} ({data['cores']} cores), {data['rounds']} interleaved rounds",
        f"{'module':<16} {'layout':<14} {'records':>7} {'median':>9} {'/ ORT':>6}  rounds (ms)",
    ]
    for label, arm in data["arms"].items():
        rounds = " ".join(f"{ms:.2f}" for ms in arm["rounds_ms"])
        lines.append(f"{label:<16} {arm.get('layout') or '-':<14} {arm.get('records') or '-':>7} "
                     f"{arm['median_ms']:>6.3g} ms {arm['median_ms'] / ort:>5.2f}x  {rounds}")  # fmt: skip
    if every := [ns for arm in data["arms"].values() for ns in arm["round_trip_ns"]]:
        slow = read_slow(every)
        lines.append(f"cross-core round trip after each timing: {min(every):.0f}-{max(every):.0f} ns; " + (
            f"{sum(slow)} of {len(every)} read slow (the host had moved the vCPUs apart)" if slow else "one state throughout"))  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="LABEL=PATH", help="compiled modules (.so) to time")
    parser.add_argument("--model", default="zoo:squeezenet", help="the model they were compiled from")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest relative error against ONNX Runtime")
    parser.add_argument("--name", help="suffix of the results' file names (default: the labels)")
    add_output_args(parser)
    args = parser.parse_args()
    modules = dict(m.split("=", 1) for m in args.modules if "=" in m)
    if len(modules) != len(args.modules):
        parser.error("give each module as LABEL=PATH")
    with tempfile.TemporaryDirectory(prefix="resaware-retime-") as work:
        if args.quick:
            args.rounds, args.repeat = 1, 3
        if args.quick and not modules:  # the model untuned: the timing path, not a result
            with tempfile.TemporaryDirectory() as empty:
                untuned = resaware.compile(args.model, args.budget, store=empty)
            modules = {"untuned": untuned.export(Path(work) / "untuned.so")}
        if not modules:
            parser.error("no module to time: give LABEL=PATH (or --quick)")
        data = retime(args, modules)
    text = table(data)
    print(text)
    name = result_name("retime", args.model, args.budget) + "-" + (args.name or "-".join(modules).lower())
    write(output_dir(args), name, data, text, "python benchmarks/retime.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
