"""The CLI end to end, and bad input: one clear line, exit code 2, no traceback."""

import json

import numpy as np
import pytest
from conftest import make_small_model, make_unsupported_model, reference, relative_error, run_cli


def _one_line_error(done, *phrases):
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("resaware: error: "), done.stderr
    assert "Traceback" not in done.stderr
    for phrase in phrases:
        assert phrase in lines[0]


def test_zoo_lists_models():
    done = run_cli("zoo")
    assert done.returncode == 0 and "zoo:squeezenet" in done.stdout.split()


def test_tasks_lists_kernels(small_path):
    done = run_cli("tasks", small_path, "--shape", "x=2x3x16x16")
    assert done.returncode == 0, done.stderr
    assert "fused_conv2d" in done.stdout and "tasks," in done.stdout


def test_tune_compile_run_show(tmp_path):
    model = make_small_model(tmp_path / "m.onnx", batch=1)
    store = tmp_path / "store"
    done = run_cli("tune", model, "--budgets", "50%", "--trials", "4", "--store", store, "--json", "--caches", "warm")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["budgets"][0]["trials_total"] == 4 and report["budgets"][0]["budget"] == "50%"
    assert report["budgets"][0]["caches"] == "warm"

    shown = run_cli("store", "show", "--store", store, "-v")
    assert shown.returncode == 0 and "50%" in shown.stdout and "cpu-" in shown.stdout and "trials" in shown.stdout

    out = tmp_path / "m.so"
    done = run_cli("compile", model, "--budget", "50%", "--store", store, "-o", out)
    assert done.returncode == 0, done.stderr
    assert out.exists() and "tuned at 50%" in done.stdout

    x = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    done = run_cli("run", out, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--repeat", "5")
    assert done.returncode == 0, done.stderr
    assert "latency:" in done.stdout and "ms median" in done.stdout
    (ref,) = reference(model, {"x": x})
    assert relative_error(np.load(tmp_path / "out.npz")["y"], ref) < 1e-4


@pytest.mark.parametrize(
    "args, phrases",
    [
        (["tune", "/no/such.onnx", "--budgets", "50%", "--trials", "4"], ["does not exist"]),
        (["tune", "zoo:squeezenet", "--budgets", "150%", "--trials", "4"], ["150%", "outside"]),
        (["tune", "zoo:squeezenet", "--budgets", "half", "--trials", "4"], ["half", "not a number"]),
        (["tune", "zoo:squeezenet", "--budgets", "50%", "--trials", "-3"], ["--trials"]),
        (["tune", "zoo:squeezenet", "--budgets", "50%", "--trials", "4", "--time", "soon"], ["--time", "duration"]),
        (["tune", "zoo:lenet", "--budgets", "50%", "--trials", "4"], ["no zoo model", "squeezenet"]),
        (["compile", "zoo:squeezenet", "--budget", "0", "-o", "x.so"], ["outside"]),
        (["run", "/no/such.so"], ["does not exist"]),
        (["tune", "zoo:squeezenet", "--budgets", "50%"], ["--trials"]),
        (["tune", "zoo:squeezenet", "--budgets", "50%", "--time", "1m", "--target", "cuda"], ["CUDA", "--trials"]),
        (["tune", "--trials", "4"], ["a model or --plan"]),
        (["tune", "--plan", "/no/plan.json", "--trials", "4"], ["does not exist", "resaware record"]),
        (
            ["record", "zoo:squeezenet", "--budgets", "50%", "--shape", "y=1x2", "-o", "p.json"],
            ["y", "none of the models"],
        ),
        (["store", "merge", "/no/store", "--into", "/tmp/resaware-never"], ["does not exist"]),
        (["store", "import", "/no/archive.tar.gz"], ["does not exist", "store export"]),
    ],
)
def test_bad_input_one_line_exit_2(args, phrases):
    _one_line_error(run_cli(*args), *phrases)


def test_bad_files_one_line_exit_2(tmp_path, small_path):
    custom = make_unsupported_model(tmp_path / "custom.onnx")
    _one_line_error(
        run_cli("tune", custom, "--budgets", "50%", "--trials", "4", "--store", tmp_path / "s"),
        "unsupported ONNX operators: FancyOp",
    )
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage" * 100)
    _one_line_error(run_cli("tasks", bad), "not an ONNX model")
    _one_line_error(run_cli("tasks", small_path), "--shape", "N unbound")
    _one_line_error(run_cli("tasks", small_path, "--shape", "x=2xq"), "NAME=DxD")
    _one_line_error(run_cli("run", bad), "not a compiled TVM module")
