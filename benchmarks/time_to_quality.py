"""Time to quality: the best whole-model latency against tuning wall time, stock MetaSchedule and
resaware in one run, with ONNX Runtime and untuned TVM as horizontal lines.

For one model and budget, each contestant tunes for `--minutes` in a child process of its own, bounded
by time alone (the contestants of `tuning_speed.py`: "expert" is stock `tune_relax` with the host's
`mcpu`, a lean build function and resaware's batch size; "resaware" is `resaware.tune` with its
defaults). At fixed wall times (`--at`, minutes) and at the end, the model is compiled from the records
the contestant had committed by then (`resaware.compile`, the same way for both), and every module,
ONNX Runtime (its own threads confined to the budget's cores) and the untuned module (compile's default
schedules) are timed at the budget, interleaved over rounds. Trials per minute and the latency ratio to
ONNX Runtime at each mark are the figures the issue asks for.

Fair at the marks; at the end, resaware's clock starts after task extraction and its wall time includes
re-measuring its best kernels (seconds either way), and the end module compiles from the whole store,
resaware's cost model included (it picks schedules for kernels still without records; the marks'
snapshots leave it out). Stock runs with resaware's batch of 8 and TVM's default population (512).

Two hours per contestant and model do not fit one sitting: `--stock-minutes` gives stock a shorter
run (the rates and latencies are compared over the shorter one), and with `--keep` a resaware run
finished there with fewer minutes goes on from its store (records and cost model) for the rest; its
clock continues from where the last run ended, and each restart (task extraction, a fresh search
population) is paid in tuning time.

    python benchmarks/time_to_quality.py --model zoo:squeezenet --budget 50% --minutes 30
    python benchmarks/time_to_quality.py --model zoo:resnet50 --budget 100% --minutes 120 --stock-minutes 30 \
        --keep /work/ttq
    python benchmarks/time_to_quality.py --quick      # CI smoke run
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import tvm
from tuning_speed import CONTESTANTS, compile_layout, race_one, snapshot

import resaware
from common import add_output_args, output_dir, read_slow, result_name, write
from resaware.analysis.plot import curves
from resaware.budget import Budget
from resaware.platform import confine, hardware
from resaware.tuning.search import UNLIMITED
from side_by_side import ORT, SideBySide, medians

UNTUNED = "TVM untuned"


def marks(
    curve: list, wall_s: float, trials: int, minutes: list[float], cap_s: float
) -> list[tuple[float, float, int]]:
    """(minutes, mark seconds, trials) for each mark before the cap: the records committed by the last
    batch before the mark; and the end of the run (the cap, give or take a batch), labelled by the cap."""
    points = []
    for m in minutes:
        if m * 60 < cap_s:
            before = [p for p in curve if p[0] <= m * 60]
            points.append((m, m * 60, before[-1][1] if before else 0))
    return [*points, (cap_s / 60, wall_s, trials)]


def score(results: dict[str, dict], args, work: Path) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Compile each contestant's records at its marks and time all modules, ONNX Runtime and the untuned
    module together (interleaved rounds); adds `quality` [(mark s, trials, median ms)] to each contestant
    and returns the baselines' median ms and, with two cores or more, the cross-core round trip (ns)
    after each timing, by module."""
    model = resaware.load_onnx(args.model)
    arms = SideBySide(model, args.budget, args.repeat, args.tolerance)
    snapshots = work / "snapshots"
    shutil.rmtree(snapshots, ignore_errors=True)  # a rerun with --keep compiles afresh

    def add(key, compiled) -> float:
        return arms.module(key, compiled.export(snapshots / f"{len(arms.timers)}.so"))

    with tempfile.TemporaryDirectory() as empty:
        add(UNTUNED, resaware.compile(model, args.budget, store=empty))
    arms.onnx_runtime(ORT)
    for name, r in results.items():
        r["marks"] = marks(r["curve"], r["wall_s"], r["trials"], args.at, r["cap_s"])
        for _, mark, done in r["marks"]:
            final = mark == r["wall_s"]
            store = Path(r["store"]) if final else snapshot(Path(r["store"]), done, snapshots / f"{name}-{mark:g}")
            compiled = resaware.compile(model, args.budget, store=store, layout=compile_layout(name, args.layout))
            error = add((name, mark, done), compiled)
            r["max_rel_error"] = max(error, r.get("max_rel_error", 0.0))
    print(f"timing {len(arms.timers)} modules at {args.budget} over {args.rounds} rounds", flush=True)
    runs, trips = arms.run(args.rounds)
    samples = medians(runs)
    for name, r in results.items():
        r["quality"] = [[mark, done, samples[name, mark, done]] for _, mark, done in r["marks"]]
        r["final_latency_ms"] = r["quality"][-1][2]
        # By the minute: the module's latency, and trials per minute of tuning up to that mark.
        r["at_minutes"] = {f"{m:g}": samples[name, mark, done] for m, mark, done in r["marks"]}
        r["trials_per_min_at"] = {f"{m:g}": done / mark * 60 for m, mark, done in r["marks"]}
    named = {key if isinstance(key, str) else f"{key[0]} at {key[1]:.0f} s": ns for key, ns in trips.items() if ns}
    return {ORT: samples[ORT], UNTUNED: samples[UNTUNED]}, named


def table(results: dict[str, dict], lines_ms: dict[str, float], trips: dict[str, list[float]], args, cores: int) -> str:
    ort = lines_ms[ORT]
    columns = sorted({float(m) for r in results.values() for m in r["at_minutes"]})
    minutes = sorted({r["cap_s"] / 60 for r in results.values()})
    rows = [
        f"time to quality: {args.model} at {args.budget} ({cores} cores), "
        + ", ".join(f"{r['cap_s'] / 60:g} min {r['label']}" for r in results.values())
        + f", seed {args.seed}",
        f"ONNX Runtime {ort:.3g} ms, TVM untuned {lines_ms[UNTUNED]:.3g} ms (same rounds)",
        f"{'contestant':<14} {'trials':>6} {'wall s':>7} {'trials/min':>10}  "
        + "  ".join(f"{f'{m:g} min':>17}" for m in columns),
    ]
    for r in results.values():
        cells = [(ms := r["at_minutes"].get(f"{m:g}")) and f"{ms:8.3g} ms {ms / ort:5.2f}x" or "-" for m in columns]
        rows.append(f"{r['label']:<14} {r['trials']:>6} {r['wall_s']:>7.0f} {r['trials_per_min']:>10.1f}  "
                    + "  ".join(f"{c:>17}" for c in cells))  # fmt: skip
    rows.append(
        "cells: the module compiled from the records committed by that time (the last: the end of the run), "
        f"median of {args.rounds} interleaved rounds, and its latency / ONNX Runtime's"
    )
    if every := [ns for ns in trips.values() for ns in ns]:
        slow = read_slow(every)
        rows.append(f"cross-core round trip probed after each timing: {min(every):.0f}-{max(every):.0f} ns; " + (
            f"{sum(slow)} of {len(every)} read slow (over 1.5x the fastest: the host had moved the vCPUs apart)"
            if slow else "one state throughout"))  # fmt: skip
    for r in results.values():
        if r["resumed_at"]:
            rows.append(f"{r['label']} was tuned in {len(r['resumed_at']) + 1} runs, each going on from the last's "
                        f"store; they began at {', '.join(f'{s:.0f}' for s in [0, *r['resumed_at']])} s")  # fmt: skip
    expert, ours = results.get("expert"), results.get("resaware")
    if expert and ours:
        # Compared over the same tuning time: the shorter of the two runs.
        m = f"{minutes[0]:g}"
        rows.append(f"over the first {m} min: trials per minute, resaware / stock expert: "
                    f"{ours['trials_per_min_at'][m] / expert['trials_per_min_at'][m]:.2f}x; "
                    f"latency, resaware / stock expert: {ours['at_minutes'][m] / expert['at_minutes'][m]:.2f}x")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--minutes", type=float, help="tuning time per contestant (default 30; --quick: 1)")
    parser.add_argument("--stock-minutes", type=float, help="the stock contestant's tuning time (default: --minutes)")
    parser.add_argument("--at", default="5,10,15,30,60,120", help="minutes at which modules are compiled and timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contestants", default="expert,resaware", help=f"from {', '.join(CONTESTANTS)}")
    parser.add_argument("--layout", default="auto", help="resaware's convolution layout (stock tunes NCHW)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per module and round (at least 1 s)")
    # float32 sums in another order: a partly tuned ResNet-50 differed by 1.0e-4 after its 53 convolutions.
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest max|tvm - ORT| / max|ORT| accepted")
    parser.add_argument("--keep", help="keep stores and logs here: a contestant finished there with the same "
                        "settings is reused, a resaware run finished there with fewer minutes goes on")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.at, args.rounds, args.repeat = "0.5", 1, 3
    args.minutes = args.minutes or (1.0 if args.quick else 30.0)
    args.stock_minutes = args.stock_minutes or args.minutes
    # Every run's length is a mark for the longer runs, so they are compared over the same time.
    args.at = sorted({float(m) for m in str(args.at).split(",")} | {args.minutes, args.stock_minutes})
    names = args.contestants.split(",")
    if unknown := set(names) - set(CONTESTANTS):
        parser.error(f"unknown contestants {sorted(unknown)}: choose from {', '.join(CONTESTANTS)}")
    # What tuning_speed.race_one reads: bounded by time alone.
    args.trials = UNLIMITED
    caps = {name: (args.minutes if name.startswith("resaware") else args.stock_minutes) * 60 for name in names}
    out = output_dir(args)
    cores = Budget.parse(args.budget).cpu(confine.usable_cores()).count
    with tempfile.TemporaryDirectory(prefix="resaware-ttq-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = {name: race_one(name, args, work, caps[name]) for name in names}
        lines_ms, trips = score(results, args, work)
    for r in results.values():
        r["ratio_to_ort"] = {k: v / lines_ms[ORT] for k, v in r["at_minutes"].items()}
        del r["marks"]
    text = table(results, lines_ms, trips, args, cores)
    print(text)
    data = {"model": args.model, "budget": args.budget, "cores": cores, "minutes": args.minutes,
            "stock_minutes": args.stock_minutes, "seed": args.seed,
            "onnxruntime_ms": lines_ms[ORT], "untuned_ms": lines_ms[UNTUNED], "contestants": results, "round_trip_ns": trips,
            "cpu": hardware.detect().describe(), "tvm": tvm.__version__}  # fmt: skip
    stem = result_name("time_to_quality", args.model, args.budget)
    stem += "" if args.layout == "auto" else f"-{args.layout.lower()}"
    write(out, stem, data, text, "python " + " ".join(sys.argv))
    series = {}
    for r in results.values():
        series[f"{r['label']}: module"] = [(s / 60, ms) for s, _, ms in r["quality"]]
        series[f"{r['label']}: estimate"] = [(s / 60, e * 1e3) for s, _, e in r["curve"] if e is not None]
    title = f"{args.model} at {args.budget}: best whole-model latency while tuning"
    curves(series, out / f"{stem}.png", title, lines=lines_ms, dotted=[k for k in series if k.endswith("estimate")],
           xlabel="tuning wall time (min)")  # fmt: skip


if __name__ == "__main__":
    main()
