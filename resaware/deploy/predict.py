"""Predicting, without measuring, how fast each stored budget's schedules run at another budget.

Per task, two quantities. The best latency at the budget: measured, if it was tuned there, else
fitted across the tuned budgets to Amdahl's law, a + b / fraction. And how far each stored budget's
best schedule falls behind it: MetaSchedule's XGBoost cost model predicts a schedule's throughput
relative to the best of its workload, so the cost model of the budget (or of the nearest tuned one:
schedules rank alike across budgets, see benchmarks/transfer.py) scores each stored best schedule
against that budget's own best. The model's latency is the weighted sum over its tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from resaware.budget import Budget
from resaware.errors import ResawareError
from resaware.frontend.tasks import Task
from resaware.store import Slot, mean_seconds, nearest, ranks, replay, top_records

SPREAD = 4.0  # a cost model's relative score is trusted within this factor of the judge's best


@dataclass
class StoredBudget:
    """One stored budget's best schedules, predicted at the budget asked."""

    key: str
    fraction: float
    covered: int  # tasks with a valid record here
    predicted_s: float | None  # at the budget asked; None unless every task is covered
    measured_s: float | None  # its own estimate, at its own budget (weight x best measured)


@dataclass
class Prediction:
    """Predicted latencies at one budget of the model's kernels, for each stored budget's schedules."""

    model: str
    budget: str
    fraction: float  # realised
    judge: str | None  # the budget whose cost model scored the schedules (None: none ranks yet)
    tasks: int
    rows: list[StoredBudget] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def choice(self) -> StoredBudget | None:
        """The stored budget whose schedules are predicted fastest here, of those covering every task;
        None when no cost model ranked them (then they were only scaled, and nothing tells them apart)."""
        complete = [r for r in self.rows if r.predicted_s is not None]
        if self.judge is None or not complete:
            return None
        return min(complete, key=lambda r: (r.predicted_s, abs(r.fraction - self.fraction), -r.fraction))

    def table(self) -> str:
        """A printable table, one stored budget a line."""
        lines = [f"{self.model} at {self.budget} (realised {self.fraction:.0%}): predicted latency of its "
                 f"{self.tasks} kernels with each stored budget's schedules",
                 f"  {'tuned at':>8} {'share':<9} {'tasks':>7} {'predicted here':>14} {'measured there':>15}"]  # fmt: skip
        for r in self.rows:
            pick = "  <- fastest" if r is self.choice else ""
            predicted = f"{r.predicted_s * 1e3:.3f} ms" if r.predicted_s is not None else "incomplete"
            measured = f"{r.measured_s * 1e3:.3f} ms" if r.measured_s is not None else "-"
            lines.append(
                f"  {r.fraction:>8.0%} {r.key:<9} {f'{r.covered}/{self.tasks}':>7} {predicted:>14} {measured:>15}{pick}"
            )
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def amdahl(points: list[tuple[float, float]], fraction: float) -> float:
    """Latency at `fraction` from (fraction, latency) points by a + b / fraction, a, b >= 0 (least squares);
    one point scales perfectly (a = 0)."""
    xs = np.array([1 / f for f, _ in points])
    ys = np.array([y for _, y in points])
    if len(set(xs)) < 2:
        return float(np.mean(ys * (1 / xs)) / fraction)
    b, a = np.polyfit(xs, ys, 1)
    if a < 0 or b < 0:  # noisy points: keep the sign physics allows
        a, b = (0.0, float(np.mean(ys / xs))) if a < 0 else (float(np.mean(ys)), 0.0)
    return float(a + b / fraction)


def _best(database, task: Task):
    """A database's best valid record of `task` and its mean seconds, or (None, None)."""
    for record in top_records(database, task.mod, 1):
        if (mean := mean_seconds(record.run_secs)) is not None:
            return record, mean
    return None, None


def _relative(cost_model, task: Task, target, reference_record, records: list) -> list[float]:
    """Each record's schedule's latency relative to the reference's, as the cost model ranks them (1 for
    a schedule that no longer replays: no worse than the reference, as far as anyone can tell)."""
    from tvm.s_tir import meta_schedule as ms

    from resaware.platform import quiet

    reference = replay(reference_record, task.mod)
    candidates = [replay(r, task.mod) for r in records]
    if reference is None:
        return [1.0] * len(records)
    scored = [c for c in candidates if c is not None]
    context = ms.TuneContext(mod=task.mod, target=target, num_threads=1)
    with quiet.xgboost_warnings():
        scores = np.maximum(np.asarray(cost_model.predict(context, [reference, *scored]), dtype=float), 1e-9)
    factors = iter(float(np.clip(scores[0] / x, 1 / SPREAD, SPREAD)) for x in scores[1:])
    return [next(factors) if c is not None else 1.0 for c in candidates]


def estimate(
    model_name: str, budget: Budget, fraction: float, key: str, tasks: list[Task], slots: list[Slot]
) -> Prediction:
    """Predict `tasks` (weighted) at the realised budget `fraction` (share `key`) with each of `slots`' schedules."""

    prediction = Prediction(model_name, str(budget), fraction, None, len(tasks))
    slots = [s for s in slots if s.has_records]
    if not slots:
        raise ResawareError("the store has no records for this hardware: tune the model first (resaware tune)")
    own = next((s for s in slots if s.key == key), None)
    models = {s.key: s.load_cost_model(1) for s in slots if s.cost_model_file.exists()}
    ranking = [s for s in slots if ranks(models.get(s.key))]
    judge = own if own in ranking else nearest(ranking, fraction)
    prediction.judge = judge.key if judge is not None else None
    if judge is None:
        prediction.notes.append("no budget's cost model ranks yet (under 100 records): schedules are only scaled")
    if own is None:
        prediction.notes.append(f"not tuned at {fraction:.0%}: best latencies fitted across "
                                f"{', '.join(f'{s.fraction:.0%}' for s in slots)} (Amdahl)")  # fmt: skip
    if judge is not None and judge is not own:
        prediction.notes.append(f"schedules ranked by the cost model of {judge.key}")
    databases = {s.key: s.database() for s in slots}
    best = {s.key: [_best(databases[s.key], t) for t in tasks] for s in slots}
    # Kernels no budget has a record of get default schedules whichever records compile the model.
    kept = [i for i in range(len(tasks)) if any(best[s.key][i][1] is not None for s in slots)]
    if len(kept) < len(tasks):
        prediction.notes.append(f"{len(tasks) - len(kept)} kernels have no records at any budget and are left out")
    tasks = [tasks[i] for i in kept]
    best = {k: [b[i] for i in kept] for k, b in best.items()}
    prediction.tasks = len(tasks)
    totals = {s.key: 0.0 for s in slots}
    for i, task in enumerate(tasks):
        measured = [(s.fraction, best[s.key][i][1]) for s in slots if best[s.key][i][1] is not None]
        # The reference runs at `here`: the budget's own best schedule where it has one (measured), else the
        # judge's best (its best latency fitted); every other schedule is scored against it.
        reference = own if own is not None and best[own.key][i][0] is not None else judge
        here = best[own.key][i][1] if reference is own and own is not None else amdahl(measured, fraction)
        having = [s for s in slots if best[s.key][i][0] is not None]
        reference_record = best[reference.key][i][0] if reference is not None else None
        if reference_record is None or judge is None:  # nothing to rank with: scaled only
            factors = [1.0] * len(having)
        else:
            factors = _relative(models[judge.key], task, reference_record.target, reference_record,
                                [best[s.key][i][0] for s in having])  # fmt: skip
        for s, factor in zip(having, factors):
            totals[s.key] += task.weight * here * (1.0 if s is reference else factor)
    for s in slots:
        covered = sum(1 for b in best[s.key] if b[1] is not None)
        complete = covered == len(tasks)
        prediction.rows.append(StoredBudget(
            s.key, s.fraction, covered, totals[s.key] if complete else None,
            sum(t.weight * b[1] for t, b in zip(tasks, best[s.key])) if complete else None,
        ))  # fmt: skip
    return prediction


def predict(
    model, budget, store=None, shapes=None, allow_mismatch: bool = False, layout: str | None = None
) -> Prediction:
    """Predict `model`'s kernel latency at `budget` for each stored budget's schedules (CPU budgets), in
    the convolutions' layout `compile` would choose (`compiling.lower_as_tuned`, by the nearest budget)."""
    from resaware.deploy.lowering import lower_as_tuned
    from resaware.frontend import intrinsics
    from resaware.frontend.model import resolve
    from resaware.platform import confine, hardware
    from resaware.store import Store

    intrinsics.register("llvm")
    model = resolve(model, shapes, layout)
    budget = Budget.parse(budget)
    share = budget.cpu(confine.usable_cores())
    target = hardware.llvm_target(share.count)
    slots = Store.open(store).slots_for(hardware.detect(), "llvm", allow_mismatch)
    _, tasks, _ = lower_as_tuned(model, target, nearest(slots, share.fraction))
    return estimate(model.name, budget, share.fraction, share.key, tasks, slots)
