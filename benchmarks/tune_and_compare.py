"""Tune a model with the CLI, then compare tuned, untuned and ONNX Runtime latency at each budget.

All three run in processes confined to the budget's cores (ONNX Runtime with as many intra-op
threads, sequential execution), interleaved round by round so drift on a shared machine cancels.

    python benchmarks/tune_and_compare.py --model zoo:resnet50 --budgets 50%,100% --trials 400 --store DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import resaware
from resaware import confine
from resaware.budget import Budget
from resaware.compiled import run_confined

RESULTS = Path(__file__).parent / "results"

_ORT = """
import json, sys, time, numpy as np, onnxruntime as ort
path, threads, repeat, shape, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
x = {name: np.random.default_rng(0).standard_normal(shape).astype("float32")}
for _ in range(5): s.run(None, x)
t = []
for _ in range(repeat):
    t0 = time.perf_counter(); s.run(None, x); t.append((time.perf_counter() - t0) * 1e3)
print(json.dumps(t))
"""


def ort_times(path: str, cores, repeat: int, spec) -> list[float]:
    cores = sorted(cores)
    done = subprocess.run(
        [sys.executable, "-c", _ORT, path, str(len(cores)), str(repeat), json.dumps(list(spec.shape)), spec.name],
        capture_output=True, text=True, check=True, preexec_fn=lambda: os.sched_setaffinity(0, cores),
        env={**os.environ, **confine.environment(len(cores))},
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--budgets", default="50%,100%")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--store", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    label = args.model.replace("zoo:", "").replace("/", "_")

    start = time.monotonic()
    tuned = subprocess.run(
        [sys.executable, "-m", "resaware.cli", "tune", args.model, "--budgets", args.budgets, "--trials", str(args.trials),
         "--store", args.store, "--json", "--no-progress"], capture_output=True, text=True)  # fmt: skip
    tune_wall = time.monotonic() - start
    if tuned.returncode != 0:
        sys.exit(f"tuning failed:\n{tuned.stderr}")
    report = json.loads(tuned.stdout)

    model = resaware.load_onnx(args.model)
    spec = model.inputs[0]
    rows, lines = [], []
    for budget in Budget.parse_list(args.budgets):
        share = budget.cpu(confine.usable_cores())
        paths = {}
        for kind, store in [("tuned", args.store), ("untuned", os.path.join(args.store, "..", f"empty-{os.getpid()}"))]:
            compiled = resaware.compile(model, budget, store=store)
            paths[kind] = compiled.export(os.path.join(args.store, "..", f"{label}-{kind}-{share.key}.so"))
        samples = {"tuned": [], "untuned": [], "onnxruntime": []}
        for _ in range(args.rounds):  # interleaved: drift hits every contestant alike
            for kind in ("tuned", "untuned"):
                lat = run_confined(
                    paths[kind], share.cores, str(budget), args.repeat, 3, 0.0, [s.to_json() for s in model.inputs]
                )
                samples[kind].append(lat.median_ms)
            samples["onnxruntime"].append(statistics.median(ort_times(model.source, share.cores, args.repeat, spec)))
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append({"budget": str(budget), "cores": share.count, "median_ms": med, "rounds_ms": samples,
                     "tuned_vs_untuned": med["tuned"] / med["untuned"], "tuned_vs_onnxruntime": med["tuned"] / med["onnxruntime"]})  # fmt: skip

    per_budget = {b["budget"]: b for b in report["budgets"]}
    lines.append(f"{label}: resaware tune --budgets {args.budgets} --trials {args.trials}: {tune_wall / 60:.1f} min wall "
                 f"on {report['hardware']}")  # fmt: skip
    lines.append(
        f"{'budget':>7} {'cores':>5} {'trials':>7} {'tune wall':>10} {'tuned ms':>9} {'untuned ms':>11} {'ORT ms':>8} {'tuned/untuned':>14} {'tuned/ORT':>10}"
    )
    for row in rows:
        b = per_budget[row["budget"]]
        m = row["median_ms"]
        lines.append(f"{row['budget']:>7} {row['cores']:>5} {b['trials_total']:>7} {b['wall_s'] / 60:>8.1f}m {m['tuned']:>9.2f} "
                     f"{m['untuned']:>11.2f} {m['onnxruntime']:>8.2f} {row['tuned_vs_untuned']:>14.2f} {row['tuned_vs_onnxruntime']:>10.2f}")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"tune_and_compare_{label}.txt").write_text(table + "\n")
    (RESULTS / f"tune_and_compare_{label}.json").write_text(json.dumps({"model": args.model, "trials": args.trials,
        "tune_wall_s": tune_wall, "rows": rows, "tune_report": report, "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
