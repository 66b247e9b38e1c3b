"""Convolution layout: NHWC on CPU by default, the same outputs as ONNX Runtime, and stores tuned in
NCHW still compiled from their records."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import reference, relative_error, run_cli, save_model
from onnx import TensorProto, helper, numpy_helper

import resaware
from resaware.deploy.predict import predict
from resaware.errors import ResawareError
from resaware.frontend import intrinsics
from resaware.frontend.layout import convert
from resaware.frontend.tasks import lower
from resaware.platform import hardware
from resaware.store import Store


def make_residual_model(path) -> str:
    """Two convolutions, a Dropout and a three-input Sum: what ConvertLayout refuses as TVM imports it."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype("float32"), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype("float32"), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 1, 1)).astype("float32"), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (1, 8, 1, 1)).astype("float32"), "shift"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Dropout", ["c1"], ["d", "mask"], ratio=0.5),
        helper.make_node("Relu", ["d"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Sum", ["r1", "c2", "shift"], ["s"]),  # the third input broadcasts
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    return save_model(
        path, "residual", nodes, {"x": [1, 3, 12, 12]}, {"y": [1, 8, 12, 12]}, inits, opset=11, ir_version=6
    )


@pytest.fixture(scope="module")
def residual_path(tmp_path_factory):
    return make_residual_model(tmp_path_factory.mktemp("layout") / "residual.onnx")


def test_auto_is_nhwc_on_cpu_and_as_imported_on_cuda(residual_path):
    from resaware.platform import cuda

    intrinsics.register("llvm")
    model = resaware.load_onnx(residual_path)
    lowered, layout = lower(model, hardware.llvm_target(1))
    assert layout == "NHWC" and 'data_layout="NHWC"' in convert(model.mod, "NHWC")[0].script()
    # Dropout is gone and the Sum became adds that fuse into the second convolution.
    kernels = [gv.name_hint for gv in lowered.functions]
    assert not any("dropout" in k or "stack" in k for k in kernels) and "fused_conv2d1_add1_add_relu" in kernels
    assert lower(model, hardware.llvm_target(1), "NCHW")[1] == "NCHW"
    assert lower(model, cuda.target("sm_90"))[1] == "NCHW"
    # A model without convolutions has no layout to convert.
    assert lower(resaware.load_onnx("zoo:encoder"), hardware.llvm_target(1))[1] is None


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_both_layouts_match_onnxruntime(residual_path, tmp_path, layout):
    model = resaware.load_onnx(residual_path, layout=layout)
    (x,) = model.random_inputs(3)
    compiled = resaware.compile(model, "50%", store=tmp_path)
    assert compiled.info["layout"] == layout
    (expected,) = reference(residual_path, {"x": x})
    (out,) = compiled(x)
    assert relative_error(out, expected) < 1e-5


def test_a_store_tuned_in_nchw_compiles_in_nchw_until_tuned_in_nhwc(small_path, tmp_path, capfd):
    model = resaware.load_onnx(small_path, shapes={"x": (1, 3, 16, 16)})
    first = resaware.tune(model, "50%", trials=4, store=tmp_path, progress=False, layout="NCHW")
    assert first.budgets[0].layout == "NCHW" and "(NCHW convolutions, caches flushed)" in first.table()
    tuned = sum(t.best_s is not None for t in first.budgets[0].tasks)
    compiled = resaware.compile(model, "50%", store=tmp_path)  # auto: NHWC has no records, NCHW has
    assert compiled.info["layout"] == "NCHW" and compiled.info["tuned_tasks"] == tuned >= 1
    assert "the store's records are of NCHW convolutions" in capfd.readouterr().err
    # Predictions read the same kernels compile would compile.
    (row,) = predict(model, "50%", store=tmp_path).rows
    assert row.covered == tuned
    # Tuned again in the default layout: its kernels are other workloads, tuned from scratch beside the old.
    again = resaware.tune(model, "50%", trials=4, store=tmp_path, progress=False)
    assert again.budgets[0].layout == "NHWC" and again.budgets[0].trials_before == 0
    compiled = resaware.compile(model, "50%", store=tmp_path)
    assert compiled.info["layout"] == "NHWC" and compiled.info["tuned_tasks"] >= 1
    assert resaware.compile(model, "50%", store=tmp_path, layout="NCHW").info["tuned_tasks"] == tuned  # kept
    # The model's tasks in the store are now the NHWC ones (its curve and estimate follow them).
    (slot,) = Store.open(tmp_path).slots()
    mine = {int(h) for h, entry in slot.task_names().items() if "small" in entry["models"]}
    assert mine == {t.workload_hash for t in resaware.tasks.of(model, "50%")} and len(slot.task_names()) > len(mine)


@pytest.mark.parametrize("name", ["shufflenet", "inception_v1"])
def test_grouped_convolutions_concat_and_lrn_match_onnxruntime_in_nhwc(name, tmp_path):
    """Untuned (default schedules): the conversion, not the tuning, is what this checks."""
    from resaware.analysis import reference

    model = resaware.load_onnx(f"zoo:{name}")
    inputs = model.random_inputs(0)
    compiled = resaware.compile(model, "50%", store=tmp_path)
    assert compiled.info["layout"] == "NHWC"
    assert max(relative_error(o, e) for o, e in zip(compiled(*inputs), reference.outputs(model, inputs))) < 1e-4


def test_a_model_the_conversion_fails_on_is_tuned_as_imported(tmp_path, capfd):
    """A nine-input Sum is past the rewrites, so ConvertLayout refuses the model: NCHW, said aloud."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sum", ["c"] * 9, ["y"])]
    graph = helper.make_graph(nodes, "nine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])  # fmt: skip
    path = tmp_path / "nine.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    model = resaware.load_onnx(path)
    (x,) = model.random_inputs(0)
    compiled = resaware.compile(model, "50%", store=tmp_path / "store")
    assert compiled.info["layout"] == "NCHW" and "the convolutions stay NCHW" in capfd.readouterr().err
    (out,) = compiled(x)
    assert relative_error(out, reference(path, {"x": x})[0]) < 1e-5


def test_bad_layout_is_one_clear_error(small_path):
    with pytest.raises(ResawareError, match="layout 'NWHC' is not one of auto, NCHW, NHWC"):
        resaware.load_onnx(small_path, shapes={"x": (1, 3, 16, 16)}, layout="NWHC")
    done = run_cli("tasks", small_path, "--shape", "x=1x3x16x16", "--layout", "nhwc")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--layout" in done.stderr
