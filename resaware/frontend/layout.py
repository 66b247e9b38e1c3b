"""Convolution layout: which data layout a model's convolutions are lowered in before tuning.

ONNX convolutions are NCHW. On CPUs MetaSchedule finds much faster convolution schedules when the
data is NHWC and the weights HWIO (channels innermost, so vector lanes run along channels): SqueezeNet
at one core reached 1.15x ONNX Runtime after 10 minutes in NHWC against 1.77x in NCHW
(`benchmarks/layout.py`). `auto` is NHWC for LLVM targets and NCHW (as imported) for CUDA.

The conversion is Relax's own `ConvertLayout`; the weights' transposes fold into constants. Two
imports it refuses are first rewritten into what they compute at inference: Dropout (a tuple output)
becomes its input, and ONNX Sum (imported as broadcast_to + stack + sum, one rank up) becomes adds.
A model whose NHWC conversion or lowering still fails is lowered as imported, and says so.

`NHWC-winograd` (CPU, opt-in) is NHWC with its 3x3 stride-1 convolutions lowered as Winograd
(`resaware.frontend.winograd`): about a quarter of their multiply-adds, in kernels that take about twice as long to
build and to search as direct ones.
"""

from __future__ import annotations

import functools
import sys

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, is_tuple_get_item, rewrite_call, wildcard

from resaware.errors import ResawareError, last_line

LAYOUTS = ("auto", "NCHW", "NHWC", "NHWC-winograd")
_NHWC = {"relax.nn.conv2d": ["NHWC", "HWIO"]}


def check(layout: str) -> str:
    """`layout` if it is one resaware lowers in, else a ResawareError naming the choices."""
    if layout not in LAYOUTS:
        raise ResawareError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)} (auto: NHWC on CPU, NCHW on CUDA)")
    return layout


def resolve(layout: str, target) -> str:
    """The layout `auto` stands for on `target` (a tvm Target); an explicit layout as given."""
    if check(layout) == "NHWC-winograd" and str(target.kind.name) != "llvm":
        raise ResawareError("layout NHWC-winograd is for CPU (llvm) targets: use NCHW or NHWC on CUDA")
    if layout != "auto":
        return layout
    return "NHWC" if str(target.kind.name) == "llvm" else "NCHW"


def has_conv2d(mod: tvm.IRModule) -> bool:
    """Whether the Relax module calls `nn.conv2d` (else there is nothing to convert)."""
    found = []
    conv = tvm.ir.Op.get("relax.nn.conv2d")

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(conv):
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


@functools.cache
def _sum_pattern(n: int):
    """sum(stack((broadcast_to(x1, _), ..., broadcast_to(xn, _))), axis=0): TVM's import of an n-input Sum."""
    inputs = [wildcard() for _ in range(n)]
    spread = is_tuple([is_op("relax.broadcast_to")(x, wildcard()) for x in inputs])
    return is_op("relax.sum")(is_op("relax.stack")(spread)), inputs


def _inference_form(func: relax.Function) -> relax.Function:
    """`func` with Dropout replaced by its input and n-input Sums by n - 1 adds (the same values)."""
    kept = wildcard()
    func = rewrite_call(is_tuple_get_item(is_op("relax.nn.dropout")(kept), 0), lambda _, m: m[kept], func)
    for n in range(2, 9):
        pattern, inputs = _sum_pattern(n)

        def to_adds(call, matched, inputs=inputs):
            if [int(a) for a in call.attrs.axis or []] != [0] or call.attrs.keepdims:
                return call
            total = matched[inputs[0]]
            for x in inputs[1:]:
                total = relax.op.add(total, matched[x])
            return total

        func = rewrite_call(pattern, to_adds, func)
    return func


def convert(mod: tvm.IRModule, layout: str) -> tuple[tvm.IRModule, str | None]:
    """`mod` with its convolutions in `layout` ("NCHW", "NHWC" or "NHWC-winograd", whose data is NHWC
    too), and the layout they are really in: as imported (NCHW) when asked for NCHW or when the
    conversion fails; None if there is no convolution."""
    if not has_conv2d(mod):
        return mod, None
    if layout == "NCHW":
        return mod, "NCHW"
    updated = mod.clone()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            updated[gv] = _inference_form(func)
    try:
        updated = relax.transform.DeadCodeElimination()(updated)
        return relax.transform.ConvertLayout(_NHWC)(updated), layout
    except Exception as error:  # an operator ConvertLayout cannot carry the layout through: stay as imported
        unconverted(error)
        return mod, "NCHW"


def unconverted(error: Exception) -> None:
    """Say that the model's convolutions stay as imported, and why."""
    print(
        f"resaware: the convolutions stay NCHW: TVM could not lower them in NHWC ({last_line(error)})", file=sys.stderr
    )
