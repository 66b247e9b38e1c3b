"""Compiled modules match ONNX Runtime, choose records by budget, round-trip, run with the runtime alone."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import reference, relative_error, two_cores

import resaware
from resaware import ResawareError
from resaware.store import Slot, nearest


def _check_against_onnxruntime(compiled, model, path):
    outs = []
    for seed in (0, 1):
        inputs = model.random_inputs(seed)
        (out,) = compiled(*inputs)
        (ref,) = reference(path, {s.name: a for s, a in zip(model.inputs, inputs)})
        assert out.shape == ref.shape
        assert relative_error(out, ref) < 1e-4
        outs.append(out)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3 * np.abs(outs[0]).max()  # the output depends on the input


@two_cores
@pytest.mark.parametrize("budget, tuned_at", [("50%", "50%"), ("100%", "100%"), ("75%", "100%")])
def test_small_model_compiles_from_matching_records(small_model, small_path, small_store, budget, tuned_at, capfd):
    store, _ = small_store
    compiled = resaware.compile(small_model, budget=budget, store=store)
    assert compiled.info["tuned_at"] == tuned_at and compiled.info["budget"] == budget
    assert "records tuned at" in capfd.readouterr().err
    _check_against_onnxruntime(compiled, small_model, small_path)


@pytest.mark.slow
@two_cores
@pytest.mark.parametrize("budget", ["50%", "100%"])
def test_squeezenet_tuned_matches_onnxruntime(squeezenet_store, budget):
    store, report = squeezenet_store
    assert all(b.trials_total == 8 for b in report.budgets)
    model = resaware.load_onnx("zoo:squeezenet")
    compiled = resaware.compile(model, budget=budget, store=store)
    assert compiled.info["tuned_tasks"] >= 1 and compiled.info["default_tasks"] >= 1
    _check_against_onnxruntime(compiled, model, model.source)


def test_empty_store_warns_and_still_compiles(small_model, small_path, tmp_path, capfd):
    compiled = resaware.compile(small_model, budget="100%", store=tmp_path / "empty")
    err = capfd.readouterr().err
    assert "no records for this hardware" in err and "have no tuning records" in err
    assert compiled.info["tuned_at"] is None and compiled.info["default_tasks"] == compiled.info["tasks"]
    _check_against_onnxruntime(compiled, small_model, small_path)


def test_export_load_roundtrip_and_runtime_only_process(small_model, small_store, tmp_path):
    store, _ = small_store
    compiled = resaware.compile(small_model, budget="50%", store=store)
    path = compiled.export(tmp_path / "small.so")
    inputs = small_model.random_inputs(3)
    expected = compiled(*inputs)[0]
    loaded = resaware.load(path)
    assert loaded.info["budget"] == "50%" and loaded.info["hardware"] == compiled.info["hardware"]
    np.testing.assert_array_equal(loaded({"x": inputs[0]})[0], expected)
    np.save(tmp_path / "x.npy", inputs[0])
    code = (
        "import sys, numpy as np, resaware, tvm;"
        "m = resaware.load(sys.argv[1]); np.save(sys.argv[3], m(np.load(sys.argv[2]))[0]);"
        "import tvm_ffi; print(tvm_ffi.get_global_func('relax.build', allow_missing=True) is None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path, tmp_path / "x.npy", tmp_path / "y.npy"],
        env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # the compiler really was not loaded
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


def test_benchmark_runs_confined(small_model, small_store):
    store, _ = small_store
    compiled = resaware.compile(small_model, budget="50%", store=store)
    latency = compiled.benchmark(repeat=10)
    assert latency.runs >= 10 and 0 < latency.p10_ms <= latency.median_ms <= latency.p90_ms
    assert len(latency.cores) == resaware.Budget(0.5).core_count(len(os.sched_getaffinity(0)))


def test_wrong_inputs_name_the_input(small_model, small_store):
    store, _ = small_store
    compiled = resaware.compile(small_model, budget="50%", store=store)
    x = small_model.random_inputs(0)[0]
    with pytest.raises(
        ResawareError,
        match=r"input 'x' must be float32 of shape \(2, 3, 16, 16\), got float32 of shape \(1, 3, 16, 16\)",
    ):
        compiled(x[:1])
    with pytest.raises(ResawareError, match="input 'x' must be float32.*got float64"):
        compiled(x.astype("float64"))
    with pytest.raises(ResawareError, match="takes 1 input"):
        compiled(x, x)
    with pytest.raises(ResawareError, match="missing"):
        compiled({"y": x})


def test_load_rejects_missing_and_garbage(tmp_path):
    with pytest.raises(ResawareError, match="does not exist"):
        resaware.load(tmp_path / "none.so")
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not a library")
    with pytest.raises(ResawareError, match="not a compiled TVM module"):
        resaware.load(bad)


def _slot(tmp_path, fraction):
    return Slot(tmp_path, None, "llvm", f"k{fraction}", {"fraction": fraction})


def test_nearest_budget_ties_go_to_the_larger(tmp_path):
    slots = [_slot(tmp_path, f) for f in (0.25, 0.5, 1.0)]
    assert nearest(slots, 0.375).fraction == 0.5
    assert nearest(slots, 0.75).fraction == 1.0
    assert nearest(slots, 0.3).fraction == 0.25
    assert nearest([], 0.5) is None
    json.dumps([s.info for s in slots])
