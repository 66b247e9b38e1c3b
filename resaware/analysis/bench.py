"""The cross-budget experiment: modules tuned at each budget, each timed at every budget.

Rows are modules (`tuned@B` for each tune-at budget, `untuned` — compile's default schedules —
and `onnxruntime`), columns the budgets they run at. Every cell is timed in a child confined to the
run-at cores; rounds interleave all cells, rotating their order, so drift on a shared machine hits
every cell alike. A cell's ratio is its latency over the best tuned module's in that column; the
robust budget is the tune-at budget whose worst ratio over the columns is smallest.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from resaware.analysis import reference
from resaware.budget import Budget, CpuShare
from resaware.deploy.compiling import compile as compile_model
from resaware.errors import ResawareError
from resaware.frontend.model import resolve
from resaware.platform import confine
from resaware.runtime.compiled import run_confined
from resaware.tuning.report import TuneReport
from resaware.tuning.tune import tune

UNTUNED, ONNXRUNTIME = "untuned", "onnxruntime"
TOLERANCE = 1e-4  # max|tvm - onnxruntime| / max|onnxruntime| for outputs to count as equal


def tuned_label(budget: str) -> str:
    """The matrix row of the module tuned at `budget`."""
    return f"tuned@{budget}"


@dataclass
class Cell:
    """One module (row) timed at one run-at budget."""

    row: str
    run_at: str
    median_ms: float  # median of the rounds' medians
    rounds_ms: list[float]
    ratio: float | None = None  # to the best tuned module in this column


@dataclass
class CrossBudget:
    """The tuned-at x run-at latency matrix, with untuned and ONNX Runtime rows and the robust budget."""

    model: str
    hardware: str
    tune_at: list[str]
    run_at: list[str]
    cores: dict[str, int]  # budget -> cores it realises
    rows: list[str]
    cells: list[Cell]
    robust: str | None  # a tune-at budget
    max_rel_error: dict[str, float]  # row -> worst output mismatch against ONNX Runtime
    trials: dict[str, int] = field(default_factory=dict)  # tune-at budget -> trials in the store
    tune_wall_s: float = 0.0
    tuning: TuneReport | None = field(default=None, repr=False)  # how the tune-at budgets were tuned

    def cell(self, row: str, run_at: str) -> Cell:
        """The cell of `row` timed at the run-at budget `run_at`."""
        return next(c for c in self.cells if c.row == row and c.run_at == run_at)

    def to_json(self) -> dict:
        """Everything as JSON-ready data, the tuning report included."""
        data = asdict(replace(self, tuning=None))
        data["tuning"] = self.tuning.to_json() if self.tuning is not None else None
        return data

    @classmethod
    def from_json(cls, data: dict) -> CrossBudget:
        """The matrix `to_json` wrote (the benchmark's and `resaware bench`'s JSON), to plot or compare later."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["cells"] = [Cell(**c) for c in data["cells"]]
        fields["tuning"] = TuneReport.from_json(data["tuning"]) if data.get("tuning") else None
        return cls(**fields)

    def table(self) -> str:
        """The matrix as printed: median ms and the ratio to the column's best tuned module."""
        head = f"{self.model} on {self.hardware}: median ms (ratio to the best tuned module in the column)"
        cols = [f"run@{b} ({self.cores[b]}c)" for b in self.run_at]
        width = max(18, *(len(c) for c in cols))
        lines = [head, f"{'':<16}" + "".join(f"{c:>{width}}" for c in cols) + f"{'worst':>9}{'max rel err':>13}"]
        for row in self.rows:
            cells = [self.cell(row, b) for b in self.run_at]
            text = [f"{_ms(c.median_ms)} ({c.ratio:.2f}x)" for c in cells]
            worst = max(c.ratio for c in cells)
            err = self.max_rel_error.get(row)
            lines.append(
                f"{row:<16}" + "".join(f"{t:>{width}}" for t in text) + f"{worst:>8.2f}x"
                + (f"{err:>13.1e}" if err is not None else f"{'-':>13}")
            )  # fmt: skip
        if self.robust is not None:
            lines.append(
                f"robust budget: tune at {self.robust} (smallest worst ratio over run-at {', '.join(self.run_at)})"
            )
        return "\n".join(lines)


def _ms(value: float) -> str:
    return f"{value:.2f}" if value >= 10 else f"{value:.3g}"


def _shares(budgets, usable: list[int], what: str) -> dict[str, CpuShare]:
    """Budgets by label, one per realised core set, labelled by the asked budget nearest to it."""
    groups: dict[str, list[CpuShare]] = {}
    for budget in budgets:
        share = Budget.parse(budget).cpu(usable)
        groups.setdefault(share.key, []).append(share)
    shares = {}
    for same in groups.values():
        keep = min(same, key=lambda s: (abs(s.asked.fraction - s.fraction), -s.asked.fraction))
        if len(same) > 1:
            others = ", ".join(str(s.asked) for s in same if s is not keep)
            print(f"resaware: {what} {others} realise(s) the same {keep.count} core(s) as {keep.asked}: measured once",
                  file=sys.stderr)  # fmt: skip
        shares[str(keep.asked)] = keep
    return shares


def rel_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Worst max|got - want| / max|want| over the outputs."""
    return max(float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-12)) for g, w in zip(got, want))


def interleaved(timers: dict, rounds: int) -> dict[object, list]:
    """Call every timer once per round, in an order rotated each round so that no timer always runs
    first or after the same one; each key's samples."""
    order = list(timers)
    samples: dict[object, list] = {key: [] for key in order}
    for r in range(rounds):
        shift = r * len(order) // rounds
        for key in order[shift:] + order[:shift]:
            samples[key].append(timers[key]())
    return samples


def robust_budget(worst: dict[str, float], fractions: dict[str, float]) -> str | None:
    """The tune-at budget with the smallest worst ratio; on a tie the larger share, which tunes faster."""
    return min(worst, key=lambda label: (worst[label], -fractions[label])) if worst else None


def cross_budget(model, tune_at, run_at, trials: int | None, store=None, rounds: int = 3, repeat: int = 5,
                 min_seconds: float = 1.0, seed: int = 0, time_limit: float | None = None, untuned: bool = True,
                 onnxruntime: bool = True, progress: bool = True) -> CrossBudget:  # fmt: skip
    """Tune (or reuse the store) at each `tune_at` budget, then time every module at every `run_at` budget.

    `trials` and `time_limit` bound the tuning as in `tuning.tune` (`trials=None`: for the time limit alone)."""
    if rounds < 1 or repeat < 1:
        raise ResawareError(f"rounds and repeat must be at least 1, got {rounds} and {repeat}")
    model = resolve(model)
    usable = confine.usable_cores()
    tune_shares = _shares(tune_at, usable, "tune-at")
    run_shares = _shares(run_at, usable, "run-at")
    report = tune(model, [s.asked for s in tune_shares.values()], trials, store=store, seed=seed,
                  time_limit=time_limit, progress=progress)  # fmt: skip
    # The modules live only as long as they are timed.
    with tempfile.TemporaryDirectory(prefix="resaware-bench-") as workdir:
        inputs = model.random_inputs(0)
        expected = reference.outputs(model, inputs)
        specs = [s.to_json() for s in model.inputs]

        # Row -> {run-at label: path of the module that runs there}: tuned modules are built once, for
        # their tune-at budget; the untuned baseline is built for each run-at budget, as a user would.
        modules: dict[str, dict[str, str]] = {}
        errors: dict[str, float] = {}
        for (label, share), tuned in zip(tune_shares.items(), report.budgets):
            compiled = compile_model(model, share.asked, store=report.store, layout=tuned.layout)
            path = compiled.export(os.path.join(workdir, f"{model.name}-tuned-{share.key}.so"))
            errors[tuned_label(label)] = rel_error(compiled(*inputs), expected)
            modules[tuned_label(label)] = dict.fromkeys(run_shares, path)
        if untuned:
            empty = os.path.join(workdir, "empty-store")
            modules[UNTUNED] = {}
            for label, share in run_shares.items():
                with contextlib.redirect_stderr(io.StringIO()):  # its "no records" warnings are the point
                    compiled = compile_model(model, share.asked, store=empty, seed=seed)
                modules[UNTUNED][label] = compiled.export(os.path.join(workdir, f"{model.name}-untuned-{share.key}.so"))
                errors[UNTUNED] = max(errors.get(UNTUNED, 0.0), rel_error(compiled(*inputs), expected))
        rows = list(modules) + ([ONNXRUNTIME] if onnxruntime else [])
        bad = {row: err for row, err in errors.items() if err >= TOLERANCE}
        if bad:
            raise ResawareError(f"outputs differ from ONNX Runtime (max|diff|/max|ref| >= {TOLERANCE}): {bad}")

        def time_cell(row: str, label: str) -> float:
            share = run_shares[label]
            if row == ONNXRUNTIME:
                latency = reference.latency(model, share.cores, label, repeat, 2, min_seconds)
            else:
                latency = run_confined(modules[row][label], share.cores, label, repeat, 2, min_seconds, specs)
            return latency.median_ms

        order = [(row, label) for label in run_shares for row in rows]
        samples = interleaved({key: functools.partial(time_cell, *key) for key in order}, rounds)

    cells = [Cell(row, label, statistics.median(samples[row, label]), samples[row, label]) for row, label in order]
    for label in run_shares:
        column = [c for c in cells if c.run_at == label]
        best = min(c.median_ms for c in column if c.row.startswith("tuned@"))
        for c in column:
            c.ratio = c.median_ms / best
    worst = {label: max(c.ratio for c in cells if c.row == tuned_label(label)) for label in tune_shares}
    robust = robust_budget(worst, {label: s.fraction for label, s in tune_shares.items()})
    labels = {**tune_shares, **run_shares}
    return CrossBudget(
        model=model.name, hardware=report.hardware, tune_at=list(tune_shares), run_at=list(run_shares),
        cores={label: s.count for label, s in labels.items()}, rows=rows, cells=cells, robust=robust,
        max_rel_error=errors, trials={b.budget: b.trials_total for b in report.budgets},
        tune_wall_s=sum(b.wall_s for b in report.budgets), tuning=report,
    )  # fmt: skip
