"""CUDA without a GPU: tasks for the CUDA target, kernels built by nvcc for sm_90, compiled models that
say where they can run, and ResNet-50 compiled from records measured on an H200 under MPS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_small_model, run_cli

import resaware
from resaware.platform import cuda

ROOT = Path(__file__).parent.parent
H200_STORE = ROOT / "benchmarks" / "results" / "gpu_check-h200-store.tar.gz"
FATBIN_MAGIC = b"\x50\xed\x55\xba"  # what nvcc --fatbin writes first; TVM keeps raw CUDA source otherwise

needs_nvcc = pytest.mark.skipif(cuda.nvcc_path() is None, reason="nvcc (the CUDA toolkit) is not installed")
no_gpu = pytest.mark.skipif(cuda.detect() is not None if cuda.nvcc_path() else False, reason="a GPU is present")


def _compiled_for(path: Path, arch: str) -> bool:
    data = path.read_bytes()
    return FATBIN_MAGIC in data and arch.encode() in data and b'extern "C" __global__' not in data


@needs_nvcc
def test_cuda_tasks_and_candidates_are_built_by_nvcc_for_sm90_here(small_model, tmp_path):
    tasks = resaware.tasks.of(small_model, target="cuda")
    model = make_small_model(tmp_path / "small1.onnx", batch=1)
    assert tasks and all(t.flops > 0 for t in tasks[:1])
    out = tmp_path / "candidates"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "build", "--model", model,
         "--kind", "cuda", "--top", "1", "--per-task", "3", "--dir", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["arch"] == "sm_90" and manifest["device"] == "cuda"
    ids = [c["id"] for c in manifest["candidates"]]
    assert "t0-default" in ids and len(ids) >= 2  # MetaSchedule's CUDA samples and dlight's default
    for candidate in manifest["candidates"]:
        assert _compiled_for(out / candidate["file"], "sm_90"), candidate["id"]
        assert candidate["args"][0][0] == "TENSOR"


@needs_nvcc
@no_gpu
def test_compile_for_cuda_builds_sm90_here_and_refuses_to_run_without_a_gpu(small_path, tmp_path):
    module = tmp_path / "small-cuda.so"
    done = run_cli("compile", small_path, "--shape", "x=2x3x16x16", "--budget", "25%", "--target", "cuda",
                   "--store", tmp_path / "store", "-o", module)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no GPU here" in done.stderr and "dlight" in done.stderr
    info = json.loads(Path(f"{module}.resaware.json").read_text())
    assert (info["target_kind"], info["arch"], info["realised"], info["tuned_at"]) == ("cuda", "sm_90", 0.25, None)
    assert _compiled_for(module, "sm_90")
    ran = run_cli("run", module)
    assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1
    assert "built for CUDA sm_90 and this machine has no GPU" in ran.stderr

    older = tmp_path / "small-sm80.so"
    done = run_cli("compile", small_path, "--shape", "x=2x3x16x16", "--budget", "50%", "--target", "cuda",
                   "--arch", "sm_80", "--store", tmp_path / "store", "-o", older)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert _compiled_for(older, "sm_80") and json.loads(Path(f"{older}.resaware.json").read_text())["arch"] == "sm_80"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "cuda", "--arch", "sm_50"], "older than CUDA 13 builds for"),
        (["--target", "cuda", "--arch", "volta"], "is not an SM architecture"),
        (["--arch", "sm_90"], "use it with --target cuda"),
    ],
)
def test_bad_arch_is_one_line_exit_2(small_path, tmp_path, args, message):
    done = run_cli("compile", small_path, "--shape", "x=1x3x16x16", "--budget", "50%", "--store", tmp_path,
                   "-o", tmp_path / "m.so", *args)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@needs_nvcc
@pytest.mark.slow
def test_resnet50_compiles_for_cuda_from_records_measured_on_an_h200(tmp_path, capfd):
    """The split workflow's end: records measured on a lent H200 under MPS (benchmarks/gpu_check.py),
    folded and exported there, imported here, compiled here for sm_90 with no GPU."""
    from resaware.store import exchange

    store = tmp_path / "store"
    exchange.import_(H200_STORE, store)
    compiled = resaware.compile("zoo:resnet50", budget="25%", store=store, target="cuda")
    info = compiled.info
    assert (info["tuned_at"], info["tuned_slot"], info["arch"]) == ("25%", "mps-25", "sm_90")
    assert info["tuned_on"].startswith("nvidia-h200-sm_90")
    assert info["tuned_tasks"] == 6 and info["records"] == 418  # two rounds of ResNet-50's six heaviest kernels
    assert "records measured at 25% (mps-25) on NVIDIA H200" in capfd.readouterr().err
    path = compiled.export(tmp_path / "resnet50-25.so")  # gpu_0/data_0 is no identifier: renamed inside
    assert _compiled_for(Path(path), "sm_90")
