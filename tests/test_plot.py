"""Plots read real tuning results: the store's record-by-record curve replays what the run reported."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import resaware
from resaware import ResawareError
from resaware.analysis import plot
from resaware.frontend import tasks
from resaware.store import Slot, Store
from resaware.tuning.report import TuneReport


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, small_model):
    """The small model (4 tasks) tuned at 100% long enough for every task to get a record."""
    store = tmp_path_factory.mktemp("plot-store")
    return store, resaware.tune(small_model, ["100%"], trials=16, store=store, progress=False)


def test_store_curve_replays_the_run(tuned):
    _, report = tuned
    (result,) = report.budgets
    curve = Slot.open(result.slot).curve(report.model)
    assert [n for n, _ in curve] == list(range(1, result.trials_total + 1))
    known = [est for _, est in curve if est is not None]
    assert known, "every task has a record after 16 trials"
    assert known == sorted(known, reverse=True)  # a best-so-far can only improve
    assert known[-1] == pytest.approx(result.estimated_s)
    # After every batch the run's own estimate equals the store's at that many records.
    at = dict(curve)
    for _, trials, estimate in result.history:
        assert at[trials] == (pytest.approx(estimate) if estimate is not None else None)


def test_figures_export_png_and_svg(tuned, tmp_path):
    store, report = tuned
    plot.tuning_curves(report, tmp_path / "curves.png")
    plot.tuning_curves(Store.open(store), tmp_path / "from-store.svg")
    plot.tuning_curves(report, tmp_path / "seconds.png", x="seconds")
    figure = plot.task_bars(report, tmp_path / "tasks.svg")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "seconds.png").read_bytes()[:4] == b"\x89PNG"
    for svg in ("from-store.svg", "tasks.svg"):
        assert "<svg" in (tmp_path / svg).read_text()
    # One bar per task with a record, tallest first (the tasks that cost most lead).
    heights = [bar.get_height() for bar in figure.axes[0].patches]
    recorded = [t for t in report.budgets[0].tasks if t.best_s is not None]
    assert len(heights) == len(recorded) >= 4 and heights == sorted(heights, reverse=True)
    assert heights[0] == pytest.approx(max(t.weight * t.best_s for t in report.budgets[0].tasks) * 1e3)


def test_saved_reports_plot_later(tuned, tmp_path):
    _, report = tuned
    saved = json.loads(json.dumps(report.to_json()))  # what `resaware tune --json` prints
    again = TuneReport.from_json(saved)
    assert json.loads(json.dumps(again.to_json())) == saved
    plot.task_bars(again, tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"


def test_curve_of_a_budget_shared_by_two_models(tuned, tmp_path, small_model):
    store, report = tuned
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    (slot,) = Store.open(copy).slots()
    # A second model calling every kernel twice: same records, twice the estimate.
    slot.remember_tasks([dataclasses.replace(t, weight=2 * t.weight) for t in tasks.of(small_model, "100%")], "twice")
    with pytest.raises(ResawareError, match="say which model"):
        slot.curve()
    once, twice = slot.curve(report.model), slot.curve("twice")
    assert [e2 for _, e2 in twice] == [pytest.approx(2 * e1) if e1 is not None else None for _, e1 in once]
    with pytest.raises(ValueError, match="x='seconds' needs a TuneReport"):
        plot.tuning_curves(Store.open(copy), x="seconds")
