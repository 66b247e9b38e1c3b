"""Split build and measure: candidates built here, timed in a separate process that has only the TVM
runtime, folded into the store, compiled from; and the GPU check's matrix logic, run on CPU budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_small_model, reference, relative_error, run_cli

import resaware
from resaware.budget import Budget
from resaware.platform import confine, hardware
from resaware.runtime import measure_built
from resaware.store import Store
from resaware.tuning import candidates

ROOT = Path(__file__).parent.parent


def test_build_measure_with_the_runtime_alone_fold_and_compile(small_model, small_path, tmp_path):
    out = tmp_path / "built"
    manifest = candidates.build(small_model, "llvm", out, per_task=3, top=2)
    ids = [c["id"] for c in manifest["candidates"]]
    assert len(manifest["tasks"]) == 2 and ids and all((out / f"{i}.so").exists() for i in ids)

    done = subprocess.run(
        [sys.executable, "-m", "resaware.runtime.measure_built", str(out), "--budgets", "50%,100%"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    timings = json.loads((out / "timings.json").read_text())
    usable = confine.usable_cores()
    for budget in ("50%", "100%"):
        entry = timings["budgets"][budget]
        assert entry["key"] == Budget.parse(budget).cpu(usable).key
        assert sorted(entry["results"]) == sorted(ids) and all(len(r["secs"]) == 5 for r in entry["results"].values())
        # the measuring process had neither the tvm package nor the compiler library loaded
        assert entry["measuring_process"] == {"tvm_package": False, "compiler_loaded": False}

    store = tmp_path / "store"
    added = candidates.fold(out, store)
    unique = {json.dumps(c["record"][0]) for c in manifest["candidates"]}
    assert set(added.values()) == {len(unique)}  # MetaSchedule may sample one schedule twice
    assert set(candidates.fold(out, store).values()) == {0}  # folding again adds nothing
    slots = {s.key: s for s in Store.open(store).slots()}
    for budget in ("50%", "100%"):
        slot = slots[Budget.parse(budget).cpu(usable).key]
        assert len(slot.database()) == len(unique)
        assert slot.load_cost_model(1).data_size == len(unique)  # trained on exactly the folded records
        assert slot.hardware.id == hardware.detect().id  # measured here, so keyed by this machine

    compiled = resaware.compile(small_model, budget="50%", store=store)
    assert compiled.info["tuned_tasks"] == 2 and compiled.info["records"] == len(unique)
    inputs = small_model.random_inputs(0)
    (ref,) = reference(small_path, {s.name: a for s, a in zip(small_model.inputs, inputs)})
    assert relative_error(compiled(*inputs)[0], ref) < 1e-4


def test_fold_keeps_a_budgets_records_timed_one_way(small_model, tmp_path):
    out = tmp_path / "built"
    candidates.build(small_model, "llvm", out, per_task=2, top=1)
    done = run_cli("candidates", "measure", out, "--budgets", "50%", "--caches", "warm")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "timings.json").read_text())["caches"] == "warm"
    store = tmp_path / "store"
    resaware.tune(small_model, "50%", trials=2, store=store, progress=False)  # flushed, the default
    (slot,) = Store.open(store).slots()
    before = slot.record_file.read_text()
    done = run_cli("candidates", "fold", out, "--store", store)
    assert done.returncode == 2 and "were timed flushed, these candidates warm" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert slot.record_file.read_text() == before  # nothing added, nothing lost
    flushed = measure_built.measure(out, ["50%"], repeat=2)
    assert flushed["caches"] == "flushed"
    assert all(len(r["secs"]) == 2 for r in flushed["budgets"]["50%"]["results"].values())
    assert set(candidates.fold(out, store).values()) != {0}


def test_candidates_cli_says_what_is_missing_in_one_line(tmp_path):
    for args, message in [
        (["candidates", "measure", tmp_path / "none", "--budgets", "50%"], "has no manifest.json"),
        (["candidates", "fold", tmp_path, "--store", tmp_path / "s"], "has no timings.json"),
        (["candidates", "measure", tmp_path, "--budgets", "150%"], "outside (0%, 100%]"),
    ]:
        done = run_cli(*args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_gpu_check_matrix_on_cpu_budgets(tmp_path):
    """The GPU check's CPU half and its matrix logic, with CPU budgets standing in for MPS shares."""
    model = make_small_model(tmp_path / "small1.onnx", batch=1)
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    built = subprocess.run([sys.executable, script, "build", "--model", model, "--kind", "llvm", "--top", "2",
                            "--per-task", "3", "--dir", str(tmp_path / "c")], capture_output=True, text=True)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    done = subprocess.run([sys.executable, script, "measure", str(tmp_path / "c"), "--budgets", "50%,100%",
                           "--rounds", "2", "--clients", "2", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert set(result["matrix_ms"]) == {"tuned at 50%", "tuned at 100%"}
    for row in result["matrix_ms"].values():
        assert set(row) == {"50%", "100%"} and all(0 < v < 1e3 for v in row.values())
    assert all(len(p) == 2 for p in result["picks"].values())  # a pick for each task at each budget
    sharing = result["spatial_sharing"]
    assert sharing["clients"] == min(2, Budget.parse("50%").cpu(confine.usable_cores()).max_concurrency)
    assert "tuned at \\ run at" in done.stdout


def test_tuning_by_rounds_follows_the_cost_model_after_the_first(small_model, small_path, tmp_path, capfd):
    """The loop CUDA budgets tune by where the GPU is (build, measure with the runtime alone, fold),
    run here on a CPU budget: round 1 samples at random, later rounds are the evolutionary search's
    picks from the budget's cost model, and nothing is measured twice."""
    store = tmp_path / "store"
    first = candidates.tune(small_model, "llvm", ["50%"], trials=8, store=store, per_round=4)
    held = candidates.tune(small_model, "llvm", ["50%"], trials=20, store=store, per_round=4)  # continues
    assert 8 <= first["50%"] < held["50%"] and held["50%"] >= 20
    (slot,) = Store.open(store).slots()
    records = slot.database().get_all_tuning_records()
    assert len(records) == held["50%"] and len(set(map(str, (r.trace for r in records)))) == len(records)
    assert slot.load_cost_model(1).data_size == len(records)
    rounds = [line for line in capfd.readouterr().err.splitlines() if "50% round" in line]
    assert len(rounds) >= 2
    compiled = resaware.compile(small_model, budget="50%", store=store)
    inputs = small_model.random_inputs(1)
    (ref,) = reference(small_path, {s.name: a for s, a in zip(small_model.inputs, inputs)})
    assert relative_error(compiled(*inputs)[0], ref) < 1e-4


def test_tuning_for_cuda_without_a_gpu_says_how_to_split_the_work(small_path, tmp_path):
    from resaware.platform import cuda

    if cuda.nvcc_path() is None or cuda.detect() is not None:
        pytest.skip("the refusal is for a machine with nvcc and no GPU, like CI's")
    done = run_cli("tune", small_path, "--shape", "x=1x3x16x16", "--budgets", "50%", "--trials", "8",
                   "--target", "cuda", "--store", tmp_path)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "resaware candidates build" in done.stderr and "measure_built" in done.stderr
