"""Real Model Zoo architectures shipped in the `onnx` package, given seeded random weights.

The files under `onnx/backend/test/data/light/` fill every weight with a `ConstantOfShape` constant,
which makes every output the same whatever the input. Each model is materialised once with seeded
random weights in place of those fills (scaled so activations neither vanish nor explode) and cached
as a real `.onnx` file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from resaware import files
from resaware.errors import ResawareError

_NAMES = (
    "resnet50", "squeezenet", "densenet121", "inception_v1", "inception_v2",
    "shufflenet", "vgg19", "bvlc_alexnet", "zfnet512",
)  # fmt: skip


# Built here with onnx.helper rather than shipped: a transformer the light zoo lacks.
_BUILT = ("encoder",)


def names() -> list[str]:
    """The zoo's model names."""
    return [*_NAMES, *_BUILT]


def _light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def cache_dir() -> Path:
    """Where materialised zoo models are kept: `$RESAWARE_CACHE/zoo`, else the user cache."""
    root = os.environ.get("RESAWARE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "resaware"
    )
    return Path(root) / "zoo"


def _fill(consumer: str, index: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values shaped for where the tensor is used."""
    if consumer in ("Conv", "Gemm", "Gemm^T", "MatMul") and index == 1 and len(shape) >= 2:
        # He initialisation: (out, in, ...) for Conv and transposed Gemm, (in, out) otherwise.
        fan_in = int(np.prod(shape[1:])) if consumer in ("Conv", "Gemm^T") else int(shape[0])
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), size=shape)
    if (consumer == "BatchNormalization" and index in (1, 4)) or consumer == "Mul":
        return rng.uniform(0.5, 1.5, size=shape)  # scales and variances: positive, near one
    return rng.normal(0.0, 0.1, size=shape)  # biases, means and other small constants


def _consumer(name: str, consumers: dict[str, tuple[onnx.NodeProto, int]]) -> tuple[str, int]:
    """The op that really uses `name`, looking through shape-only ops (Unsqueeze, Reshape)."""
    node, index = consumers.get(name, (None, 0))
    while node is not None and node.op_type in ("Unsqueeze", "Reshape") and index == 0:
        node, index = consumers.get(node.output[0], (None, 0))
    if node is None:
        return "", 0
    transposed = any(a.name == "transB" and a.i for a in node.attribute)
    return ("Gemm^T" if node.op_type == "Gemm" and transposed else node.op_type), index


def _calibrate_batchnorm(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    """Set each BatchNormalization's mean and variance to the statistics of its real input.

    With random weights and unit statistics, activations grow block after block until the softmax
    saturates and the output stops depending on the input. Feeding the statistics in as inputs lets
    one ONNX Runtime session calibrate the layers in order.
    """
    import onnxruntime as ort

    graph = model.graph
    bns = [n for n in graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return
    inits = {i.name: i for i in graph.initializer}
    stats = {name: numpy_helper.to_array(inits[name]) for n in bns for name in n.input[3:5]}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [i for i in probe.graph.initializer if i.name not in stats]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    for name, value in stats.items():
        probe.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, value.shape))
    for n in bns:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}  # fmt: skip
    for n in bns:
        (x,) = session.run([n.input[0]], {**feeds, **stats})
        axes = tuple(a for a in range(x.ndim) if a != 1)
        stats[n.input[3]] = x.mean(axis=axes).astype(np.float32)
        stats[n.input[4]] = (x.var(axis=axes) + 1e-3).astype(np.float32)
    for name, value in stats.items():
        inits[name].CopyFrom(numpy_helper.from_array(value, name))


def materialise(proto: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of `proto` whose constant fills are seeded random initializers."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, tuple[onnx.NodeProto, int]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            consumers.setdefault(name, (node, k))
    rng = np.random.default_rng(seed)
    keep, new_inits, shape_inputs = [], [], set()
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            value = numpy_helper.to_array(node.attribute[0].t) if node.attribute else np.zeros(1, np.float32)
            op, k = _consumer(node.output[0], consumers)
            data = _fill(op, k, shape, rng).astype(value.dtype)
            new_inits.append(numpy_helper.from_array(data, node.output[0]))
            shape_inputs.add(node.input[0])
        else:
            keep.append(node)
    used = {name for node in keep for name in node.input}
    del graph.node[:]
    graph.node.extend(keep)
    kept_inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits + new_inits)
    constants = {i.name for i in graph.initializer} | shape_inputs
    real_inputs = [i for i in graph.input if i.name not in constants and i.name in used]
    del graph.input[:]
    graph.input.extend(real_inputs)
    # IR version 4 lets initializers stand apart from graph inputs, so weights are constants.
    model.ir_version = max(model.ir_version, 4)
    _calibrate_batchnorm(model, rng)
    onnx.checker.check_model(model)
    return model


def path(name: str, seed: int = 0) -> str:
    """The cached `.onnx` file of zoo model `name` with seeded random weights (made on first use)."""
    name = name.removeprefix("zoo:").removeprefix("light_").removesuffix(".onnx")
    if name not in names():
        raise ResawareError(f"no zoo model {name!r}: choose one of {', '.join(names())}")
    target = cache_dir() / f"{name}-seed{seed}.onnx"
    if not target.exists():
        if name == "encoder":
            model = encoder(seed=seed)
        else:
            source = _light_dir() / f"light_{name}.onnx"
            if not source.exists():
                raise ResawareError(f"the installed onnx package lacks {source}: reinstall onnx")
            model = materialise(onnx.load(source), seed)
        with files.replacing(target) as tmp:  # readers never see half a file
            onnx.save(model, str(tmp))
    return str(target)


def encoder(seq: int = 128, hidden: int = 256, heads: int = 4, ffn: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """One post-norm transformer encoder layer (BERT-style), batch 1, seeded random weights.

    Input `x` (1, seq, hidden) float32; MatMul/Softmax/LayerNormalization/Gelu-by-Erf at opset 17.
    """
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    head = hidden // heads
    inits, nodes = [], []

    def const(name, array):
        inits.append(
            numpy_helper.from_array(
                np.asarray(array, dtype=np.float32 if array.dtype.kind == "f" else array.dtype), name
            )
        )
        return name

    def dense(x, name, n_in, n_out):
        w = const(f"{name}.w", rng.standard_normal((n_in, n_out)) * np.sqrt(1.0 / n_in))
        b = const(f"{name}.b", rng.standard_normal(n_out) * 0.02)
        nodes.append(helper.make_node("MatMul", [x, w], [f"{name}.mm"]))
        nodes.append(helper.make_node("Add", [f"{name}.mm", b], [name]))
        return name

    def heads_of(x, name):  # (1, seq, hidden) -> (1, heads, seq, head)
        shape = const(f"{name}.shape", np.array([1, seq, heads, head], np.int64))
        nodes.append(helper.make_node("Reshape", [x, shape], [f"{name}.r"]))
        nodes.append(helper.make_node("Transpose", [f"{name}.r"], [name], perm=[0, 2, 1, 3]))
        return name

    def layer_norm(x, name):
        g = const(f"{name}.g", 1.0 + rng.standard_normal(hidden) * 0.02)
        b = const(f"{name}.b", rng.standard_normal(hidden) * 0.02)
        nodes.append(helper.make_node("LayerNormalization", [x, g, b], [name], axis=-1, epsilon=1e-5))
        return name

    q = heads_of(dense("x", "q", hidden, hidden), "qh")
    k = heads_of(dense("x", "k", hidden, hidden), "kh")
    v = heads_of(dense("x", "v", hidden, hidden), "vh")
    nodes.append(helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("MatMul", [q, "kt"], ["scores.raw"]))
    nodes.append(helper.make_node("Mul", ["scores.raw", const("scale", np.array(1 / np.sqrt(head)))], ["scores"]))
    nodes.append(helper.make_node("Softmax", ["scores"], ["attn"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["attn", v], ["ctx.h"]))
    nodes.append(helper.make_node("Transpose", ["ctx.h"], ["ctx.t"], perm=[0, 2, 1, 3]))
    nodes.append(
        helper.make_node("Reshape", ["ctx.t", const("ctx.shape", np.array([1, seq, hidden], np.int64))], ["ctx"])
    )
    attn_out = dense("ctx", "o", hidden, hidden)
    nodes.append(helper.make_node("Add", ["x", attn_out], ["res1"]))
    h1 = layer_norm("res1", "ln1")
    up = dense(h1, "ffn1", hidden, ffn)
    # GELU spelled with Erf, as exporters write it before opset 20.
    nodes.append(helper.make_node("Mul", [up, const("inv_sqrt2", np.array(1 / np.sqrt(2)))], ["g.s"]))
    nodes.append(helper.make_node("Erf", ["g.s"], ["g.e"]))
    nodes.append(helper.make_node("Add", ["g.e", const("one", np.array(1.0))], ["g.p"]))
    nodes.append(helper.make_node("Mul", [up, "g.p"], ["g.m"]))
    nodes.append(helper.make_node("Mul", ["g.m", const("half", np.array(0.5))], ["gelu"]))
    down = dense("gelu", "ffn2", ffn, hidden)
    nodes.append(helper.make_node("Add", [h1, down], ["res2"]))
    layer_norm("res2", "y")
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="resaware")
    model.ir_version = 8  # readable by every ONNX Runtime this project supports
    onnx.checker.check_model(model)
    return model
