"""Importing an ONNX model into a Relax module with known input shapes."""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from resaware.errors import ResawareError, last_line
from resaware.runtime.spec import TensorSpec


@dataclass
class Model:
    """An imported model: its Relax module (weights bound as constants) and its inputs and outputs."""

    name: str
    mod: object  # tvm.IRModule
    inputs: list[TensorSpec]
    outputs: list[str]
    digest: str  # sha256 of the ONNX bytes and the shapes: names the model in reports
    source: str | None = None
    onnx_model: onnx.ModelProto | None = field(default=None, repr=False)
    layout: str = "auto"  # the convolutions' layout to lower in (`resaware.frontend.layout`)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """One seeded random array per input, in input order."""
        rng = np.random.default_rng(seed)
        return [spec.random(rng) for spec in self.inputs]


def read_onnx(path_or_proto) -> tuple[onnx.ModelProto, str, str | None]:
    """(the ModelProto, a default name, the source path or None) for a path, `zoo:NAME` or ModelProto."""
    if isinstance(path_or_proto, onnx.ModelProto):
        return path_or_proto, path_or_proto.graph.name or "model", None
    path = os.fspath(path_or_proto)
    if path.startswith("zoo:"):
        from resaware.frontend import zoo

        name, path = path[4:], zoo.path(path[4:])
        proto, _, _ = read_onnx(path)
        return proto, name, path
    if not os.path.isfile(path):
        raise ResawareError(
            f"model file {path!r} does not exist: give the path of an .onnx file or zoo:NAME (see `resaware zoo`)"
        )
    try:
        proto = onnx.load(path)
    except Exception as error:
        raise ResawareError(f"{path!r} is not an ONNX model ({type(error).__name__}): give an .onnx file") from None
    if not proto.graph.node:
        raise ResawareError(f"{path!r} holds no ONNX graph: give an .onnx model file")
    return proto, os.path.splitext(os.path.basename(path))[0], path


_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}  # fmt: skip


def _input_specs(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[TensorSpec]:
    initializers = {i.name for i in proto.graph.initializer}
    graph_inputs = [i for i in proto.graph.input if i.name not in initializers]
    names = {i.name for i in graph_inputs}
    unknown = sorted(set(shapes) - names)
    if unknown:
        raise ResawareError(
            f"--shape names {', '.join(unknown)}, which the model has no input called; its inputs are {', '.join(sorted(names))}"
        )
    specs, unbound = [], []
    for value in graph_inputs:
        tensor = value.type.tensor_type
        dtype = _DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise ResawareError(
                f"input {value.name!r} has ONNX element type {tensor.elem_type}, which resaware does not handle"
            )
        if value.name in shapes:
            shape = tuple(int(d) for d in shapes[value.name])
            if len(shape) != len(tensor.shape.dim) and tensor.HasField("shape"):
                raise ResawareError(
                    f"--shape {value.name} has {len(shape)} dimensions, the model's input has {len(tensor.shape.dim)}"
                )
        else:
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
            missing = [str(d) for d in dims if not isinstance(d, int) or d <= 0]
            if missing or not tensor.HasField("shape"):
                unbound.append(
                    f"{value.name} ({'x'.join(str(d) for d in dims) or 'unknown shape'}: {', '.join(missing) or 'no shape'} unbound)"
                )
                continue
            shape = tuple(dims)
        specs.append(TensorSpec(value.name, shape, dtype))
    if unbound:
        raise ResawareError(
            "inputs with symbolic or unknown dimensions: "
            + "; ".join(unbound)
            + " — give full shapes, e.g. --shape NAME=1x3x224x224 (API: shapes={'NAME': (1, 3, 224, 224)})"
        )
    return specs


def _unsupported_ops(proto: onnx.ModelProto) -> list[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = _get_convert_map()
    used = {node.op_type for node in proto.graph.node}
    for fn in proto.functions:
        used |= {node.op_type for node in fn.node}
        used.discard(fn.name)
    return sorted(op for op in used if op not in known)


def parse_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Read CLI `--shape name=2x64` items."""
    shapes = {}
    for item in items or []:
        name, sep, dims = item.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.lower().split("x"))
            if any(d <= 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise ResawareError(f"--shape {item!r} is not NAME=DxDx...: e.g. --shape input=1x3x224x224") from None
    return shapes


def _identifier(name: str) -> str:
    """`name` as a C identifier: TVM's CUDA codegen writes input names into kernel signatures as they are
    (ResNet-50's `gpu_0/data_0` breaks nvcc); TVM's importer only replaces dots."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return text if text[:1].isalpha() or text[:1] == "_" else f"input_{text}"


def _identifier_inputs(proto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of `proto` whose graph inputs are C identifiers (inputs are fed by position, so nothing
    outside the imported module sees the new names; buffer names do not change workload hashes)."""
    weights = {i.name for i in proto.graph.initializer}  # older files list them as inputs too: keep them
    taken = {i.name for i in proto.graph.input} | weights | {n for node in proto.graph.node for n in node.output}
    bad = {}
    for value in proto.graph.input:
        if value.name not in weights and _identifier(value.name) != value.name:
            new, suffix = _identifier(value.name), 1
            while new in taken:
                new, suffix = f"{_identifier(value.name)}_{suffix}", suffix + 1
            bad[value.name] = new
            taken.add(new)
    if not bad:
        return proto, bad
    copy = type(proto)()
    copy.CopyFrom(proto)
    for value in copy.graph.input:
        value.name = bad.get(value.name, value.name)
    for node in copy.graph.node:
        node.input[:] = [bad.get(n, n) for n in node.input]
    for output in copy.graph.output:
        output.name = bad.get(output.name, output.name)
    return copy, bad


def load_onnx(path_or_proto, shapes: dict[str, tuple[int, ...]] | None = None, name: str | None = None,
              layout: str = "auto") -> Model:  # fmt: skip
    """Import an ONNX file, `zoo:NAME` or ModelProto; `shapes` maps input names to full shapes; `layout`
    is the convolutions' layout to tune and compile in (auto, NCHW, NHWC or NHWC-winograd; `resaware.frontend.layout`)."""
    from tvm.relax.frontend.onnx import from_onnx

    from resaware.frontend.layout import check

    check(layout)
    proto, default_name, source = read_onnx(path_or_proto)
    shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
    specs = _input_specs(proto, shapes)
    unsupported = _unsupported_ops(proto)
    if unsupported:
        raise ResawareError(
            f"unsupported ONNX operators: {', '.join(unsupported)} — TVM's Relax ONNX importer has no converter for them"
        )
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            renamed, names = _identifier_inputs(proto)
            mod = from_onnx(renamed, shape_dict={names.get(s.name, s.name): list(s.shape) for s in specs}, opset=opset)
        except Exception as error:
            raise ResawareError(f"TVM could not import the model: {last_line(error)}") from None
    digest = hashlib.sha256(proto.SerializeToString(deterministic=True))
    digest.update(repr([(s.name, s.shape) for s in specs]).encode())
    outputs = [o.name for o in proto.graph.output]
    return Model(name or default_name, mod, specs, outputs, digest.hexdigest(), source, proto, layout)


def resolve(model, shapes=None, layout: str | None = None) -> Model:
    """A Model as given, or imported from a path, `zoo:NAME` or ModelProto; with `layout`, one that
    lowers its convolutions in that layout."""
    if not isinstance(model, Model):
        return load_onnx(model, shapes, layout=layout or "auto")
    if layout is None or layout == model.layout:
        return model
    from resaware.frontend.layout import check

    return replace(model, layout=check(layout))
