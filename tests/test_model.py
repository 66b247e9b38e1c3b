import pytest
from conftest import make_small_model, make_unsupported_model

import resaware
from resaware import ResawareError
from resaware.frontend.model import parse_shapes


def test_shapes_bind_symbolic_dims(small_path):
    model = resaware.load_onnx(small_path, shapes={"x": (3, 3, 16, 16)})
    assert [(s.name, s.shape, s.dtype) for s in model.inputs] == [("x", (3, 3, 16, 16), "float32")]
    assert model.outputs == ["y"]


def test_missing_shape_names_the_dimension(small_path):
    with pytest.raises(ResawareError, match=r"x \(Nx3x16x16: N unbound\).*--shape"):
        resaware.load_onnx(small_path)


def test_shape_for_unknown_input(small_path):
    with pytest.raises(ResawareError, match="no input called"):
        resaware.load_onnx(small_path, shapes={"ids": (1, 2)})


def test_static_model_needs_no_shapes(tmp_path):
    model = resaware.load_onnx(make_small_model(tmp_path / "m.onnx", batch=1))
    assert model.inputs[0].shape == (1, 3, 16, 16)


def test_missing_file():
    with pytest.raises(ResawareError, match="does not exist"):
        resaware.load_onnx("/nonexistent/model.onnx")


def test_not_onnx(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 this is not a protobuf \xff" * 10)
    with pytest.raises(ResawareError, match="not an ONNX model"):
        resaware.load_onnx(bad)


def test_unsupported_operators_are_listed(tmp_path):
    path = make_unsupported_model(tmp_path / "custom.onnx")
    with pytest.raises(ResawareError, match="unsupported ONNX operators: FancyOp, OtherOp"):
        resaware.load_onnx(path)


def test_parse_shapes():
    assert parse_shapes(["ids=2x64", "a/b:0=1"]) == {"ids": (2, 64), "a/b:0": (1,)}
    for bad in ["ids", "ids=2xq", "=3", "ids=0x3"]:
        with pytest.raises(ResawareError, match="NAME=DxD"):
            parse_shapes([bad])


def test_input_names_that_are_no_identifiers_import_and_keep_old_style_weight_inputs(tmp_path):
    """TVM's CUDA codegen writes input names into kernel signatures, so `data/0` is renamed inside the
    module; weights that older ONNX files also list as inputs keep their names (and stay weights)."""
    import numpy as np
    import onnx
    from conftest import reference, relative_error
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype("float32"), "fc/w:0")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["data/0", "fc/w:0"], ["y"])], "names",
        [helper.make_tensor_value_info("data/0", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("fc/w:0", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 3  # initializers listed among the inputs, as before IR 4
    path = tmp_path / "names.onnx"
    onnx.save(model, path)
    loaded = resaware.load_onnx(str(path))
    assert [s.name for s in loaded.inputs] == ["data/0"]  # fed by the model's own name
    assert [str(p.name) for p in loaded.mod["main"].params] == ["data_0"]
    compiled = resaware.compile(loaded, budget="100%", store=tmp_path / "store")
    (x,) = loaded.random_inputs(0)
    (ref,) = reference(path, {"data/0": x})
    assert relative_error(compiled(x)[0], ref) < 1e-5
