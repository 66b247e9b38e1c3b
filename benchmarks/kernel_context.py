"""Where a tuned model's time goes: every kernel timed inside the model against the same kernel timed
alone, the way MetaSchedule's runner measures candidates.

The model is compiled for the budget from a store's records (as `resaware compile` does) and run in a
child confined to the budget's cores with TVM's runtime alone. There, each kernel call is timed
- recorded: the best mean the store holds for its task, i.e. what the tuner saw (their sum is the
  estimate tuning reports);
- alone: on the arguments the model passed it, back to back (warm caches, as the runner times it);
- after its producer: right after the kernel before it in the model ran (its inputs just written);
- in the model: through the Relax VM's instrument hook, while the model runs.
The module is also timed whole, and the kernel sequence replayed without the VM. When the sums part,
the kernels the tuner ranked are not the kernels the model runs: that gap bounds what more trials buy.
The three timed columns include a few microseconds of Python call overhead each; the recorded one does not.
With two cores or more, the cross-core round trip is probed before and after (see `common.round_trip_ns`),
and `--watch N` times the whole module N more times, each followed by a probe, to show how its latency
follows where the host has put the cores.

    python benchmarks/kernel_context.py --model zoo:squeezenet --budget 100% --store DIR
    python benchmarks/kernel_context.py --model zoo:squeezenet --budget 100% --store DIR --watch 60
    python benchmarks/kernel_context.py --quick --store DIR      # CI smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import add_output_args, output_dir, read_slow, result_name, round_trip_ns, write
from resaware.budget import Budget
from resaware.errors import ResawareError
from resaware.platform.confine import run_pinned, usable_cores
from resaware.runtime.compiled import child_times, run_confined


def _median_s(call, seconds: float, before=None) -> float:
    """Median seconds of `call` over at least `seconds` (after a warm-up), `before` run untimed ahead of each."""
    call()
    times, end = [], time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < end:
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _child(path: str, seconds: float, runs: int) -> dict:
    """Time the module at `path` whole and kernel by kernel, in this (confined) process."""
    import tvm

    from resaware.runtime.compiled import load

    compiled = load(path)
    vm, args = compiled._vm, [tvm.runtime.tensor(a) for a in compiled.random_inputs(0)]
    main = vm["main"]
    module_s = _median_s(lambda: main(*args), 2 * seconds)
    calls, began = [], {}

    def instrument(func, symbol, before, _ret, *call_args):
        # Kernels only: not the VM's builtins (allocation, shape checks, views) nor calls of Relax functions.
        if symbol.startswith(("vm.", "relax.", "runtime.")) or not all(
            isinstance(a, tvm.runtime.Tensor) for a in call_args
        ):
            return 0
        if before:
            began["t"] = time.perf_counter()
        else:
            calls.append((symbol, func, list(call_args), time.perf_counter() - began["t"]))
        return 0

    vm.set_instrument(instrument)
    in_model = []
    for _ in range(runs):
        calls.clear()
        main(*args)
        in_model.append([c[3] for c in calls])
    vm.set_instrument(None)
    sequence = [(symbol, func, call_args) for symbol, func, call_args, _ in calls]
    replay_s = _median_s(lambda: [func(*a) for _, func, a in sequence], 2 * seconds)
    rows = []
    for i, (symbol, func, call_args) in enumerate(sequence):
        run = functools.partial(func, *call_args)
        producer = functools.partial(sequence[i - 1][1], *sequence[i - 1][2]) if i else None
        rows.append({
            "kernel": symbol,
            "in_model_s": statistics.median(times[i] for times in in_model),
            "alone_s": _median_s(run, seconds),
            "after_producer_s": _median_s(run, seconds, producer),
        })  # fmt: skip
    return {"module_s": module_s, "replay_s": replay_s, "calls": rows}


def recorded(store, slot_key: str | None, model: str) -> dict[str, float]:
    """Kernel name -> the best mean seconds recorded for `model`'s task of that name in the store's slot
    `slot_key` (this hardware); names repeat across models, so only the model's own tasks count."""
    from resaware.platform import hardware
    from resaware.store import Store

    slot = next((s for s in Store.open(store).slots(hardware.detect(), "llvm") if s.key == slot_key), None)
    if slot is None:
        return {}
    names = {int(h): e["name"] for h, e in slot.task_names().items() if model in e["models"]}
    return {names[h]: s.best_s for h, s in slot.stats().items() if h in names and s.best_s is not None}


def table(data: dict, top: int) -> str:
    calls, ms = data["calls"], 1e3
    total = {
        k: sum(c[k] or 0.0 for c in calls) * ms for k in ("recorded_s", "alone_s", "after_producer_s", "in_model_s")
    }
    rows = [
        f"kernel context: {data['model']} at {data['budget']} ({data['cores']} cores), {data['records']} records "
        f"({data['slot']}), {len(calls)} kernel calls",
        f"module {data['module_s'] * ms:.3f} ms; kernel sequence replayed without the VM {data['replay_s'] * ms:.3f} ms",
        f"sums over the calls (ms): recorded {total['recorded_s']:.3f}, alone {total['alone_s']:.3f}, "
        f"after producer {total['after_producer_s']:.3f}, in the model {total['in_model_s']:.3f}",
        (
            f"cross-core round trip before and after: {', '.join(f'{ns:.0f}' for ns in data['round_trip_ns'])} ns; "
            if data["round_trip_ns"]
            else ""
        )
        + f"in the model / alone: {total['in_model_s'] / total['alone_s']:.2f}x; "
        + (
            f"module / recorded (the estimate): {data['module_s'] * ms / total['recorded_s']:.2f}x"
            if total["recorded_s"]
            else "no records for this budget: default schedules"
        ),
        f"{'kernel':<32} {'recorded us':>11} {'alone us':>9} {'after prod.':>11} {'in model us':>11} {'model/alone':>11}",
    ]
    for c in sorted(calls, key=lambda c: -c["in_model_s"])[:top]:
        rec = f"{c['recorded_s'] * 1e6:11.1f}" if c["recorded_s"] else f"{'-':>11}"
        rows.append(f"{c['kernel']:<32} {rec} {c['alone_s'] * 1e6:9.1f} {c['after_producer_s'] * 1e6:11.1f} "
                    f"{c['in_model_s'] * 1e6:11.1f} {c['in_model_s'] / c['alone_s']:10.2f}x")  # fmt: skip
    if len(calls) > top:
        rows.append(f"({len(calls) - top} shorter calls left out of this table; all are in the JSON)")
    if watch := data["watch"]:
        rows.append(f"the module timed {len(watch)} more times, each followed by a cross-core probe:")
        slow = read_slow([ns for ns, _ in watch])
        groups = [("all", watch)] if slow is None else [
            ("fast", [w for w, s in zip(watch, slow) if not s]), ("slow", [w for w, s in zip(watch, slow) if s])]  # fmt: skip
        for label, group in groups:
            if group:
                rows.append(f"  {label} probes ({min(ns for ns, _ in group):.0f}-{max(ns for ns, _ in group):.0f} ns): "
                            f"{len(group)} timings, median {statistics.median(ms for _, ms in group):.3f} ms, "
                            f"range {min(ms for _, ms in group):.3f}-{max(ms for _, ms in group):.3f} ms")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="100%")
    parser.add_argument("--store", help="the store to compile from (default: resaware's user store)")
    parser.add_argument("--seconds", type=float, default=0.3, help="timing per kernel and way (at least 5 runs)")
    parser.add_argument("--runs", type=int, default=20, help="instrumented runs of the model")
    parser.add_argument("--top", type=int, default=25, help="rows in the printed table")
    parser.add_argument("--watch", type=int, default=0, help="time the whole module this many more times, "
                        "each followed by a cross-core probe (two cores or more)")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.seconds, args.runs)))
        return
    if args.quick:
        args.seconds, args.runs = 0.05, 5
    import resaware
    from resaware.platform import hardware

    out = output_dir(args)
    share = Budget.parse(args.budget).cpu(usable_cores())
    compiled = resaware.compile(args.model, args.budget, store=args.store)
    with tempfile.TemporaryDirectory() as tmp:
        path = compiled.export(Path(tmp) / "module.so")
        argv = [sys.executable, __file__, "--child", path, "--seconds", str(args.seconds), "--runs", str(args.runs)]
        # Where the host has put the vCPUs decides what a hand-off between kernels costs: probe either side.
        trips = [round_trip_ns(*share.cores[:2])] if share.count > 1 else []
        done = run_pinned(argv, share.cores, {"TVM_USE_RUNTIME_LIB": "1"})
        trips += [round_trip_ns(*share.cores[:2])] if share.count > 1 else []
        try:
            measured = child_times(done)  # the child's last line, or its last error line
        except ResawareError as error:
            raise SystemExit(str(error)) from None
        watch = []
        for _ in range(args.watch if share.count > 1 else 0):
            latency = run_confined(path, share.cores, args.budget, 10, 3, 1.0, [])
            watch.append((round_trip_ns(*share.cores[:2]), latency.median_ms))
    best = recorded(args.store, compiled.info.get("tuned_slot"), compiled.info["model"])
    for call in measured["calls"]:
        call["recorded_s"] = best.get(call["kernel"])
    data = {"model": args.model, "budget": args.budget, "cores": share.count, "slot": compiled.info.get("tuned_slot"),
            "records": compiled.info.get("records", 0), **measured, "round_trip_ns": trips, "watch": watch, "cpu": hardware.detect().describe()}  # fmt: skip
    text = table(data, args.top)
    print(text)
    stem = result_name("kernel_context", args.model, args.budget)
    write(out, stem, data, text, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
