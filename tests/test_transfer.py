"""Warm start across budgets, the cost model's validation log, and predictions from the store."""

import json
import shutil

import pytest
from conftest import run_cli, two_cores

import resaware
from resaware.deploy.predict import amdahl, predict
from resaware.platform import hardware
from resaware.store import DONOR_MARK, Store, Validated
from resaware.tuning.transfer import FIRST_BATCH, pairwise, shared_database


def _slot(store, key):
    (slot,) = [s for s in Store.open(store).slots() if s.key == key]
    return slot


def _steps(result):
    trials = [0, *(t for _, t, _ in result.history)]
    return [b - a for a, b in zip(trials, trials[1:])]


COLD, WARM = 104, 24  # the cold budget's cost model ranks (>= 100 samples) from the warm one's start


@pytest.fixture(scope="module")
def warm_store(small_model, tmp_path_factory):
    """The small model tuned cold at 100%, then warm-started at 50% from it."""
    store = tmp_path_factory.mktemp("warm-store")
    cold = resaware.tune(small_model, "100%", trials=COLD, store=store, progress=False).budgets[0]
    warm = resaware.tune(small_model, "50%", trials=WARM, store=store, progress=False, warm_start=True).budgets[0]
    return store, cold, warm


@two_cores
def test_a_new_budget_starts_from_the_nearest_tuned_one(small_model, warm_store, tmp_path):
    store, cold, warm = warm_store
    donor, slot = _slot(store, "cpu-2of2"), _slot(store, "cpu-1of2")
    # The cold start's first round is one batch of trials/tasks per task; the warm start's is FIRST_BATCH
    # (a batch may come back short when the search finds fewer new candidates).
    batch = COLD // len(cold.tasks)
    assert max(_steps(cold)[:3]) == batch and max(_steps(warm)) == FIRST_BATCH
    assert warm.trials_total == WARM and warm.warm_from == "cpu-2of2" and cold.warm_from is None
    # Its cost model learnt the donor's records as groups of their own, then its own records.
    model = slot.load_cost_model(1)
    donor_groups = {k: len(g.costs) for k, g in model.data.items() if k.endswith(f"{DONOR_MARK}cpu-2of2")}
    own_groups = {k: len(g.costs) for k, g in model.data.items() if DONOR_MARK not in k}
    assert sum(donor_groups.values()) == len(donor.database()) == cold.trials_total
    assert sum(own_groups.values()) == WARM and model.data_size == cold.trials_total + WARM
    assert {k.split(DONOR_MARK)[0] for k in donor_groups} == set(own_groups)
    assert not any(DONOR_MARK in k for k in donor.load_cost_model(1).data)  # the first budget had no donor
    # It ranked from its first batch, each batch before training on it: logged, and shown by `store show`.
    checked = slot.validation(last=100)
    assert 0 < checked.batches <= WARM // FIRST_BATCH and checked.samples >= cold.trials_total
    assert 0 <= checked.pairwise <= 1 and checked.rmse >= 0
    assert "of pairs, rmse" in Store.open(store).show()
    # A retrain on the budget's records (after a merge) keeps what the donor taught.
    shutil.copytree(store, tmp_path / "retrained")
    retrained = _slot(tmp_path / "retrained", "cpu-1of2")
    retrained.rebuild_cost_model()
    assert retrained.load_cost_model(1).data_size == cold.trials_total + WARM
    # The search's initial population: the budget's own best first, the donor's best where it has too few.
    database, donor_db = shared_database(slot, donor), donor.database()
    record = next(iter(donor_db.get_all_tuning_records()))
    workload = database.commit_workload(record.workload.mod)
    own = database.inner.get_top_k(workload, 100)
    theirs = donor_db.get_top_k(donor_db.commit_workload(record.workload.mod), 100)
    top = database.get_top_k(workload, 100)
    assert [str(r.trace) for r in top] == [str(r.trace) for r in [*own, *theirs]]
    assert len(database.get_top_k(workload, len(own))) == len(own)
    # By default a budget is tuned cold: no donor data, and a rerun asking for a warm start stays cold.
    copy = tmp_path / "cold"
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("cpu-1of2"))
    first = resaware.tune(small_model, "50%", trials=8, store=copy, progress=False).budgets[0]
    again = resaware.tune(small_model, "50%", trials=12, store=copy, progress=False, warm_start=True).budgets[0]
    assert first.warm_from is None and again.warm_from is None
    assert not any(DONOR_MARK in k for k in _slot(copy, "cpu-1of2").load_cost_model(1).data)


def test_validation_log_survives_a_cut_line(tmp_path):
    hw = hardware.detect()
    slot = Store.open(tmp_path).slot(hw, "llvm", "cpu-1of2", 0.5, json.dumps({"kind": "llvm"}))
    assert slot.validation() is None
    slot.log_validation(120, 6, 8, 0.2)
    slot.log_validation(130, 3, 4, 0.4)
    with open(slot.validation_file, "a") as f:
        f.write('{"samples": 14')  # a tuner killed mid-line
    assert slot.validation() == Validated(pytest.approx(9 / 12), pytest.approx(0.3), 2, 130)
    assert slot.validation(last=1) == Validated(pytest.approx(3 / 4), pytest.approx(0.4), 1, 130)
    assert "75% of pairs, rmse 0.30 (2 batches)" in Store.open(tmp_path).show()


def test_pairwise_counts_ordered_pairs():
    assert pairwise([0.9, 0.5, 0.1], [1.0, 2.0, 3.0]) == (3, 3)
    assert pairwise([0.1, 0.5, 0.9], [1.0, 2.0, 3.0]) == (0, 3)
    assert pairwise([0.3, 0.2, 0.1], [1.0, None, 2.0]) == (1, 1)  # a failed candidate is no pair
    assert pairwise([0.5, 0.5], [1.0, 2.0]) == (0, 1)  # a tie in score orders nothing


def test_amdahl():
    assert amdahl([(0.5, 2.0), (1.0, 1.2)], 0.25) == pytest.approx(0.4 + 0.8 * 4)  # a = 0.4, b = 0.8
    assert amdahl([(1.0, 1.0)], 0.5) == pytest.approx(2.0)  # one point: perfect scaling
    assert amdahl([(0.5, 1.0), (1.0, 1.5)], 0.5) == pytest.approx(1.25)  # slower with more cores: no negative b


@two_cores
def test_predict_and_compile_the_predicted_budget(small_model, small_path, warm_store, small_store, tmp_path):
    store, _, _ = warm_store
    prediction = predict(small_model, "50%", store=store)
    rows = {r.key: r for r in prediction.rows}
    assert prediction.judge == "cpu-1of2" and set(rows) == {"cpu-1of2", "cpu-2of2"}
    # Its own budget's schedules are predicted at what they measured; the other's as its cost model ranks them.
    assert rows["cpu-1of2"].predicted_s == pytest.approx(rows["cpu-1of2"].measured_s)
    assert rows["cpu-2of2"].predicted_s > 0 and prediction.choice is not None
    compiled = resaware.compile(small_model, "50%", store=store, choose="predicted")
    assert compiled.info["tuned_slot"] == prediction.choice.key and compiled.info["chosen_by"] == "predicted"
    # With no cost model that ranks (8 records a budget), nothing tells the budgets apart: the nearest compiles.
    unranked = predict(small_model, "50%", store=small_store[0])
    assert unranked.judge is None and unranked.choice is None
    fallback = resaware.compile(small_model, "50%", store=small_store[0], choose="predicted")
    assert fallback.info["tuned_slot"] == "cpu-1of2"
    # A budget never tuned: best latencies scaled from the tuned one (one point: perfect scaling).
    shutil.copytree(store, tmp_path / "only100", ignore=shutil.ignore_patterns("cpu-1of2"))
    alone = predict(small_model, "50%", store=tmp_path / "only100")
    (row,) = alone.rows
    assert row.key == "cpu-2of2" and row.predicted_s == pytest.approx(2 * row.measured_s)
    assert any("not tuned at 50%" in note for note in alone.notes)
    # The CLI: a table, JSON, and one line for bad input.
    shown = run_cli("predict", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", store)
    assert shown.returncode == 0 and "<- fastest" in shown.stdout, shown.stderr
    data = json.loads(run_cli("predict", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", store,
                              "--json").stdout)  # fmt: skip
    assert data["choice"] == prediction.choice.key and len(data["rows"]) == 2
    bad = run_cli("predict", small_path, "--budget", "150%", "--store", store)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    empty = run_cli("predict", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", tmp_path / "empty")
    assert empty.returncode == 2 and "tune the model first" in empty.stderr
