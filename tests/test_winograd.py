"""Winograd convolutions (`--layout NHWC-winograd`): only 3x3 stride-1 convolutions change, the outputs
stay ONNX Runtime's, the weights' transform folds away, and a store tuned so compiles so under `auto`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import reference, relative_error, save_model
from onnx import helper, numpy_helper

import resaware
from resaware.errors import ResawareError
from resaware.frontend import intrinsics
from resaware.frontend.tasks import lower
from resaware.platform import hardware


@pytest.fixture(scope="module")
def mixed_path(tmp_path_factory):
    """A 3x3 stride-1 convolution on 10x10 (not whole 4x4 tiles), a 3x3 stride-2 one and a 1x1 one, batch 2."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32"), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype("float32"), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 3, 3)).astype("float32"), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 1, 1)).astype("float32"), "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["c2", "w3"], ["y"]),
    ]
    path = tmp_path_factory.mktemp("winograd") / "mixed.onnx"
    return save_model(path, "mixed", nodes, {"x": [2, 3, 10, 10]}, {"y": [2, 4, 5, 5]}, inits)


def test_only_3x3_stride_1_convolutions_become_winograd_and_the_outputs_stay(mixed_path, tmp_path):
    intrinsics.register("llvm")
    model = resaware.load_onnx(mixed_path, layout="NHWC-winograd")
    lowered, layout = lower(model, hardware.llvm_target(1))
    kernels = sorted(gv.name_hint for gv in lowered.functions)
    assert layout == "NHWC-winograd"
    # The first convolution (with its bias and ReLU) is Winograd; its weights' transform ran at compile time.
    assert [k for k in kernels if "winograd" in k] == ["fused_conv2d_winograd_add_relu"]
    assert sum(k.startswith("conv2d") or k.startswith("fused_conv2d") for k in kernels) == 3
    direct = lower(model, hardware.llvm_target(1), "NHWC")[0]
    assert not any("winograd" in gv.name_hint for gv in direct.functions)
    # Asked of a model whose 3x3 convolutions are all grouped or strided, it lowers (and says) NHWC.
    assert lower(resaware.load_onnx("zoo:shufflenet", layout="NHWC-winograd"), hardware.llvm_target(1))[1] == "NHWC"
    (x,) = model.random_inputs(2)
    compiled = resaware.compile(model, "50%", store=tmp_path)  # untuned: design-space samples
    assert compiled.info["layout"] == "NHWC-winograd"
    (out,) = compiled(x)
    assert relative_error(out, reference(mixed_path, {"x": x})[0]) < 1e-5


def test_a_store_tuned_with_winograd_compiles_with_it_under_auto(mixed_path, tmp_path, capfd):
    model = resaware.load_onnx(mixed_path, layout="NHWC-winograd")
    report = resaware.tune(model, "50%", trials=6, store=tmp_path, progress=False)
    result = report.budgets[0]
    assert result.layout == "NHWC-winograd"
    winograd = [t for t in result.tasks if "winograd" in t.name]
    assert winograd and all(t.best_s is not None for t in winograd)  # built, measured and stored
    compiled = resaware.compile(resaware.load_onnx(mixed_path), "50%", store=tmp_path)  # auto
    tuned = sum(t.best_s is not None for t in result.tasks)
    assert compiled.info["layout"] == "NHWC-winograd" and compiled.info["tuned_tasks"] == tuned
    assert "the store's records are of NHWC-winograd convolutions" in capfd.readouterr().err
    (x,) = model.random_inputs(0)
    (out,) = compiled(x)
    assert relative_error(out, reference(mixed_path, {"x": x})[0]) < 1e-5


def test_winograd_is_for_cpu_targets(mixed_path):
    from resaware.platform import cuda

    with pytest.raises(ResawareError, match="NHWC-winograd is for CPU"):
        lower(resaware.load_onnx(mixed_path, layout="NHWC-winograd"), cuda.target("sm_90"))
