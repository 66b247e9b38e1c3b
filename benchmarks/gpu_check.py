"""The GPU check: a fixed set of candidates for a model's heaviest tasks, measured at MPS shares.

Two halves, so the GPU machine only measures:

    # here (no GPU needed; nvcc builds sm_90 kernels):
    python benchmarks/gpu_check.py build --model zoo:resnet50 --top 6 --per-task 40 --dir .gpu/resnet50
    python benchmarks/gpu_check.py bundle --into .gpu     # tvm_ffi for the GPU's Python + runtime libs
    # on the GPU machine (the TVM runtime alone, ~10 MB with tvm_ffi):
    PYTHONPATH=.gpu/site:. RESAWARE_TVM_RUNTIME=.gpu/lib \\
        python3 benchmarks/gpu_check.py measure .gpu/resnet50 --budgets 25%,50%,100% --out $OUT

`measure` times every candidate at every budget (each budget an MPS client of a private daemon at its
percentage), picks each task's fastest per budget, re-times the
picks at every budget in interleaved rounds, and prints the tuned-at x run-at matrix: the weighted
sum of the picked kernels' times (the heaviest tasks only, not the whole model), with TVM's dlight
default schedules as the untuned row. Then it measures the 25% budget again with 4 MPS clients at
once to see what spatial sharing does to throughput and to the picks. The timings fold into a store
with `resaware.tuning.candidates.fold`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from common import write
from resaware.budget import Budget
from resaware.runtime import measure_built


def _median(result: dict) -> float | None:
    secs = result.get("secs")
    return statistics.median(secs) if secs else None


def picks(manifest: dict, timings: dict) -> dict[str, dict[int, str]]:
    """Per budget, each task's fastest tuned candidate (the dlight defaults are not candidates)."""
    chosen = {}
    for budget, entry in timings["budgets"].items():
        best: dict[int, tuple[float, str]] = {}
        for c in manifest["candidates"]:
            t = _median(entry["results"].get(c["id"], {}))
            if c["record"] is not None and t is not None and (c["task"] not in best or t < best[c["task"]][0]):
                best[c["task"]] = (t, c["id"])
        chosen[budget] = {task: cid for task, (_, cid) in best.items()}
    return chosen


def matrix(manifest: dict, rows: dict[str, dict[int, str]], rounds: list[dict]) -> dict[str, dict[str, float]]:
    """Weighted sum (ms) of each row's kernels at each run-at budget: the median over rounds per kernel."""
    weights = {i: t["weight"] for i, t in enumerate(manifest["tasks"])}
    cells: dict[str, dict[str, float]] = {}
    for row, chosen in rows.items():
        cells[row] = {}
        for budget in rounds[0]["budgets"]:
            total = 0.0 if len(chosen) == len(weights) else float("nan")  # a task with no timed candidate
            for task, cid in chosen.items():
                samples = [_median(r["budgets"][budget]["results"][cid]) for r in rounds]
                samples = [s for s in samples if s is not None]
                total += weights[task] * statistics.median(samples) if samples else float("nan")
            cells[row][budget] = total * 1e3
    return cells


def table(cells: dict[str, dict[str, float]]) -> str:
    """The matrix as text, each cell also as a ratio to the best in its column."""
    columns = list(next(iter(cells.values())))
    best = {c: min((v[c] for v in cells.values() if v[c] == v[c]), default=float("nan")) for c in columns}
    corner = "tuned at \\ run at"
    lines = [f"{corner:<22}" + "".join(f"{c:>20}" for c in columns)]
    for row, values in cells.items():
        lines.append(f"{row:<22}" + "".join(f"{values[c]:>11.4f} ms {values[c] / best[c]:>5.2f}x" for c in columns))
    return "\n".join(lines)


def _facts() -> dict:
    import subprocess

    from resaware.platform import mps

    facts = {"mps_control": mps.binary()}
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)  # fmt: skip
        facts["nvidia_smi"] = done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as error:
        facts["nvidia_smi"] = f"unavailable: {error}"
    return facts


def measure(args) -> None:
    """The GPU half (see the module's docstring)."""
    directory = Path(args.dir)
    out = Path(args.out) if args.out else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((directory / measure_built.MANIFEST).read_text())
    budgets = [str(b) for b in Budget.parse_list(args.budgets)]
    facts = _facts()
    print(json.dumps(facts), flush=True)
    started = time.monotonic()
    common = {"repeat": args.repeat, "min_repeat_ms": args.min_repeat_ms, "sharing": args.sharing}
    timings = measure_built.measure(directory, budgets, **common)
    search_s = time.monotonic() - started
    budgets = [b for b in budgets if b in timings["budgets"]]  # without MPS only 100% is measured
    shutil.copy(directory / measure_built.TIMINGS, out / "gpu_timings.json")
    for budget, entry in timings["budgets"].items():
        ok = sum(1 for r in entry["results"].values() if "secs" in r)
        print(f"{budget} ({entry['key']}): {ok}/{len(entry['results'])} timed in {entry['seconds']} s", flush=True)
    chosen = picks(manifest, timings)
    rows = {f"tuned at {b}": chosen[b] for b in budgets}
    if manifest.get("rounds"):  # combined rounds: what round 1 alone would have picked, for comparison
        first = picks({**manifest, "candidates": [c for c in manifest["candidates"] if c["id"].startswith("r1-")]},
                      timings)  # fmt: skip
        rows.update({f"{b}, round 1 only": first[b] for b in budgets})
    defaults = {c["task"]: c["id"] for c in manifest["candidates"] if c["record"] is None}
    if defaults:
        rows["dlight default"] = defaults
    confirm = sorted({cid for row in rows.values() for cid in row.values()})
    rounds = []
    for r in range(args.rounds):  # interleaved: the budgets' order turns each round
        order = budgets[r % len(budgets) :] + budgets[: r % len(budgets)]
        rounds.append(measure_built.measure(directory, order, only=confirm, output=f"confirm{r}.json", **common))
    cells = matrix(manifest, rows, rounds)
    text = table(cells)
    print(text, flush=True)
    result = {"facts": facts, "sharing": timings["sharing"], "hardware": timings["hardware"],
              "candidates": len(manifest["candidates"]), "tasks": manifest["tasks"] and
              [{k: t[k] for k in ("name", "weight", "flops")} for t in manifest["tasks"]],
              "search_seconds": round(search_s, 1), "picks": chosen, "matrix_ms": cells}  # fmt: skip
    if args.clients > 1:
        low = min(budgets, key=lambda b: Budget.parse(b).fraction)
        started = time.monotonic()
        shared = measure_built.measure(directory, [low], clients=args.clients, output="shared.json", **common)
        alone = timings["budgets"][low]
        together = shared["budgets"][low]
        same = picks(manifest, shared)[low]
        ratios = [
            _median(together["results"][cid]) / _median(alone["results"][cid])
            for cid in alone["results"]
            if _median(alone["results"][cid]) and _median(together["results"].get(cid, {}))
        ]
        result["spatial_sharing"] = {
            "budget": low, "clients": together["clients"], "seconds_alone": alone["seconds"],
            "seconds_together": together["seconds"], "throughput": alone["seconds"] / together["seconds"],
            "median_time_ratio_together_over_alone": statistics.median(ratios) if ratios else None,
            "same_pick_tasks": sum(1 for t, c in same.items() if chosen[low].get(t) == c), "tasks": len(same),
            "wall_seconds": round(time.monotonic() - started, 1),
        }  # fmt: skip
        shared_facts = result["spatial_sharing"]
        ratio = shared_facts["median_time_ratio_together_over_alone"]
        text += (
            f"\n\nspatial sharing at {low}: {shared_facts['clients']} clients measured every candidate in "
            f"{shared_facts['seconds_together']} s, one alone in {shared_facts['seconds_alone']} s "
            f"({shared_facts['throughput']:.2f}x throughput); median kernel time together/alone "
            f"{ratio if ratio is None else round(ratio, 3)}; same pick in {shared_facts['same_pick_tasks']}/"
            f"{shared_facts['tasks']} tasks"
        )
        print(text.splitlines()[-1], flush=True)
    command = "python benchmarks/gpu_check.py measure " + " ".join(sys.argv[2:])
    write(out, "gpu_check", result, text, command)


def build(args) -> None:
    """The build half: sample and build the candidates (no GPU needed)."""
    from resaware.tuning import candidates

    guide = None
    if args.guide_store:  # the next round: the evolutionary search of a measured budget's cost model
        from resaware.store import Store

        wanted = f"mps-{Budget.parse(args.guide_budget).mps_percentage}"
        found = [s for s in Store.open(args.guide_store).slots(kind=args.kind) if s.key == wanted]
        if len(found) != 1:
            raise SystemExit(f"{args.guide_store} holds {len(found)} {wanted} budgets: give a store with one")
        (guide,) = found
    started = time.monotonic()
    manifest = candidates.build(args.model, args.kind, args.dir, per_task=args.per_task, top=args.top,
                                arch=args.arch, seed=args.seed, defaults=guide is None, guide=guide)  # fmt: skip
    size = sum(f.stat().st_size for f in Path(args.dir).iterdir())
    print(f"built {len(manifest['candidates'])} candidates of {len(manifest['tasks'])} tasks into {args.dir} "
          f"({size / 2**20:.1f} MiB) in {time.monotonic() - started:.0f} s")  # fmt: skip


def combine(args) -> None:
    """One candidate directory from several rounds (same model and tasks), ids prefixed by round."""
    into = Path(args.into)
    into.mkdir(parents=True, exist_ok=False)
    merged = None
    for number, directory in enumerate(map(Path, args.dirs), 1):
        manifest = json.loads((directory / measure_built.MANIFEST).read_text())
        if merged is None:
            merged = {**manifest, "candidates": [], "rounds": []}
        elif [t["workload"] for t in manifest["tasks"]] != [t["workload"] for t in merged["tasks"]]:
            raise SystemExit(f"{directory} holds other tasks than {args.dirs[0]}: rounds of one model only")
        merged["rounds"].append(str(directory))
        for candidate in manifest["candidates"]:
            cid = f"r{number}-{candidate['id']}"
            shutil.copy(directory / candidate["file"], into / f"{cid}.so")
            merged["candidates"].append({**candidate, "id": cid, "file": f"{cid}.so"})
    (into / measure_built.MANIFEST).write_text(json.dumps(merged, indent=1) + "\n")
    print(f"combined {len(merged['candidates'])} candidates of {len(args.dirs)} rounds into {into}")


def bundle(args) -> None:
    """What the GPU machine needs beside the repo: tvm_ffi built for its Python, TVM's runtime libraries."""
    import importlib.metadata
    import importlib.util
    import subprocess
    import zipfile

    into = Path(args.into)
    site, lib = into / "site", into / "lib"
    for path in (site, lib):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    wheels = into / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
         args.python, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "-d", str(wheels),
         f"apache-tvm-ffi=={importlib.metadata.version('apache-tvm-ffi')}"], check=True,
    )  # fmt: skip
    tag = "cp" + args.python.replace(".", "")
    (wheel,) = [w for w in wheels.glob("apache_tvm_ffi-*.whl") if f"-{tag}-" in w.name]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site, [n for n in z.namelist() if n.startswith("tvm_ffi/") and "/include/" not in n])
    tvm_lib = Path(importlib.util.find_spec("tvm").origin).parent / "lib"
    for name in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        shutil.copy(tvm_lib / name, lib / name)
    for cudart in measure_built._cudart_candidates(tvm_lib):
        if cudart.exists():
            shutil.copy(cudart, lib / "libcudart.so.13")
            break
    size = sum(f.stat().st_size for f in into.rglob("*") if f.is_file() and "wheels" not in f.parts)
    print(f"bundle in {into}: {size / 2**20:.1f} MiB (site/: tvm_ffi for Python {args.python}; lib/: runtime)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="half", required=True)
    p = sub.add_parser("build", help="sample and build candidates here")
    p.add_argument("--model", default="zoo:resnet50")
    p.add_argument("--kind", default="cuda", choices=["cuda", "llvm"])
    p.add_argument("--arch", help="CUDA arch (default: the GPU's, else sm_90)")
    p.add_argument("--top", type=int, default=6, help="heaviest tasks")
    p.add_argument("--per-task", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", required=True)
    p.add_argument("--guide-store", help="a store with measured records: build the search's next picks from it")
    p.add_argument("--guide-budget", default="100%", help="whose cost model guides (with --guide-store)")
    p = sub.add_parser("combine", help="merge candidate directories of several rounds into one")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--into", required=True)
    p = sub.add_parser("bundle", help="tvm_ffi and the runtime libraries for the GPU machine")
    p.add_argument("--into", required=True)
    p.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    p = sub.add_parser("measure", help="measure on the GPU machine and print the matrix")
    p.add_argument("dir")
    p.add_argument("--budgets", default="25%,50%,100%")
    p.add_argument("--rounds", type=int, default=3, choices=range(1, 21), metavar="1..20")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--min-repeat-ms", type=int, default=20)
    p.add_argument(
        "--clients", type=int, default=4, help="MPS clients for the spatial-sharing run at the lowest budget"
    )
    p.add_argument("--sharing", default="auto", choices=["auto", "mps", "none"])
    p.add_argument("--out", help="where gpu_check.json/.md go (default: here)")
    args = parser.parse_args()
    {"build": build, "combine": combine, "bundle": bundle, "measure": measure}[args.half](args)


if __name__ == "__main__":
    main()
