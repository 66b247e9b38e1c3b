"""How close to the cores' floating-point peak a model runs: ONNX Runtime, a tuned module and its
kernels against the FMA peak of the budget's cores, measured here, and what a latency goal would need.

The model's work is TVM's FLOP count of the kernels it lowers to: direct convolutions and matmuls as
Relax legalises them, a multiply and an add counted as two. The peak is measured, not looked up: a C
loop of independent fused multiply-adds on full-width vectors (`cc -O3 -march=native`), one copy on
each core of the budget at once, best of three rounds. OpenBLAS's sgemm (numpy, as many threads as
cores) shows how much of that peak a hand-written kernel reaches. From these follows the floor: the
latency at which every FLOP of the model runs at the peak. No schedule of the same computation can go
below it; only an algorithm with fewer multiplications (Winograd, FFT) could. A goal below the floor
is out of reach for any tuner of these kernels.

    python benchmarks/roofline.py --model zoo:resnet50 --budget 100% --store DIR
    python benchmarks/roofline.py --model zoo:squeezenet --budget 50%      # no store: ONNX Runtime only
    python benchmarks/roofline.py --quick --store DIR                      # CI smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import add_output_args, output_dir, result_name, write
from resaware.budget import Budget
from resaware.errors import ResawareError, last_line
from resaware.platform.confine import run_pinned, usable_cores
from resaware.runtime.compiled import child_times

# Independent accumulator chains: enough to cover FMA latency x FMA pipes (4 x 2 on current x86), few
# enough to stay in registers (16 vector registers without AVX-512, 32 with it).
FMA_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __AVX512F__
#define BYTES 64
#define CHAINS 16
#else
#define BYTES 32
#define CHAINS 10
#endif
#define LANES (BYTES / 4)
typedef float vec __attribute__((vector_size(BYTES)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0, elapsed;
    vec acc[CHAINS], mul, add;
    for (int j = 0; j < LANES; j++) { mul[j] = 0.999999f; add[j] = 1e-7f; }  /* converges to 0.1: no denormals */
    for (int i = 0; i < CHAINS; i++) for (int j = 0; j < LANES; j++) acc[i][j] = (float)(i + j);
    long steps = 0, batch = 1 << 20;
    double start = now();
    do {
        for (long n = 0; n < batch; n++) {
#pragma GCC unroll 16
            for (int i = 0; i < CHAINS; i++) acc[i] = acc[i] * mul + add;
        }
        steps += batch;
    } while ((elapsed = now() - start) < seconds);
    float sum = 0;
    for (int i = 0; i < CHAINS; i++) for (int j = 0; j < LANES; j++) sum += acc[i][j];
    printf("%.4f %d %g\n", 2.0 * LANES * CHAINS * steps / elapsed / 1e9, BYTES * 8, sum);
    return 0;
}
"""


def fma_peak(cores: list[int], seconds: float, rounds: int = 3) -> dict:
    """GFLOP/s of the FMA loop run on every core of `cores` at once (summed), best of `rounds`."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise SystemExit("no C compiler (cc) to build the FMA loop with: install gcc or set CC")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "fma.c", Path(tmp) / "fma"
        source.write_text(FMA_LOOP)
        built = subprocess.run([compiler, "-O3", "-march=native", "-ffp-contract=fast", "-o", str(binary), str(source)],
                               capture_output=True, text=True)  # fmt: skip
        if built.returncode != 0:
            raise SystemExit(f"the FMA loop did not compile with {compiler}: {last_line(built.stderr)}")
        best = None
        for _ in range(rounds):
            children = [
                subprocess.Popen(
                    [str(binary), str(seconds)],
                    stdout=subprocess.PIPE,
                    text=True,
                    preexec_fn=functools.partial(os.sched_setaffinity, 0, {core}),
                )
                for core in cores
            ]
            lines = [child.communicate()[0].split() for child in children]
            if any(child.returncode != 0 for child in children):
                raise SystemExit(f"the FMA loop failed: exit codes {[child.returncode for child in children]}")
            per_core = [float(line[0]) for line in lines]
            if best is None or sum(per_core) > sum(best["per_core"]):
                best = {"gflops": sum(per_core), "per_core": per_core, "vector_bits": int(lines[0][1])}
    return best


def _sgemm_child(n: int, seconds: float) -> dict:
    """Best GFLOP/s of an n x n x n float32 matmul in this (confined) process."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    a @ b
    times, end = [], time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return {"n": n, "gflops": 2 * n**3 / min(times) / 1e9}


def sgemm(cores: list[int], n: int, seconds: float) -> dict:
    """OpenBLAS sgemm through numpy in a child confined to `cores`, one thread per core."""
    argv = [sys.executable, __file__, "--sgemm-child", str(n), "--seconds", str(seconds)]
    done = run_pinned(argv, cores, {"OPENBLAS_NUM_THREADS": str(len(cores))})
    try:
        return child_times(done)  # the child's last line, or its last error line
    except ResawareError as error:
        raise SystemExit(f"the sgemm child failed: {error}") from None


def kernels(tasks, stats: dict) -> list[dict]:
    """Each task's work and, where the store holds a record, its best recorded time."""
    rows = []
    for t in tasks:
        best = stats[t.workload_hash].best_s if t.workload_hash in stats else None
        rows.append({"name": t.name, "weight": t.weight, "flops": t.flops, "best_s": best})
    return rows


def table(data: dict, top: int) -> str:
    peak, gemm = data["fma_peak"]["gflops"], data["sgemm"]["gflops"]
    gflop = data["gflop"]

    def row(label: str, ms: float) -> str:
        rate = gflop / ms * 1e3
        return f"{label:<46} {ms:9.2f} {rate:9.1f} {rate / peak:8.0%} {rate / gemm:9.0%}"

    rows = [
        f"roofline: {data['model']} at {data['budget']} ({data['cores']} cores), {data['cpu']}",
        f"work: {gflop:.3f} GFLOP per inference (TVM's count over {data['tasks']} kernels; "
        f"{data['conv_matmul_share']:.1%} of it in convolutions and matmuls)",
        f"FMA peak of these cores: {peak:.1f} GFLOP/s ({data['fma_peak']['vector_bits']}-bit FMAs, "
        f"{' + '.join(f'{g:.1f}' for g in data['fma_peak']['per_core'])} per core, best of 3 rounds); "
        f"OpenBLAS sgemm n={data['sgemm']['n']}: {gemm:.1f} GFLOP/s ({gemm / peak:.0%} of the peak)",
        f"{'':<46} {'ms':>9} {'GFLOP/s':>9} {'of peak':>8} {'of sgemm':>9}",
        row("every FLOP at the FMA peak (the floor)", data["floor_ms"]),
        row(f"ONNX Runtime (median of {data['rounds']} rounds)", data["onnxruntime_ms"]),
    ]
    for goal in data["goals"]:
        rows.append(row(f"goal: {goal:g}x ONNX Runtime", goal * data["onnxruntime_ms"]))
    if data.get("module_ms"):
        rows.append(row(f"resaware module ({data['records']} records)", data["module_ms"]))
        if data["estimate_ms"]:
            rows.append(row("resaware kernels alone, as recorded (estimate)", data["estimate_ms"]))
        rows.append(f"heaviest kernels by recorded time ({data['slot']}; share: of the recorded sum):")
        rows.append(f"  {'kernel':<40} {'calls':>5} {'MFLOP':>8} {'us':>9} {'GFLOP/s':>9} {'of peak':>8} {'share':>6}")
        timed = sorted((k for k in data["kernels"] if k["best_s"]), key=lambda k: -k["weight"] * k["best_s"])
        recorded_s = sum(k["weight"] * k["best_s"] for k in timed)
        for k in timed[:top]:
            rate = k["flops"] / k["best_s"] / 1e9
            rows.append(f"  {k['name'][:40]:<40} {k['weight']:5d} {k['flops'] / 1e6:8.1f} {k['best_s'] * 1e6:9.1f} "
                        f"{rate:9.1f} {rate / peak:8.0%} {k['weight'] * k['best_s'] / recorded_s:6.1%}")  # fmt: skip
        if len(timed) > top:
            rows.append(f"  ({len(timed) - top} more kernels in the JSON)")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="100%")
    parser.add_argument("--store", help="a store tuned at this budget: time its module and rate its kernels")
    parser.add_argument("--goals", default="1,0.8", help="latency goals as multiples of ONNX Runtime's")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved timing rounds of ONNX Runtime and the module"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per FMA-loop and sgemm run")
    parser.add_argument("--top", type=int, default=12, help="kernels in the printed table")
    parser.add_argument("--sgemm-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sgemm_child:
        print(json.dumps(_sgemm_child(args.sgemm_child, args.seconds)))
        return
    try:
        goals = [float(g) for g in args.goals.split(",")]
    except ValueError:
        raise SystemExit(f"--goals {args.goals!r} is not a list of numbers: write e.g. 1,0.8") from None
    if args.quick:
        args.seconds, args.rounds = 0.2, 1
    import resaware
    from resaware.analysis import reference
    from resaware.analysis.bench import interleaved, rel_error
    from resaware.frontend import tasks
    from resaware.frontend.layout import resolve as resolve_layout
    from resaware.platform import hardware
    from resaware.runtime.compiled import run_confined

    out = output_dir(args)
    share = Budget.parse(args.budget).cpu(usable_cores())
    model = resaware.load_onnx(args.model)
    found = tasks.of(model, args.budget)
    total = sum(t.weight * t.flops for t in found)
    heavy = sum(t.weight * t.flops for t in found if "conv" in t.name or "matmul" in t.name or "dense" in t.name)
    peak = fma_peak(share.cores, args.seconds)
    gemm = sgemm(share.cores, 512 if args.quick else 2048, args.seconds)
    timers = {"ort": functools.partial(reference.latency, model, share.cores, args.budget, 10, 2, args.seconds)}
    data = {"model": args.model, "budget": args.budget, "cores": share.count, "cpu": hardware.detect().describe(),
            "tasks": len(found), "gflop": total / 1e9, "conv_matmul_share": heavy / total, "fma_peak": peak,
            "sgemm": gemm, "floor_ms": total / peak["gflops"] / 1e6, "goals": goals, "rounds": args.rounds}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if args.store:
            compiled = resaware.compile(model, args.budget, store=args.store)
            inputs = model.random_inputs(0)
            data["max_rel_error"] = rel_error(compiled(*inputs), reference.outputs(model, inputs))
            path = compiled.export(Path(tmp) / "module.so")
            specs = [s.to_json() for s in model.inputs]
            timers["module"] = functools.partial(
                run_confined, path, share.cores, args.budget, 10, 2, args.seconds, specs
            )
            slot = next((s for s in resaware.Store.open(args.store).slots(hardware.detect(), "llvm")
                         if s.key == compiled.info["tuned_slot"]), None)  # fmt: skip
            if slot is None:
                raise SystemExit(
                    f"store {args.store} has no records for this machine: tune it first, or leave out --store"
                )
            # Compiled in another layout than tasks.of extracted (an older store): its kernels are those.
            if compiled.info["layout"] not in (None, resolve_layout(model.layout, hardware.llvm_target(1))):
                found = tasks.of(resaware.frontend.model.resolve(model, layout=compiled.info["layout"]), args.budget)
            data.update(slot=slot.key, records=compiled.info["records"], kernels=kernels(found, slot.stats()))
            recorded = [k["weight"] * k["best_s"] for k in data["kernels"] if k["best_s"]]
            data["estimate_ms"] = sum(recorded) * 1e3 if len(recorded) == len(found) else None
        samples = interleaved(timers, args.rounds)
    data["onnxruntime_ms"] = statistics.median(x.median_ms for x in samples["ort"])
    if "module" in samples:
        data["module_ms"] = statistics.median(x.median_ms for x in samples["module"])
    text = table(data, args.top)
    print(text)
    stem = result_name("roofline", args.model, args.budget)
    write(out, stem, data, text, "python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
