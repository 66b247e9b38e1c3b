"""Tuning really measures, keeps every record, and resumes where it stopped."""

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import two_cores, two_physical_cores
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture

import resaware
from resaware import ResawareError
from resaware.frontend.tasks import Task
from resaware.platform import confine, hardware
from resaware.store import Store, exchange
from resaware.tuning import clients
from resaware.tuning.measure import ConfinedRunner, Timing, _measure_one
from resaware.tuning.search import OPEN_BATCH, UNLIMITED, WeightedScheduler


def _record_lines(slot):
    return slot.record_file.read_text().splitlines()


@two_cores
def test_two_budgets_two_slots_with_exact_trials(small_store):
    store, report = small_store
    assert [b.budget for b in report.budgets] == ["50%", "100%"]
    half, full = report.budgets
    # One client each, measuring on the budget's cores (as seen from inside its worker); search and
    # builds use every core (at 50 %, the other one alone while a batch is timed there).
    assert half.cores == [1] and half.concurrency == 1 and half.clients[0].worker_cores == [1]
    assert full.cores == [0, 1] and full.clients[0].worker_cores == [0, 1]
    assert half.clients[0].tuner_cores == full.clients[0].tuner_cores == [0, 1]
    for result in report.budgets:
        assert result.trials_before == 0 and result.trials_total == 8 and result.stopped_by == "trials"
        assert any(t.best_s is not None and 0 < t.best_s < 1 for t in result.tasks)
        assert result.verification and all(0.2 < v.ratio < 5 for v in result.verification)
    slots = Store.open(store).slots()
    assert [(s.key, s.fraction) for s in slots] == [("cpu-1of2", 0.5), ("cpu-2of2", 1.0)]
    for slot in slots:
        lines = _record_lines(slot)
        assert len(lines) == 8 and all(json.loads(line) for line in lines)
        assert (slot.path.parent.parent / "hardware.json").exists()
        assert "record" in slot.record_file.name


def test_rerun_tunes_only_the_remainder_and_keeps_old_records(small_model, tmp_path):
    report = resaware.tune(small_model, "50%", trials=4, store=tmp_path, progress=False)
    (slot,) = Store.open(tmp_path).slots()
    old = _record_lines(slot)
    assert report.budgets[0].trials_total == len(old) == 4
    again = resaware.tune(small_model, "50%", trials=4, store=tmp_path, progress=False)
    assert again.budgets[0].stopped_by == "already tuned" and _record_lines(slot) == old
    more = resaware.tune(small_model, "50%", trials=10, store=tmp_path, progress=False)
    lines = _record_lines(slot)
    assert more.budgets[0].trials_before == 4 and more.budgets[0].trials_total == 10
    assert len(lines) == 10 and lines[:4] == old
    # The history continues from the store's count and its estimate from the store's best records:
    # once the first run covered every task, the resumed run has an estimate from its first batch.
    history = more.budgets[0].history
    assert history[0][1] > 4 and history[-1][1] == 10
    known = [e for _, _, e in history if e is not None]
    assert known == sorted(known, reverse=True)
    first = report.budgets[0].estimated_s
    if first is not None:
        assert history[0][2] is not None and history[0][2] <= first


def test_a_budget_keeps_the_timing_its_records_were_made_with(small_model, tmp_path, capsys):
    # Flushed by default: every record holds three samples, each the mean of flushed runs.
    fresh = resaware.tune(small_model, "50%", trials=4, store=tmp_path / "a", progress=False)
    assert fresh.budgets[0].caches == "flushed" and "caches flushed" in fresh.table()
    (slot,) = Store.open(tmp_path / "a").slots()
    samples = [json.loads(line)[1][1] for line in _record_lines(slot)]
    assert all(len(s) == 3 for s in samples if max(s) < 1e8)  # failed candidates hold one huge cost
    # A budget first tuned warm stays warm, so that its records rank alike; the run says so.
    warm = resaware.tune(small_model, "50%", trials=4, store=tmp_path / "b", progress=False, timing=Timing(flush=False))
    assert warm.budgets[0].caches == "warm"
    capsys.readouterr()
    more = resaware.tune(small_model, "50%", trials=6, store=tmp_path / "b", progress=False)
    assert more.budgets[0].caches == "warm" and more.budgets[0].trials_total == 6
    assert "timed warm" in capsys.readouterr().err
    # Nor do merges mix them: all or nothing, in one clear line.
    (warm_slot,) = Store.open(tmp_path / "b").slots()
    held = warm_slot.record_file.read_text()
    with pytest.raises(ResawareError, match="were timed warm, those of .* flushed: they would not rank alike"):
        exchange.merge([tmp_path / "a"], tmp_path / "b")
    assert warm_slot.record_file.read_text() == held
    # A store tuned before resaware wrote the timing down was timed warm.
    budget_json = slot.path / "budget.json"
    info = json.loads(budget_json.read_text())
    del info["caches"]
    budget_json.write_text(json.dumps(info))
    older = resaware.tune(small_model, "50%", trials=6, store=tmp_path / "a", progress=False)
    assert older.budgets[0].caches == "warm" and json.loads(budget_json.read_text())["caches"] == "warm"


def _scale_rows(path, rows: int, cols: int) -> tuple:
    """y[i, j] = w[i, j] x[j], x first: the flush leaves the input alone and evicts the weights and y.
    Element-wise, so LLVM vectorises it and its speed is the memory's, not the arithmetic's."""
    import tvm
    from tvm import te

    x = te.placeholder((cols,), name="x")
    w = te.placeholder((rows, cols), name="w")
    y = te.compute((rows, cols), lambda i, j: w[i, j] * x[j], name="y")
    tvm.compile(te.create_prim_func([x, w, y]), target=hardware.llvm_target(1)).export_library(str(path))
    return (("TENSOR", "float32", (cols,)), ("TENSOR", "float32", (rows, cols)), ("TENSOR", "float32", (rows, cols)))


def test_flushed_timing_reads_the_weights_from_memory(tmp_path):
    # 4 MB of weights and 4 MB out: more than a core's L2 here, within the L3, so warm runs read the L3
    # (2.2-2.5x faster than flushed on this CI's kind of machine).
    args = _scale_rows(tmp_path / "scale.so", 1024, 1024)
    runner = ConfinedRunner((0,))
    try:
        warm = runner.call(_measure_one, str(tmp_path / "scale.so"), "llvm", args, Timing(flush=False))
        cold = runner.call(_measure_one, str(tmp_path / "scale.so"), "llvm", args, Timing(flush=True))
    finally:
        runner.close()
    assert len(warm) == len(cold) == 3
    assert min(cold) > 1.3 * max(warm), (cold, warm)


def test_history_after_every_batch(small_store):
    _, report = small_store
    for result in report.budgets:
        seconds, trials, estimates = zip(*result.history)
        assert list(seconds) == sorted(seconds) and 0 < seconds[-1] <= result.wall_s
        assert list(trials) == sorted(trials) and trials[-1] == result.trials_total
        known = [e for e in estimates if e is not None]
        # Defined once every task has a record, then it can only improve; it ends at the report's figure.
        assert known == sorted(known, reverse=True)
        assert (known[-1] if known else None) == pytest.approx(result.estimated_s)


def test_time_limit_stops_early(small_model, tmp_path):
    report = resaware.tune(small_model, "100%", trials=40, store=tmp_path, time_limit=1, progress=False)
    result = report.budgets[0]
    assert result.stopped_by == "time" and 0 < result.trials_total < 40


@two_cores
@two_physical_cores
def test_at_the_time_limit_the_batch_timed_in_the_background_is_kept(small_model, tmp_path, monkeypatch):
    """At 50 % the tuner searches and builds the next batch while one is timed on the other core: it
    waits for its runner less than the runner measures, and when time runs out the batch still being
    timed is waited for, stored, and its built candidates removed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the build workers' artifacts, apart from any other run's
    masks = confine.thread_masks()[os.getpid()]
    report = resaware.tune(small_model, "50%", trials=None, store=tmp_path / "store", time_limit=15, progress=False)
    result = report.budgets[0]
    assert result.stopped_by == "time" and len(result.history) >= 2
    assert len(result.tasks) >= 2  # so that the next batch is another task's, searched while this one is timed
    client = result.clients[0]
    assert client.cores == [1] and client.tuner_cores == [0, 1]
    assert 0 < client.phases["run"] < client.measuring_s
    assert result.history[-1][1] == result.trials_total == client.trials
    assert not list((tmp_path / "resaware-artifacts").glob("*"))  # no batch was dropped unjoined
    assert confine.thread_masks()[os.getpid()] == masks


def test_report_json_and_table(small_store):
    _, report = small_store
    data = report.to_json()
    assert data["budgets"][0]["trials_run"] == 8 and data["budgets"][0]["tasks"]
    json.dumps(data)
    table = report.table()
    assert "50%" in table and "100%" in table and "8+0=8" in table


@pytest.mark.parametrize("trials", [-1, 2.5, True])
def test_bad_trials(small_model, tmp_path, trials):
    with pytest.raises(ResawareError, match="trials"):
        resaware.tune(small_model, "50%", trials=trials, store=tmp_path)


def test_time_alone_tunes_in_small_batches(small_model, tmp_path):
    report = resaware.tune(small_model, "100%", trials=None, store=tmp_path, time_limit=20, progress=False)
    result = report.budgets[0]
    assert result.stopped_by == "time" and result.trials_total > 0
    _, trials, _ = zip(*result.history)
    # A batch of OPEN_BATCH per task first, whatever the (unbounded) trial count would spread.
    assert max(b - a for a, b in zip((0, *trials), trials)) <= OPEN_BATCH
    with pytest.raises(ResawareError, match="time limit"):
        resaware.tune(small_model, "100%", trials=None, store=tmp_path)


def test_trials_follow_each_tasks_share_of_the_time():
    tasks = [Task("conv1x1", 1, 173e6, None), Task("conv3x3", 2, 54e6, None), Task("pool", 1, 2e6, None)]
    best = {0: 2.1e-3, 1: 1.6e-3}  # SqueezeNet after a first round: 82 and 34 GFLOP/s
    scheduler = WeightedScheduler(tasks, best)
    # By time, the 3x3 conv (3.2 ms a call) comes before the 1x1 conv with three times its FLOPs (2.1 ms).
    assert scheduler.share(1) == pytest.approx(3.2e-3) and scheduler.share(0) == pytest.approx(2.1e-3)
    # Not measured yet: its FLOPs at the median rate measured (of two, the faster: the 1x1 conv's).
    assert scheduler.share(2) == pytest.approx(2e6 / (173e6 / 2.1e-3))


@derived_object
class _Answer(PyRunnerFuture):
    def __init__(self, batch, i: int):
        super().__init__()
        self.batch, self.i = batch, i

    def done(self) -> bool:
        return self.batch.done()

    def result(self):
        return self.batch.result()[self.i]


@derived_object
class _AnswersLater(PyRunner):
    """Real measurements (a `ConfinedRunner`'s) answered from a thread: like TVM's RPC runner, `run` returns
    before the candidates are timed."""

    def __init__(self):
        super().__init__()
        self.runner, self.thread = ConfinedRunner((0,)), ThreadPoolExecutor(1)

    def run(self, runner_inputs):
        batch = self.thread.submit(lambda: [f.result() for f in self.runner.run(runner_inputs)])
        return [_Answer(batch, i) for i in range(len(runner_inputs))]

    def close(self) -> None:
        self.thread.shutdown()
        self.runner.close()


def test_a_task_still_measuring_is_joined_before_it_is_picked_again(small_model, tmp_path):
    """MetaSchedule refuses to send a task that holds unjoined results; with one task left (or the weights
    on one), the task picked next is the one still in flight."""
    target = hardware.llvm_target(1)
    task = resaware.tasks.extract(small_model, target)[0]
    slot = Store.open(tmp_path).slot(hardware.detect(), "llvm", "cpu-1of2", 0.5, hardware.target_json(target))
    slot.commit_workloads([task.mod])
    seen, runner = [], _AnswersLater()
    try:
        report = clients.tune_shard(
            [task], slot, slot.shared_database(), target, (0,), (0,), UNLIMITED, 0, 0, time.time() + 15, Timing(),
            lambda *a: seen.append(a), runner=runner,
        )  # fmt: skip
    finally:
        runner.close()
    # Open-ended, so one call to MetaSchedule sends batch after batch of the one task.
    assert report.stopped_by == "time" and len(seen) >= 2 and report.trials == sum(n for _, n, _ in seen)
    assert all(best is None or best > 0 for *_, best in seen)
