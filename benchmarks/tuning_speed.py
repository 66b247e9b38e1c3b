"""The tuning race: stock MetaSchedule as a new user gets it, as an expert sets it up, and resaware.

Same model, target, trial count and seed, one contestant after the other, each in its own child
process (so none inherits another's warm pools or caches):

  stock defaults  `tune_relax` with its defaults: LocalBuilder (30 s timeout, fresh pool per batch),
                  64 trials per batch, a target without `mcpu` (generic x86-64);
  stock expert    `tune_relax` with the host's `mcpu`, a lean build function (no tensor-intrinsic
                  import) and room in the builder's timeout, resaware's samples and batch size, timed
                  back to back as MetaSchedule does: the fair baseline;
  resaware        `resaware.tune` at the same budget, in its default layout (NHWC convolutions on
                  CPU, `resaware.frontend.layout`; both stock contestants tune the model as imported, NCHW),
                  timing with the weights flushed (`measure.Timing`): its estimates read higher than
                  a warm-timed contestant's for the same kernels, so compare modules, not estimates;
  resaware x2     `resaware.tune(..., concurrency=2)`: two clients, each measuring on its own partition
                  (where the budget leaves room for two), the tasks sharded between them.

Each records MetaSchedule's estimate after every batch (sum of task weight x best measured task
latency), its wall time split by MetaSchedule's profiler into search / cost model / build / run /
other, and trials per minute. Then, at a few points of each run, the model is compiled from the
records committed so far (`resaware.compile`, the same way for everyone) and all these modules are
timed, interleaved over rounds. Time-to-quality = seconds until a contestant's module ran within 5%
of the best final module. (Final modules compile from the whole store: resaware's includes the cost
model it keeps, which picks schedules for kernels still without records; stock keeps none.)

    python benchmarks/tuning_speed.py                  # SqueezeNet at 100%, 256 trials, 15 min cap each
    python benchmarks/tuning_speed.py --budget 50% --contestants expert,resaware,resaware-k2
    python benchmarks/tuning_speed.py --quick          # CI smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

import resaware
from common import add_output_args, output_dir, write
from resaware.analysis.bench import TOLERANCE
from resaware.analysis.plot import curves
from resaware.budget import Budget
from resaware.frontend.tasks import lower
from resaware.platform import confine, hardware
from resaware.store import Store, mean_seconds  # mean_seconds: a record's mean, as the tuner takes it
from resaware.tuning.measure import Timing
from resaware.tuning.search import batch_size, phases  # the same batch size and phases
from side_by_side import SideBySide

CONTESTANTS = {"defaults": "stock defaults", "expert": "stock expert", "resaware": "resaware",
               "resaware-k2": "resaware x2"}  # fmt: skip
QUALITY = 1.05  # within 5% of the best final module


# ---------------------------------------------------------------- child: one contestant


def _lean_build(mod, target, _params):
    """What an expert passes as LocalBuilder's f_build: TVM's default build minus the import of every
    backend's tensor intrinsics (~40 s per fresh worker here; LLVM schedules without VNNI use none)."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


@derived_object
class _Curve(PyMeasureCallback):
    """Streams (seconds, trials, estimated latency) after every batch; ends tuning at the cap."""

    def __init__(self, stream, start: float, cap_s: float):
        super().__init__()
        self.stream, self.start, self.cap_s = stream, start, cap_s
        self.best: dict[int, float] = {}
        self.trials = 0
        self.capped = False

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        for built, ran in zip(builder_results, runner_results):
            mean = mean_seconds(ran.run_secs) if built.error_msg is None and ran.error_msg is None else None
            if mean is not None:
                self.best[task_id] = min(self.best.get(task_id, mean), mean)
        self.trials += len(runner_results)
        weights = [float(t.task_weight) for t in task_scheduler.tasks_]
        estimate = sum(w * self.best[i] for i, w in enumerate(weights)) if len(self.best) == len(weights) else None
        _emit(self.stream, point=[time.monotonic() - self.start, self.trials, estimate])
        if time.monotonic() - self.start >= self.cap_s:
            self.capped = True
            raise TimeoutError("race cap reached")  # the batch is already in the database


def _emit(stream, **item) -> None:
    stream.write(json.dumps(item) + "\n")
    stream.flush()


def _stock(model, expert: bool, cores: int, trials: int, seed: int, cap_s: float, work_dir: str, stream) -> dict:
    if expert:
        target = hardware.llvm_target(cores)
        n_tasks = len(ms.relax_integration.extract_tasks(lower(model, target, "NCHW")[0], target))  # not timed
        start = time.monotonic()
        mod, _ = lower(model, target, "NCHW")  # stock tunes the model as imported
        options = dict(
            builder=ms.builder.LocalBuilder(f_build=_lean_build, max_workers=cores, timeout_sec=600),
            runner=ms.runner.LocalRunner(evaluator_config=Timing(flush=False).evaluator()),  # stock times warm
            # Every task gets a batch before any gets two: 64 per batch on 30 tasks and 256 trials would
            # tune four kernels and leave the rest untouched.
            num_trials_per_iter=batch_size(trials, n_tasks),
        )
    else:
        target = tvm.target.Target({"kind": "llvm", "num-cores": cores})
        start = time.monotonic()
        mod, _ = lower(model, target, "NCHW")
        options = {}
    curve = _Curve(stream, start, cap_s)
    try:
        ms.relax_integration.tune_relax(
            mod, None, target, work_dir, max_trials_global=trials, seed=seed,
            measure_callbacks=[*ms.MeasureCallback.create("default"), curve], **options,
        )  # fmt: skip
    except Exception:
        if not curve.capped:
            raise
    wall = time.monotonic() - start
    return {"stopped_by": "cap" if curve.capped else "trials", "trials": curve.trials, "wall_s": wall}


def _resaware(model, budget: str, trials: int, seed: int, cap_s: float, store: str, stream, concurrency: int) -> dict:
    start = time.monotonic()
    report = resaware.tune(model, budget, trials, store=store, seed=seed, time_limit=cap_s, progress=False,
                           concurrency=concurrency)  # fmt: skip
    (result,) = report.budgets
    # History is timed from the budget's start; shift it by what came before (store, hardware).
    offset = max(0.0, time.monotonic() - start - result.wall_s)
    for seconds, done, estimate in result.history:
        _emit(stream, point=[seconds + offset, done, estimate])
    wall = time.monotonic() - start
    stopped_by = "cap" if result.stopped_by == "time" else result.stopped_by
    # Each client profiles itself (in its own process when there are several): their phases, summed.
    phases = {k: sum(c.phases[k] for c in result.clients) for k in result.clients[0].phases}
    where = [{"measure": c.cores, "search_build": c.tuner_cores, "trials": c.trials, "wall_s": c.wall_s,
              "measure_rate": c.measure_rate} for c in result.clients]  # fmt: skip
    return {"stopped_by": stopped_by, "trials": result.trials_run, "wall_s": wall, "phases": phases,
            "clients": where, "measure_rate": result.measure_rate,
            "verification": [v.ratio for v in result.verification]}  # fmt: skip


def _stock_work_dir(store: str, share) -> str:
    """The store slot resaware itself would use for this budget, so `resaware.compile` finds stock's records."""
    target = hardware.target_json(hardware.llvm_target(share.count))
    return str(Store.open(store).slot(hardware.detect(), "llvm", share.key, share.fraction, target).path)


def run_child(args) -> None:
    model = resaware.load_onnx(args.model, layout=args.layout if args.child.startswith("resaware") else "auto")
    share = Budget.parse(args.budget).cpu(confine.usable_cores())
    with open(args.stream, "a") as stream, ms.Profiler() as profiler:
        if args.child.startswith("resaware"):
            k = 2 if args.child == "resaware-k2" else 1
            done = _resaware(model, args.budget, args.trials, args.seed, args.cap, args.store, stream, k)
        else:
            done = _stock(model, args.child == "expert", share.count, args.trials, args.seed, args.cap,
                          _stock_work_dir(args.store, share), stream)  # fmt: skip
        _emit(stream, done={**done, "profile": {str(k): float(v) for k, v in profiler.get().items()}})


# ---------------------------------------------------------------- parent: the race


def compile_layout(name: str, layout: str = "auto") -> str:
    """The layout to compile contestant `name`'s records in: stock tuned the model as imported (so its
    kernels without records get NCHW defaults too), resaware in the one it tuned in (`--layout`)."""
    return layout if name.startswith("resaware") else "NCHW"


def _settings(args, cap: float, name: str) -> dict:
    settings = {"model": args.model, "budget": args.budget, "trials": args.trials, "seed": args.seed, "cap": cap}
    # resaware's own layout became NHWC, its timing flushed, and its measuring overlapped with the search
    # (at budgets under 100 %), after runs kept from before them: those are not reused or resumed.
    if not name.startswith("resaware"):
        return settings
    settings = {**settings, "layout": args.layout, "caches": "flushed"}
    return {**settings, "measuring": "background"} if Budget.parse(args.budget).fraction < 1 else settings


def _read(stream: Path) -> list[dict]:
    return [json.loads(line) for line in stream.read_text().splitlines()] if stream.exists() else []


def _segments(items: list[dict]) -> list[tuple[dict, list[dict]]]:
    """A stream split into its runs: (settings, the items that run wrote), oldest first."""
    runs = []
    for item in items:
        if "settings" in item:
            runs.append((item["settings"], []))
        elif runs:
            runs[-1][1].append(item)
    return runs


def _finished(runs: list, settings: dict) -> bool:
    """Whether the last run in a contestant's stream finished with these settings."""
    return bool(runs) and runs[-1][0] == settings and any("done" in item for item in runs[-1][1])


def _resumable(name: str, runs: list, settings: dict) -> float | None:
    """The wall seconds tuned so far, if `name` can go on from its finished runs to `settings`' longer
    cap: resaware only, whose store keeps its cost model (stock's lives in the tuner and dies with it)."""
    if not name.startswith("resaware") or not runs or not all(any("done" in i for i in items) for _, items in runs):
        return None
    last = runs[-1][0]
    if {**last, "cap": settings["cap"]} != settings or last["cap"] >= settings["cap"]:
        return None
    return sum(i["done"]["wall_s"] for _, items in runs for i in items if "done" in i)


def _merged(dones: list[dict]) -> dict:
    """One contestant's numbers from its runs: trials, wall time and phases summed, the rest from the last."""
    if len(dones) == 1:
        return dones[0]
    merged = {**dones[-1], "trials": sum(d["trials"] for d in dones), "wall_s": sum(d["wall_s"] for d in dones),
              "resumed_at": [sum(d["wall_s"] for d in dones[:i]) for i in range(1, len(dones))]}  # fmt: skip
    if all(d.get("phases") for d in dones):
        merged["phases"] = {k: sum(d["phases"][k] for d in dones) for k in dones[-1]["phases"]}
    if all(d.get("measure_rate") for d in dones):  # candidates per second of measuring, over all runs
        merged["measure_rate"] = merged["trials"] / sum(d["trials"] / d["measure_rate"] for d in dones)
    return merged


def race_one(name: str, args, work: Path, cap: float) -> dict:
    """Tune one contestant for `cap` wall seconds in a child process; its numbers. A run finished in
    `work` with the same settings is reused; a resaware run finished there with a shorter cap goes on
    from its store (cost model and records) for the rest of the time."""
    store, stream, log_path = work / name, work / f"{name}.jsonl", work / f"{name}.log"
    killed = False
    settings = _settings(args, cap, name)
    runs = _segments(_read(stream))
    if _finished(runs, settings):
        print(f"{CONTESTANTS[name]}: reusing the finished run in {work}", flush=True)
    else:
        offset = _resumable(name, runs, settings)
        if offset is None:
            offset = 0.0
            shutil.rmtree(store, ignore_errors=True)
            stream.write_text("")
        elif offset >= cap:  # the last run overshot its cap by a batch: nothing is left of this one
            raise SystemExit(f"{name} in {work} has tuned {offset:.0f} s already, not under the {cap:.0f} s "
                             "asked: ask for more minutes")  # fmt: skip
        with open(stream, "a") as f:
            f.write(json.dumps({"settings": settings}) + "\n")
        argv = [sys.executable, __file__, "--child", name, "--model", args.model, "--budget", args.budget,
                "--trials", str(args.trials), "--seed", str(args.seed), "--cap", str(cap - offset),
                "--store", str(store), "--stream", str(stream), "--layout", args.layout]  # fmt: skip
        resumed = f", going on from {offset:.0f} s" if offset else ""
        print(f"{CONTESTANTS[name]}: tuning{resumed} (MetaSchedule's log: {log_path})", flush=True)
        start = time.monotonic()
        with open(log_path, "a" if offset else "w") as log:
            # Its own process group: killing it must take the builder's and runner's workers with it.
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                # The cap is checked after each batch; a batch of timed-out builds can outlast it.
                rc = child.wait(timeout=(cap - offset) * 1.5 + 120)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                rc, killed = child.wait(), True
            except BaseException:  # interrupted: leave no contestant tuning behind
                os.killpg(child.pid, signal.SIGKILL)
                raise
        wall = offset + time.monotonic() - start
        if not killed and not _finished(_segments(_read(stream)), settings):
            sys.stdout.write(log_path.read_text()[-4000:])
            raise SystemExit(f"contestant {name} failed (exit {rc}); the end of its log is above")
    curve, dones = [], []
    for _, items in _segments(_read(stream)):
        before = sum(d["wall_s"] for d in dones)  # a resumed run's clock starts where the last one ended
        curve += [[item["point"][0] + before, *item["point"][1:]] for item in items if "point" in item]
        dones += [item["done"] for item in items if "done" in item]
    if killed:
        dones.append({"stopped_by": "killed at cap", "trials": (curve[-1][1] if curve else 0) - sum(d["trials"] for d in dones),
                      "wall_s": wall - sum(d["wall_s"] for d in dones)})  # fmt: skip
    done = _merged(dones)
    split = done.get("phases") or (phases(done["profile"], done["wall_s"]) if "profile" in done else None)
    clients = done.get("clients") or [{"measure": "all", "search_build": "all", "trials": done["trials"]}]
    rate = done.get("measure_rate") or (done["trials"] / split["run"] if split and split["run"] > 0 else None)
    return {
        "label": CONTESTANTS[name], "stopped_by": done["stopped_by"], "trials": done["trials"],
        "wall_s": done["wall_s"], "trials_per_min": done["trials"] / done["wall_s"] * 60, "cap_s": cap,
        "resumed_at": done.get("resumed_at", []),
        "phases": split, "clients": clients, "concurrency": len(clients), "measure_rate": rate,
        "verification": done.get("verification"), "curve": curve,
        "final_estimate_ms": next((p[2] * 1e3 for p in reversed(curve) if p[2] is not None), None),
        "store": str(store),
    }  # fmt: skip


def checkpoints(curve: list, wall_s: float, trials: int, n: int) -> list[tuple[float, int]]:
    """(seconds, trials) where the contestant's module is timed: the last curve point before each
    n-th of its wall time, and the end of its run."""
    points = {}
    for i in range(1, n):
        before = [p for p in curve if p[0] <= wall_s * i / n]
        if before and before[-1][1] < trials:
            points[before[-1][1]] = before[-1][0]
    return [(seconds, done) for done, seconds in points.items()] + [(wall_s, trials)]


def snapshot(store: Path, records: int, dest: Path) -> Path:
    """The store as it stood after its first `records` measurements (the record file is in commit
    order), without the cost model, which was trained on the later ones."""
    shutil.copytree(store, dest, ignore=shutil.ignore_patterns("cost_model.tar", "logs", ".lock"))
    for path in dest.rglob("database_tuning_record.json"):
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:records]))
    return dest


def score(results: dict[str, dict], args, work: Path) -> None:
    """Compile every contestant's checkpoints the same way and time them all, interleaved over rounds;
    adds `quality` [(seconds, trials, median ms)] and the final latency and output error."""
    model = resaware.load_onnx(args.model)
    arms = SideBySide(model, args.budget, args.repeat, TOLERANCE)
    for name, r in results.items():
        points = checkpoints(r["curve"], r["wall_s"], r["trials"], args.checkpoints)
        for seconds, done in points:
            final = (seconds, done) == points[-1]
            store = (
                Path(r["store"]) if final else snapshot(Path(r["store"]), done, work / "snapshots" / f"{name}-{done}")
            )
            compiled = resaware.compile(model, args.budget, store=store, layout=compile_layout(name, args.layout))
            path = compiled.export(work / "snapshots" / f"{name}-{done}.so")
            error = arms.module((name, seconds, done), path, check=final)  # as compared before: the final module
            if final:
                r["max_rel_error"] = error
    print(f"timing {len(arms.timers)} modules at {args.budget} over {args.rounds} rounds", flush=True)
    samples, _ = arms.run(args.rounds, probe=False)
    for name, r in results.items():
        r["quality"] = [[s, n, statistics.median(x.median_ms for x in samples[who, s, n])]
                        for who, s, n in arms.timers if who == name]  # fmt: skip
        r["final_latency_ms"] = r["quality"][-1][2]


def time_to_quality(quality: list, target_ms: float) -> float | None:
    return next((s for s, _, ms in quality if ms <= target_ms), None)


def table(results: dict[str, dict], args, cores: int, target_ms: float) -> str:
    lines = [
        f"tuning race: {args.model} at {args.budget} ({cores} cores), {args.trials} trials, seed {args.seed}, "
        f"cap {args.cap:.0f} s ({args.defaults_cap:.0f} s for the defaults)",
        f"{'contestant':<15} {'clients':>7} {'trials':>6} {'wall s':>7} {'trials/min':>10} {'meas./s':>7} "
        f"{'search':>7} {'cost m.':>7} {'build':>7} {'run':>7} {'other':>7} {'est. ms':>8} {'final ms':>9} "
        f"{'to quality s':>12}  stopped by",
    ]
    for r in results.values():
        p = r["phases"] or {}
        cells = " ".join(
            f"{p[k]:>7.0f}" if k in p else f"{'-':>7}" for k in ("search", "cost_model", "build", "run", "other")
        )
        est = f"{r['final_estimate_ms']:.2f}" if r["final_estimate_ms"] is not None else "-"
        ttq = f"{r['time_to_quality_s']:.0f}" if r["time_to_quality_s"] is not None else "never"
        rate = f"{r['measure_rate']:.2f}" if r.get("measure_rate") else "-"
        lines.append(f"{r['label']:<15} {r.get('concurrency', 1):>7} {r['trials']:>6} {r['wall_s']:>7.0f} "
                     f"{r['trials_per_min']:>10.1f} {rate:>7} {cells} {est:>8} {r['final_latency_ms']:>9.2f} "
                     f"{ttq:>12}  {r['stopped_by']}")  # fmt: skip
    lines += [
        f"final ms: the module compiled from the contestant's records, timed at {args.budget} (median of "
        f"{args.rounds} interleaved rounds); est. ms: MetaSchedule's estimate from its own measurements",
        f"to quality: seconds until a module compiled from the records so far ran within 5% of the best "
        f"final module ({target_ms:.2f} ms); modules timed at {args.checkpoints} points of each run",
        "meas./s: candidates measured per second of measuring, summed over the clients measuring at once; "
        "phases are seconds summed over clients",
    ]
    for r in results.values():
        if any(isinstance(c["measure"], list) for c in r["clients"]):
            where = "; ".join(f"measures on {c['measure']}, searches and builds on {c['search_build']}"
                              for c in r["clients"])  # fmt: skip
            lines.append(f"where {r['label']} ran: {where}")
    expert, ours, ours2 = results.get("expert"), results.get("resaware"), results.get("resaware-k2")
    if expert and ours:
        if ours["time_to_quality_s"] and expert["time_to_quality_s"]:
            speedup = expert["time_to_quality_s"] / ours["time_to_quality_s"]
            lines.append(f"time-to-quality, stock expert / resaware: {speedup:.2f}x")
        lines.append(f"trials per minute, resaware / stock expert: {ours['trials_per_min'] / expert['trials_per_min']:.2f}x; "
                     f"final latency, resaware / stock expert: {ours['final_latency_ms'] / expert['final_latency_ms']:.2f}x")  # fmt: skip
    if ours and ours2:
        if ours["measure_rate"] and ours2["measure_rate"]:
            lines.append(f"measuring rate, 2 clients / 1: {ours2['measure_rate'] / ours['measure_rate']:.2f}x")
        lines.append(f"trials per minute, 2 clients / 1: {ours2['trials_per_min'] / ours['trials_per_min']:.2f}x")
        if ours["time_to_quality_s"] and ours2["time_to_quality_s"]:
            lines.append(
                f"time-to-quality, 1 client / 2: {ours['time_to_quality_s'] / ours2['time_to_quality_s']:.2f}x"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--budget", default="100%")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap", type=float, default=900.0, help="wall seconds per contestant")
    parser.add_argument("--defaults-cap", type=float, default=300.0, help="wall seconds for the stock defaults")
    parser.add_argument("--contestants", help="default: defaults,expert,resaware (--quick: expert,resaware)")
    parser.add_argument("--layout", default="auto", help="resaware's convolution layout (stock tunes NCHW)")
    parser.add_argument("--checkpoints", type=int, default=6, help="modules timed per contestant's run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per module and round (at least 1 s)")
    parser.add_argument("--keep", help="keep stores and logs here; a contestant finished there is reused")
    parser.add_argument("--child", choices=list(CONTESTANTS), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(args)
    if args.quick:
        # The stock defaults need minutes per batch here (every build times out): left out of the smoke run.
        args.trials, args.cap, args.defaults_cap, args.checkpoints, args.rounds = 8, 60.0, 60.0, 2, 1
        args.contestants = args.contestants or "expert,resaware"
    names = (args.contestants or ",".join(CONTESTANTS)).split(",")
    if unknown := set(names) - set(CONTESTANTS):
        parser.error(f"unknown contestants {sorted(unknown)}: choose from {', '.join(CONTESTANTS)}")
    out = output_dir(args)
    cores = Budget.parse(args.budget).cpu(confine.usable_cores()).count
    with tempfile.TemporaryDirectory(prefix="resaware-race-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work / "snapshots", ignore_errors=True)
        caps = {name: args.defaults_cap if name == "defaults" else args.cap for name in names}
        results = {name: race_one(name, args, work, caps[name]) for name in names}
        score(results, args, work)
    target_ms = min(r["final_latency_ms"] for r in results.values()) * QUALITY
    for r in results.values():
        r["time_to_quality_s"] = time_to_quality(r["quality"], target_ms)
    text = table(results, args, cores, target_ms)
    print(text)
    data = {"model": args.model, "budget": args.budget, "cores": cores, "trials": args.trials, "seed": args.seed,
            "cap_s": args.cap, "defaults_cap_s": args.defaults_cap, "target_ms": target_ms, "contestants": results,
            "cpu": hardware.detect().describe(), "tvm": tvm.__version__}  # fmt: skip
    # The figures at 100% keep their name; other budgets get their own files beside them.
    stem = (
        "tuning_speed"
        if Budget.parse(args.budget).fraction == 1.0
        else f"tuning_speed-{Budget.parse(args.budget).percent:g}pct"
    )
    write(out, stem, data, text, "python " + " ".join(sys.argv))
    series = {}
    for r in results.values():
        series[f"{r['label']}: module"] = [(s, ms) for s, _, ms in r["quality"]]
        series[f"{r['label']}: estimate"] = [(s, est * 1e3) for s, _, est in r["curve"] if est is not None]
    title = f"{args.model} at {args.budget}: latency of the tuned module while tuning"
    curves(
        series,
        out / f"{stem}.png",
        title,
        {"best final + 5%": target_ms},
        dotted=[k for k in series if k.endswith("estimate")],
    )


if __name__ == "__main__":
    main()
