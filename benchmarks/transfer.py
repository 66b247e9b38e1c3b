"""Warm start across budgets: trials a new budget needs when it starts from another budget's tuning.

For each model, in one run: a cold start at 100% and at 50% (`warm_start=False`), then 50% warm-started
from the cold 100% store and 100% warm-started from the cold 50% store. Every run tunes in steps of
4 candidates per task (the first round of `resaware tune --trials 4xTASKS`, then the same again), so
cold and warm differ only in what the donor brings. From each budget's records, in the order they were
measured: MetaSchedule's estimate of the model's latency (sum of weight x best task time) after every
record; the table gives the trials each run needed to come within 5% of the cold start's final
estimate at that budget.

Then the ranking accuracy of cost models on held-out records of each budget (`--rank`; also on a store
archive, e.g. the H200's MPS shares): per-budget (its own records), donor only (the other budgets'),
warm (both, as a warm start trains it), and one shared model with the budget as a feature.

    python benchmarks/transfer.py --work DIR                       # squeezenet, resnet50
    python benchmarks/transfer.py --rank-store benchmarks/results/gpu_check-h200-store.tar.gz
    python benchmarks/transfer.py --quick --models small.onnx     # CI smoke run
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

import resaware
from common import add_output_args, output_dir, write
from resaware.budget import Budget
from resaware.frontend.tasks import extract
from resaware.platform import confine, hardware
from resaware.store import DONOR_MARK, Store, fit, mean_seconds, replay, top_records
from resaware.tuning.transfer import pairwise

WITHIN = 1.05


def tune_steps(model, budget: str, store: Path, step: int, total: int, warm: bool) -> float:
    """Tune `model` at `budget` into `store` in rounds of `step` trials up to `total`; wall seconds."""
    start = time.monotonic()
    for trials in range(step, total + 1, step):
        resaware.tune(model, budget, trials, store=store, progress=False, warm_start=warm)
    return time.monotonic() - start


def slot_of(store: Path, budget: str):
    share = Budget.parse(budget).cpu(confine.usable_cores())
    (slot,) = [s for s in Store.open(store).slots(hardware.detect(), "llvm") if s.key == share.key]
    return slot


def trials_to(curve, level: float) -> int | None:
    """The first record count at which the estimate is within `level`."""
    return next((n for n, est in curve if est is not None and est <= level), None)


def transfer_runs(name: str, work: Path, cold_total: int, warm_total: int) -> dict:
    model = resaware.load_onnx(name)
    tasks = extract(model, hardware.llvm_target(1))
    step = 4 * len(tasks)
    cold_total, warm_total = max(step, cold_total - cold_total % step), max(step, warm_total - warm_total % step)
    runs = {}
    for budget in ("100%", "50%"):
        store = work / f"{model.name}-cold-{budget[:-1]}"
        wall = tune_steps(model, budget, store, step, cold_total, warm=False)
        runs[f"cold@{budget}"] = {"budget": budget, "store": store, "wall_s": wall, "donor": None}
    for budget, donor in (("50%", "100%"), ("100%", "50%")):
        store = work / f"{model.name}-warm-{budget[:-1]}"
        if not store.exists():
            shutil.copytree(work / f"{model.name}-cold-{donor[:-1]}", store)
        wall = tune_steps(model, budget, store, step, warm_total, warm=True)
        runs[f"warm@{budget}"] = {"budget": budget, "store": store, "wall_s": wall, "donor": donor}
    for run in runs.values():
        run["curve"] = slot_of(run["store"], run["budget"]).curve(model.name)
        run["final_s"] = run["curve"][-1][1]
    rows = []
    for budget in ("50%", "100%"):
        cold, warm = runs[f"cold@{budget}"], runs[f"warm@{budget}"]
        if cold["final_s"] is None:
            raise SystemExit(f"{model.name} cold at {budget}: a task has no valid record after {cold_total} trials")
        level = cold["final_s"] * WITHIN
        n_cold, n_warm = trials_to(cold["curve"], level), trials_to(warm["curve"], level)
        rows.append({
            "budget": budget, "donor": warm["donor"], "cold_final_ms": cold["final_s"] * 1e3,
            "cold_trials": len(cold["curve"]), "cold_to_5pct": n_cold, "warm_to_5pct": n_warm,
            "warm_final_ms": _ms(warm["final_s"]), "warm_trials": len(warm["curve"]),
            "warm_first_round_ms": _ms(dict(warm["curve"]).get(step)),
            "cold_first_round_ms": _ms(dict(cold["curve"]).get(step)),
            "fewer_trials": n_cold / n_warm if n_cold and n_warm else None,
            # The reverse question: how long the cold start takes to match the warm one's first estimate.
            "warm_first_point": next(((n, e * 1e3) for n, e in warm["curve"] if e is not None), None),
            "cold_to_warm_first": trials_to(cold["curve"], next((e for _, e in warm["curve"] if e is not None), 0.0)),
            "cold_wall_s": cold["wall_s"], "warm_wall_s": warm["wall_s"],
        })  # fmt: skip
    for run in runs.values():
        run["store"] = str(run["store"])
    return {"model": model.name, "tasks": len(tasks), "step": step, "rows": rows, "runs": runs}


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


def _shown(ms: float | None) -> str:
    return f"{ms:.2f} ms" if ms is not None else "n/a"


def transfer_table(result: dict) -> str:
    lines = [f"{result['model']}: {result['tasks']} tasks, tuned in steps of {result['step']} trials; "
             f"trials to come within 5% of the cold start's final estimate",
             f"{'budget':>6} {'donor':>6} {'cold final':>11} {'cold trials':>11} {'cold to 5%':>10} "
             f"{'warm to 5%':>10} {'fewer':>6} {'1st round cold':>14} {'warm':>9} {'warm final':>11} "
             f"{'warm 1st estimate':>22} {'cold to match it':>16}"]  # fmt: skip
    for r in result["rows"]:
        fewer = f"{r['fewer_trials']:.1f}x" if r["fewer_trials"] else "-"
        match = r["cold_to_warm_first"] or f"never in {r['cold_trials']}"
        lines.append(
            f"{r['budget']:>6} {r['donor']:>6} {_shown(r['cold_final_ms']):>11} {r['cold_trials']:>11} "
            f"{r['cold_to_5pct'] or 'never':>10} {r['warm_to_5pct'] or 'never':>10} {fewer:>6} "
            f"{_shown(r['cold_first_round_ms']):>14} {_shown(r['warm_first_round_ms']):>9} {_shown(r['warm_final_ms']):>11}"
            + (
                f" {r['warm_first_point'][1]:>9.2f} ms at {r['warm_first_point'][0]:>3}"
                if r["warm_first_point"]
                else f" {'n/a':>22}"
            )
            + f" {match:>16}"
        )
    return "\n".join(lines)


def time_modules(name: str, work: Path, rounds: int = 3) -> list[dict]:
    """The whole model compiled from each cold and warm store's final records, timed at its budget in a
    confined child, cold and warm interleaved over `rounds`: does the estimate's verdict hold end to end?"""
    import statistics

    model = resaware.load_onnx(name)
    rows = []
    for budget in ("50%", "100%"):
        compiled = {kind: resaware.compile(model, budget, store=work / f"{model.name}-{kind}-{budget[:-1]}")
                    for kind in ("cold", "warm")}  # fmt: skip
        times = {kind: [] for kind in compiled}
        for _ in range(rounds):
            for kind, module in compiled.items():
                times[kind].append(module.benchmark(budget, repeat=10, warmup=2).median_ms)
        cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
        rows.append({"model": model.name, "budget": budget, "cold_ms": cold, "warm_ms": warm, "warm_over_cold": warm / cold,
                     "rounds": times})  # fmt: skip
    return rows


def modules_table(rows: list[dict]) -> str:
    lines = ["whole models compiled from the final records, median ms at the budget (cold and warm interleaved)",
             f"{'model':<12} {'budget':>6} {'cold':>10} {'warm':>10} {'warm/cold':>9}"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['model']:<12} {r['budget']:>6} {r['cold_ms']:>7.2f} ms {r['warm_ms']:>7.2f} ms {r['warm_over_cold']:>8.2f}x"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- ranking accuracy


def _with_budget(fraction_of):
    """A feature extractor: MetaSchedule's per-store features plus the budget's fraction as a column."""
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature, PyFeatureExtractor

    @derived_object
    class WithBudget(PyFeatureExtractor):
        def __init__(self):
            super().__init__()
            self.inner = PerStoreFeature()

        def extract_from(self, context, candidates):
            extra = fraction_of()
            out = []
            for tensor in self.inner.extract_from(context, candidates):
                x = tensor.numpy()
                out.append(tvm.runtime.tensor(np.concatenate([x, np.full((x.shape[0], 1), extra, x.dtype)], 1)))
            return out

    return WithBudget()


def _split(records, seed: int, held: int = 4):
    """Per workload: one in `held` of its schedules held out, chosen by a hash of the trace, so that
    a schedule measured at several budgets is held out at all of them (no model sees its twin)."""
    import hashlib

    import tvm_ffi

    train, test = [], {}
    for r in records:
        key = int(tvm_ffi.structural_hash(r.workload.mod))
        digest = hashlib.sha256(f"{seed}/{key}/{r.trace}".encode()).digest()
        if digest[0] % held:
            train.append(r)
        elif mean_seconds(r.run_secs) is not None:
            test.setdefault(key, []).append(r)
    return train, test


def _evaluate(model, test) -> dict:
    from tvm.s_tir import meta_schedule as ms

    right = total = 0
    recall = []
    for records in test.values():
        records = [r for r in records if replay(r) is not None]
        if len(records) < 2:
            continue
        context = ms.TuneContext(mod=records[0].workload.mod, target=records[0].target, num_threads=1)
        scores = np.asarray(model.predict(context, [replay(r) for r in records]))
        costs = [mean_seconds(r.run_secs) for r in records]
        r, t = pairwise(list(scores), costs)
        right, total = right + r, total + t
        if len(records) >= 10:
            k = 5
            true = set(np.argsort(costs)[:k])
            picked = set(np.argsort(-scores)[:k])
            recall.append(len(true & picked) / k)
    return {"pairwise": right / total if total else None, "pairs": total,
            "top5_recall": float(np.mean(recall)) if recall else None}  # fmt: skip


def ranking(slots, seed: int = 0) -> list[dict]:
    """Ranking accuracy on each slot's held-out records of four cost models (see the module doc)."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel as Stock

    def XGBModel(**kwargs):  # noqa: N802 - ranks from its first sample: small training sets are not random
        return Stock(num_warmup_samples=0, **kwargs)

    data = {s.key: _split(list(s.database().get_all_tuning_records()), seed) for s in slots}
    fractions = {s.key: s.fraction for s in slots}
    kind = slots[0].kind
    rows = []
    for slot in slots:
        train, test = data[slot.key]
        others = [k for k in data if k != slot.key]
        models = {}
        models["per-budget"] = XGBModel(num_tuning_cores=1)
        fit(models["per-budget"], train, kind)
        models["donor only"] = XGBModel(num_tuning_cores=1)
        for other in others:
            fit(models["donor only"], data[other][0], kind, group=f"{DONOR_MARK}{other}")
        models["warm (own + donor)"] = XGBModel(num_tuning_cores=1)
        for other in others:
            fit(models["warm (own + donor)"], data[other][0], kind, group=f"{DONOR_MARK}{other}")
        fit(models["warm (own + donor)"], train, kind)
        current = [0.0]
        shared = XGBModel(extractor=_with_budget(lambda current=current: current[0]), num_tuning_cores=1)
        for other in others:
            current[0] = fractions[other]
            fit(shared, data[other][0], kind, group=f"{DONOR_MARK}{other}")
        current[0] = fractions[slot.key]
        fit(shared, train, kind)
        models["shared, budget feature"] = shared
        for label, model in models.items():
            rows.append({"budget": slot.key, "fraction": slot.fraction, "model": label,
                         "train": model.data_size, **_evaluate(model, test)})  # fmt: skip
    return rows


def predict_held_out(slots) -> list[dict]:
    """`resaware.deploy.predict` at a budget it never saw: each slot in turn is left out and predicted from the
    others; where a stored budget's best schedules were also measured at the left-out one (the same
    candidates measured at every share, as gpu_check does), predicted and measured latencies compare."""
    import tvm_ffi

    from resaware.budget import Budget
    from resaware.deploy.predict import estimate
    from resaware.frontend.tasks import Task

    names = {}
    for s in slots:
        names.update(s.task_names())
    rows = []
    for held in slots:
        database = held.database()
        workloads = {
            int(tvm_ffi.structural_hash(w.mod)): w.mod for w in (r.workload for r in database.get_all_tuning_records())
        }
        tasks = [Task(names[str(h)]["name"], sum(names[str(h)]["models"].values()), names[str(h)]["flops"], mod)
                 for h, mod in workloads.items() if str(h) in names]  # fmt: skip
        measured = {}  # (workload, trace) -> seconds at the held-out budget
        for r in database.get_all_tuning_records():
            if (mean := mean_seconds(r.run_secs)) is not None:
                measured[(int(tvm_ffi.structural_hash(r.workload.mod)), str(r.trace))] = mean
        others = [s for s in slots if s is not held]
        prediction = estimate("held-out", Budget(held.fraction), held.fraction, held.key, tasks, others)
        for row in prediction.rows:
            slot = next(s for s in others if s.key == row.key)
            db = slot.database()
            total = 0.0
            for task in tasks:
                (best,) = top_records(db, task.mod, 1)
                total += task.weight * measured.get((task.workload_hash, str(best.trace)), float("nan"))
            rows.append({"held_out": held.key, "stored": row.key, "judge": prediction.judge,
                         "predicted_ms": row.predicted_s * 1e3 if row.predicted_s else None,
                         "measured_ms": total * 1e3, "chosen": prediction.choice is row})  # fmt: skip
    return rows


def predict_table(rows: list[dict]) -> str:
    lines = ["resaware.deploy.predict at a share it never saw (left out, predicted from the others; measured: the same schedules timed there)",
             f"{'left out':>9} {'schedules of':>12} {'judge':>8} {'predicted':>11} {'measured':>11} {'error':>7}  chosen"]  # fmt: skip
    for r in rows:
        error = (
            f"{r['predicted_ms'] / r['measured_ms'] - 1:+.0%}"
            if r["predicted_ms"] and r["measured_ms"] == r["measured_ms"]
            else "-"
        )
        predicted = f"{r['predicted_ms']:.4f} ms" if r["predicted_ms"] else "n/a"
        lines.append(
            f"{r['held_out']:>9} {r['stored']:>12} {r['judge']:>8} {predicted:>11} {r['measured_ms']:>8.4f} ms {error:>7}  {'<-' if r['chosen'] else ''}"
        )
    return "\n".join(lines)


def ranking_table(title: str, rows: list[dict]) -> str:
    lines = [
        title,
        f"{'budget':>10} {'model':<24} {'train':>6} {'pairs':>7} {'pairwise acc.':>13} {'top-5 recall':>12}",
    ]
    for r in rows:
        recall = f"{r['top5_recall']:.2f}" if r["top5_recall"] is not None else "-"
        accuracy = f"{r['pairwise']:.3f}" if r["pairwise"] is not None else "-"
        lines.append(f"{r['budget']:>10} {r['model']:<24} {r['train']:>6} {r['pairs']:>7} {accuracy:>13} {recall:>12}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--models", default="zoo:squeezenet,zoo:resnet50")
    parser.add_argument("--cold-trials", type=int, default=480, help="cold start's trials (rounded to steps)")
    parser.add_argument("--warm-trials", type=int, default=240, help="warm start's trials (rounded to steps)")
    parser.add_argument("--work", help="directory for the stores (kept; a rerun resumes)")
    parser.add_argument("--rank-store", help="only rank: a store directory or .tar.gz (e.g. the H200 archive)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-modules", action="store_true",
                        help="only compile the final cold and warm modules from --work's stores and time them")  # fmt: skip
    args = parser.parse_args()
    if args.quick:  # one step each (4 candidates per task); pass a small --models to keep it short
        args.cold_trials, args.warm_trials = 0, 0
    out = output_dir(args)
    command = "python " + " ".join(sys.argv)
    if args.time_modules:
        rows = [row for name in args.models.split(",") for row in time_modules(name, Path(args.work))]
        table = modules_table(rows)
        print(table)
        write(out, "transfer_modules", {"rows": rows}, table, command)
        return
    if args.rank_store:
        root = Path(args.rank_store)
        if root.suffix == ".gz":
            unpacked = Path(tempfile.mkdtemp(prefix="resaware-rank-"))
            with tarfile.open(root) as tar:
                tar.extractall(unpacked, filter="data")
            root = next(p.parents[3] for p in unpacked.rglob("budget.json"))  # ROOT/hw/kind/share
        tables, found = [], {}
        for hw in Store.open(root).hardware():
            for kind in ("llvm", "cuda"):
                slots = [s for s in Store.open(root).slots(hw, kind) if s.record_file.exists()]
                if len(slots) >= 2:
                    rows = ranking(slots, args.seed)
                    found[f"{hw.id}/{kind}"] = rows
                    tables.append(
                        ranking_table(f"{hw.id} {kind}: cost models ranking held-out records (25% per workload)", rows)
                    )
                if len(slots) >= 3:
                    held = predict_held_out(slots)
                    found[f"{hw.id}/{kind}/predict"] = held
                    tables.append(predict_table(held))
        table = "\n\n".join(tables)
        print(table)
        write(out, "transfer_ranking-" + Path(args.rank_store).name.split(".")[0], {"ranking": found}, table, command)
        return
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="resaware-transfer-"))
    results, tables = [], []
    for name in args.models.split(","):
        result = transfer_runs(name, work, args.cold_trials, args.warm_trials)
        slots = [slot_of(Path(result["runs"][f"cold@{b}"]["store"]), b) for b in ("50%", "100%")]
        result["ranking"] = ranking(slots, args.seed)
        table = (
            transfer_table(result)
            + "\n\n"
            + ranking_table(
                f"{result['model']}: cost models ranking held-out records of the cold stores (25% per workload)",
                result["ranking"],
            )
        )
        print(table, flush=True)
        results.append(result)
        tables.append(table)
        write(out, f"transfer_{result['model']}", result, table, command)


if __name__ == "__main__":
    main()
