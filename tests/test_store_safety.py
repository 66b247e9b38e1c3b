"""The store never loses work: kills, Ctrl-C, corrupt lines, concurrent writers, crashing candidates."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import run_cli

import resaware
from resaware.store import Store, exchange
from resaware.tuning import measure


def _slot(root, key="cpu-1of2"):
    (slot,) = [s for s in Store.open(root).slots() if s.key == key]
    return slot


def _record_lines(slot) -> list[str]:
    return [line for line in slot.record_file.read_text().splitlines() if line.strip()]


def _copy(store, tmp_path, name="copy"):
    return shutil.copytree(store, tmp_path / name)


def test_corrupt_and_cut_lines_are_set_aside_with_file_and_line(small_store, small_model, tmp_path, capfd):
    root = _copy(small_store[0], tmp_path)
    slot = _slot(root)
    lines = _record_lines(slot)
    damaged = [lines[0], "this is not json", "", '{"a": 1}', *lines[1:-1], lines[-1][: len(lines[-1]) // 2]]
    slot.record_file.write_text("\n".join(damaged))  # the last line cut short, as a SIGKILL mid-append leaves it

    database = slot.database()
    err = capfd.readouterr().err
    assert len(database) == len(lines) - 1  # only the cut record is lost
    for number in (2, 4, len(damaged)):
        assert f"skipped line {number} of {slot.record_file}" in err, err
    assert "cut short" in err
    corrupt = (slot.path / "database_tuning_record.json.corrupt").read_text().splitlines()
    assert corrupt == ["this is not json", '{"a": 1}', damaged[-1]]  # kept aside, not deleted
    assert _record_lines(slot) == lines[:-1]  # the rest untouched, in order

    assert len(slot.database()) == len(lines) - 1 and capfd.readouterr().err == ""  # repaired once
    report = resaware.tune(small_model, "50%", trials=len(lines) + 4, store=root, progress=False)
    assert report.budgets[0].trials_total >= len(lines) + 4  # tuning appends after the repaired file


def test_a_lost_workload_line_sets_aside_only_its_records(small_store, tmp_path, capfd):
    root = _copy(small_store[0], tmp_path)
    slot = _slot(root)
    records = [json.loads(line) for line in _record_lines(slot)]
    used = sorted({index for index, _ in records})
    workloads = slot.workload_file.read_text().splitlines()
    lost = used[0]
    workloads[lost] = workloads[lost][:40]
    slot.workload_file.write_text("\n".join(workloads) + "\n")

    database = slot.database()
    assert len(database) == sum(1 for index, _ in records if index != lost)
    err = capfd.readouterr().err
    assert f"skipped line {lost + 1} of {slot.workload_file}" in err
    survivors = {int(s) for s in slot.stats()}
    assert len(survivors) == len(used) - 1


WRITER = textwrap.dedent(
    """
    import sys
    from tvm.s_tir.meta_schedule.database import TuningRecord
    from resaware.store import Slot

    slot = Slot.open(sys.argv[1])
    database = slot.shared_database()
    base = list(slot.database().get_all_tuning_records())[0]
    writer = int(sys.argv[2])
    for i in range(int(sys.argv[3])):
        secs = [1e-3 * writer + 1e-7 * i]
        database.commit_tuning_record(TuningRecord(base.trace, base.workload, secs, base.target, base.args_info))
    """
)


def test_two_processes_appending_at_once_lose_and_corrupt_nothing(small_store, tmp_path):
    root = _copy(small_store[0], tmp_path)
    slot = _slot(root)
    before = len(_record_lines(slot))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    n = 300
    writers = [subprocess.Popen([sys.executable, str(script), str(slot.path), str(w), str(n)]) for w in (1, 2)]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    database = slot.database()  # loads: every line whole
    assert len(database) == before + 2 * n
    secs = {round(float(r.run_secs[0]), 10) for r in database.get_all_tuning_records()}
    for w in (1, 2):
        assert {round(1e-3 * w + 1e-7 * i, 10) for i in range(n)} <= secs
    assert not (slot.path / "database_tuning_record.json.corrupt").exists()


def _tune_cli(model, store, trials):
    return [sys.executable, "-m", "resaware.cli", "tune", model, "--shape", "x=2x3x16x16", "--budgets", "50%",
            "--trials", str(trials), "--store", str(store), "--no-progress"]  # fmt: skip


def _wait_for_slot(store, process, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the tuner ended before it made its budget's directory"
        found = list(store.glob("*/llvm/cpu-1of2"))
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no budget directory in {store} after {timeout} s")


def _wait_for_records(slot_dir, at_least, process, timeout=600):
    path = slot_dir / "database_tuning_record.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the tuner finished before it could be interrupted"
        if path.exists() and sum(1 for line in path.read_text().splitlines() if line.strip()) >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {at_least} records in {path} after {timeout} s")


def test_second_tuner_of_a_budget_is_refused_in_one_line(small_store, small_path, tmp_path):
    root = _copy(small_store[0], tmp_path)
    before = _record_lines(_slot(root))
    with _slot(root).locked():  # as a running tuner holds it
        done = run_cli("tune", small_path, "--shape", "x=2x3x16x16", "--budgets", "50%", "--trials", "64",
                       "--store", root)  # fmt: skip
    assert done.returncode == 2 and "another tuner is writing" in done.stderr and "Traceback" not in done.stderr
    assert _record_lines(_slot(root)) == before  # the running tuner's budget untouched


def test_ctrl_c_then_sigkill_mid_tuning_then_resume_loses_nothing(small_path, tmp_path):
    store = tmp_path / "store"
    trials = 48

    # Ctrl-C: stops after saving; the cost model is kept with the records.
    tuner = subprocess.Popen(
        _tune_cli(small_path, store, trials), stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    slot_dir = _wait_for_slot(store, tuner)
    _wait_for_records(slot_dir, 8, tuner)
    os.killpg(tuner.pid, signal.SIGINT)
    _, err = tuner.communicate(timeout=300)
    assert tuner.returncode == 130, err
    assert "interrupted" in err and "kept" in err and "Traceback" not in err
    interrupted = _record_lines(_slot(store))
    assert (slot_dir / "cost_model.tar").exists()

    # SIGKILL: the process and its workers die at once, maybe mid-append.
    tuner = subprocess.Popen(_tune_cli(small_path, store, trials), stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for_records(slot_dir, len(interrupted) + 8, tuner)
    os.killpg(tuner.pid, signal.SIGKILL)
    tuner.wait(timeout=60)
    killed = [line for line in (slot_dir / "database_tuning_record.json").read_text().split("\n")[:-1] if line]

    done = subprocess.run(_tune_cli(small_path, store, trials), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    final = _record_lines(_slot(store))
    assert final[: len(interrupted)] == interrupted  # nothing measured before is lost
    assert set(killed) <= set(final)  # every whole line the killed run wrote is kept
    assert len(final) >= trials
    assert len(_slot(store).database()) == len(final)


@pytest.fixture
def foreign_store(small_store, tmp_path):
    """The small store as if tuned on another CPU (another mcpu and ISA)."""
    from dataclasses import replace

    from resaware.platform import hardware

    here = hardware.detect()
    other = replace(here, mcpu="skylake-avx512", isa=("sse4_2", "avx", "avx2", "fma", "avx512f"), usable_cores=8)
    root = _copy(small_store[0], tmp_path, "foreign")
    os.rename(root / here.id, root / other.id)
    (root / other.id / "hardware.json").write_text(json.dumps(other.to_json()))
    return root, here, other


def test_records_of_other_hardware_refused_with_the_field_table(foreign_store, small_path, small_model, tmp_path):
    root, here, other = foreign_store
    with pytest.raises(resaware.ResawareError) as refused:
        resaware.compile(small_model, "50%", store=root)
    message = str(refused.value)
    assert "only for other hardware" in message and "--allow-mismatch" in message
    rows = {line.split()[0]: line for line in message.splitlines()[1:] if line.startswith("  ")}
    assert set(rows) >= {"field", "cpu_model", "mcpu", "isa", "machine", "tvm_version", "usable_cores"}
    assert here.mcpu in rows["mcpu"] and "skylake-avx512" in rows["mcpu"] and rows["mcpu"].endswith("<- differs")
    assert rows["isa"].endswith("<- differs") and not rows["tvm_version"].endswith("differs")
    assert not rows["usable_cores"].endswith("differs")  # the budget's share key says the cores

    done = run_cli("compile", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", root,
                   "-o", tmp_path / "m.so")  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "skylake-avx512" in done.stderr and "<- differs" in done.stderr

    compiled = resaware.compile(small_model, "50%", store=root, allow_mismatch=True)
    assert compiled.info["tuned_on"] == other.id and compiled.info["tuned_tasks"] > 0
    done = run_cli("compile", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", root,
                   "-o", tmp_path / "m.so", "--allow-mismatch")  # fmt: skip
    assert done.returncode == 0 and "using records of other hardware" in done.stderr

    # The module remembers: run far from its budget, or on this other machine, and it says so.
    done = run_cli("run", tmp_path / "m.so", "--budget", "100%", "--repeat", "3")
    assert done.returncode == 0, done.stderr
    assert "tuned at 50% and runs at 100%" in done.stderr and f"tuned on other hardware ({other.id}" in done.stderr


def test_merge_two_stores_is_the_union_and_idempotent(small_store, squeezenet_store, small_model, tmp_path):
    into = tmp_path / "merged"
    counts = {}
    for root in (small_store[0], squeezenet_store[0]):
        for slot in Store.open(root).slots():
            counts[slot.key] = counts.get(slot.key, 0) + len(_record_lines(slot))
    first = exchange.merge([small_store[0], squeezenet_store[0]], into)
    assert sum(m.added for m in first) == sum(counts.values()) and all(m.duplicates == 0 for m in first)
    again = exchange.merge([small_store[0]], into)
    assert sum(m.added for m in again) == 0 and sum(m.duplicates for m in again) > 0
    for slot in Store.open(into).slots():
        assert len(_record_lines(slot)) == len(slot.database()) == counts[slot.key]
        model = slot.load_cost_model(1)
        assert model.data_size == counts[slot.key]  # retrained on exactly the union
        models = {m for entry in slot.task_names().values() for m in entry["models"]}
        assert {"small", "squeezenet"} <= models
    compiled = resaware.compile(small_model, "50%", store=into)
    assert compiled.info["tuned_tasks"] == _compiled_tuned(small_model, small_store[0])
    with pytest.raises(resaware.ResawareError, match="destination itself"):
        exchange.merge([into], into)


def _compiled_tuned(model, store):
    return resaware.compile(model, "50%", store=store).info["tuned_tasks"]


def test_plan_tune_then_compile_on_a_second_machine(small_path, tmp_path):
    twin = tmp_path / "twin.onnx"
    shutil.copy(small_path, twin)  # a second model sharing every kernel
    plan = tmp_path / "plan.json"
    done = run_cli("record", small_path, twin, "--shape", "x=2x3x16x16", "--budgets", "50%", "-o", plan)
    assert done.returncode == 0, done.stderr
    data = json.loads(plan.read_text())
    assert data["models"] == ["small", "twin"] and data["budgets"] == ["50%"]
    assert all(t["models"] == {"small": 1, "twin": 1} and t["weight"] == 2 for t in data["tasks"])

    store = tmp_path / "tuning-machine"
    done = run_cli("tune", "--plan", plan, "--trials", "8", "--store", store, "--no-progress")
    assert done.returncode == 0, done.stderr
    archive = tmp_path / "store.tar.gz"
    assert run_cli("store", "export", "--store", store, "-o", archive).returncode == 0

    deploy = tmp_path / "deploy-machine"  # a fresh store directory, filled only from the archive
    done = run_cli("store", "import", archive, "--store", deploy)
    assert done.returncode == 0 and "8 added" in done.stdout, done.stdout + done.stderr
    before = _record_lines(_slot(deploy))
    out = tmp_path / "m.so"
    done = run_cli("compile", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--store", deploy, "-o", out)
    assert done.returncode == 0, done.stderr
    info = json.loads((tmp_path / "m.so.resaware.json").read_text())
    assert info["tuned_at"] == "50%" and info["tuned_tasks"] >= 1 and info["records"] == 8
    assert _record_lines(_slot(deploy)) == before  # compiling measured nothing


def test_a_crashing_or_hanging_candidate_fails_alone(tmp_path):
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerInput
    from tvm.script import tirx as T

    from resaware.platform import hardware

    @T.prim_func
    def fine(A: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for i in range(16):
            A[i] = A[i] + T.float32(1)

    @T.prim_func
    def crash(A: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        T.evaluate(T.call_extern("int32", "abort"))

    @T.prim_func
    def hang(A: T.Buffer((16,), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        T.evaluate(T.call_extern("int32", "sleep", 3600))

    target = hardware.llvm_target(1)
    inputs = []
    for func in (fine, crash, hang, fine):
        mod = tvm.IRModule({"main": func})
        args = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
        inputs.append(RunnerInput(measure.build_one(mod, target), "cpu", args))
    runner = measure.ConfinedRunner((0,), measure.Timing(timeout_s=5))
    try:
        results = [f.result() for f in runner.run(inputs)]
    finally:
        runner.close()
        for item in inputs:
            measure.remove_artifact(item.artifact_path)
    assert results[0].error_msg is None and results[3].error_msg is None  # the worker came back
    assert "failed" in results[1].error_msg and "timed out" in results[2].error_msg
    assert results[1].run_secs is None and results[2].run_secs is None
