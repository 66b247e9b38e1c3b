import numpy as np
import onnx
import pytest
from conftest import reference

from resaware import ResawareError
from resaware.frontend import zoo


def test_names_are_the_light_models():
    assert {"resnet50", "squeezenet", "densenet121", "inception_v1", "vgg19", "bvlc_alexnet"} <= set(zoo.names())


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_materialised_model_has_random_weights_and_input_dependent_output(name):
    path = zoo.path(name)
    model = onnx.load(path)
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    assert [i.name for i in model.graph.input] and len(model.graph.input) == 1
    weights = [onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert len(weights) > 10 and all(np.unique(w).size > 1 for w in weights if w.size > 1)
    spec = model.graph.input[0]
    shape = [d.dim_value for d in spec.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    a, b = (reference(path, {spec.name: rng.standard_normal(shape).astype("float32")})[0] for _ in range(2))
    assert np.isfinite(a).all() and np.abs(a - b).max() > 1e-3 * np.abs(a).max()


def test_path_is_cached_and_seeded():
    first = zoo.path("squeezenet")
    assert zoo.path("zoo:squeezenet") == first
    other = zoo.path("squeezenet", seed=1)
    w0 = onnx.load(first).graph.initializer
    w1 = onnx.load(other).graph.initializer
    assert any(a.raw_data != b.raw_data for a, b in zip(w0, w1))


def test_unknown_name_lists_choices():
    with pytest.raises(ResawareError, match="choose one of .*squeezenet"):
        zoo.path("lenet")
