"""Shared fixtures: small real ONNX models and stores tuned once per test session."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import resaware
from resaware.budget import apart_from


def save_model(path, name: str, nodes, inputs: dict, outputs: dict, inits=(), opset=13, ir_version=8) -> str:
    """Save the float32 graph `name` of `nodes`; `inputs` and `outputs` map names to shapes (None: unknown)."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs.items()],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.save(model, path)
    return str(path)


def make_small_model(path, batch="N") -> str:
    """Conv -> Relu -> global pool -> Gemm: every output depends on the input."""
    rng = np.random.default_rng(42)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32"), "w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype("float32"), "b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype("float32"), "fc_w"),
        numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype("float32"), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"]),
    ]
    return save_model(path, "small", nodes, {"x": [batch, 3, 16, 16]}, {"y": None}, inits)


def make_unsupported_model(path) -> str:
    """A model using operators no importer knows."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("FancyOp", ["a"], ["b"]),
        helper.make_node("OtherOp", ["b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def reference(path, inputs: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def run_cli(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "resaware.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def small_path(tmp_path_factory):
    return make_small_model(tmp_path_factory.mktemp("models") / "small.onnx")


@pytest.fixture(scope="session")
def small_model(small_path):
    return resaware.load_onnx(small_path, shapes={"x": (2, 3, 16, 16)})


@pytest.fixture(scope="session")
def small_store(tmp_path_factory, small_model):
    """The small model tuned at 50% and 100% with a few trials."""
    store = tmp_path_factory.mktemp("small-store")
    report = resaware.tune(small_model, ["50%", "100%"], trials=8, store=store, progress=False)
    return store, report


@pytest.fixture(scope="session")
def squeezenet_store(tmp_path_factory):
    """zoo:squeezenet tuned at 50% and 100% with a few trials."""
    store = tmp_path_factory.mktemp("squeezenet-store")
    report = resaware.tune("zoo:squeezenet", ["50%", "100%"], trials=8, store=store, progress=False)
    return store, report


two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
# The tuner keeps off a timed core's SMT sibling: searching beside a batch needs two physical cores.
two_physical_cores = pytest.mark.skipif(
    not apart_from(os.sched_getaffinity(0), [max(os.sched_getaffinity(0))]), reason="needs two physical cores"
)
