"""Winograd convolutions: 3x3 stride-1 convolutions in NHWC lowered as F(4x4, 3x3) instead of directly.

A direct 3x3 convolution spends 9 multiply-adds per output and input channel; Winograd's F(4x4, 3x3)
transforms 6x6 input tiles and the weights once, multiplies them in 36 independent matrix products
(the bulk of the work: 36 / 16 = 2.25 multiply-adds per output and input channel) and transforms the
4x4 output tiles back. The weights' transform is a separate kernel on constants, so it folds into the
compiled module's constants. The input and output transforms are written out term by term (the
matrices' zeros dropped) and scheduled by resaware's own MetaSchedule rule (`_schedule_transform`),
the products by MetaSchedule's multi-level tiling.

TVM's own CPU rules for Winograd unroll a dense 6x6x6x6 transform with its matrix inlined as `Select`
chains: a candidate took 1.4-3.3 s to build against 0.1 s for a direct convolution, so a model tuned
at a third of the rate. Written out, a candidate builds in about 0.2 s (64->64 channels on 56x56,
median of 8 samples; direct 0.09 s) and its cost-model features take 0.016 s (direct 0.006 s).
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, topi
from tvm.topi.nn import winograd_util

TILE = 4  # outputs per tile side: F(4x4, 3x3), tiles of 6x6 inputs
KERNEL = 3


def eligible(call: relax.Call) -> bool:
    """Whether a `relax.nn.conv2d` call is one Winograd computes: NHWC data, HWIO weights, 3x3,
    stride 1, no dilation, one group, float32, static shapes."""
    attrs = call.attrs
    data, weight = (arg.ty for arg in call.args)
    shapes = (data.shape, weight.shape)
    if any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s) for s in shapes):
        return False
    return (
        attrs.data_layout == "NHWC"
        and attrs.kernel_layout == "HWIO"
        and attrs.out_layout == "NHWC"
        and [int(s) for s in attrs.strides] == [1, 1]
        and [int(d) for d in attrs.dilation] == [1, 1]
        and int(attrs.groups) == 1
        and [int(weight.shape[0]), int(weight.shape[1])] == [KERNEL, KERNEL]
        and data.dtype == weight.dtype == "float32"
        and str(attrs.out_dtype or "float32") == "float32"
    )


def _transformed_weight(weight: te.Tensor) -> te.Tensor:
    """G w G^T per input and output channel: HWIO (3, 3, I, O) to (6, 6, I, O)."""
    return _transform(weight, _matrices()[2].T, "winograd_weight")


def _matrices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F(4x4, 3x3)'s matrices as numbers, TVM's Cook-Toom choice (the interpolation points 0, +-1, 1/2, -2):
    A (6x4) transforms the products' tiles back, B (6x6) the input's, G (6x3) the weights'."""
    matrices = winograd_util._cook_toom_convolution(
        winograd_util._interpolation_points(TILE + KERNEL - 2), TILE, KERNEL
    )
    return tuple(m.astype("float32") for m in matrices)


def _combine(matrix: np.ndarray, column: tvm.tirx.PrimExpr, read) -> tvm.tirx.PrimExpr:
    """sum over k of matrix[k, column] * read(k), written out: for each column the sum of its nonzero
    terms, chosen by `if_then_else` on the column, which folds away when the column's loop is unrolled
    (a `Select` would not, once vectorised)."""

    def column_sum(j: int) -> tvm.tirx.PrimExpr:
        total = None
        for k in np.flatnonzero(matrix[:, j]):
            coefficient, value = float(matrix[k, j]), read(int(k))
            term = value if abs(coefficient) == 1 else value * abs(coefficient)
            if total is None:
                total = term if coefficient > 0 else -term
            else:
                total = total + term if coefficient > 0 else total - term
        return total

    sums = [column_sum(j) for j in range(matrix.shape[1])]
    return functools.reduce(
        lambda rest, j: tvm.tirx.if_then_else(column == j, sums[j], rest), reversed(range(len(sums) - 1)), sums[-1]
    )


def _transform(x: te.Tensor, matrix: np.ndarray, name: str) -> te.Tensor:
    """matrix^T t matrix for every tile t (the first two axes of `x`) and channel, in two passes: the rows
    into `{name}_rows`, laid out (row, tile, column, channel) so that MetaSchedule does not take it for a
    cache of `x`, then the columns. `name` carries resaware's schedule rule (`_schedule_transform`). (The
    weights' transform is this too, with G^T, input channels for tiles, output channels for channels.)"""
    size, (_, alpha, tiles, channels) = matrix.shape[1], x.shape
    rows = te.compute(
        (size, tiles, alpha, channels),
        lambda i, p, j, c: _combine(matrix, i, lambda k: x[k, j, p, c]),
        name=f"{name}_rows",
        attrs={"schedule_rule": "None"},
    )
    return te.compute(
        (size, size, tiles, channels),
        lambda i, j, p, c: _combine(matrix, j, lambda k: rows[i, p, k, c]),
        name=name,
        attrs={"schedule_rule": "resaware_winograd_transform"},
    )


def _conv(data: te.Tensor, packed: te.Tensor, padding: tuple[int, int, int, int]) -> te.Tensor:
    """The convolution of NHWC `data` with weights already transformed (`_transformed_weight`): the
    input's tiles transformed (`data_pack`), multiplied by the weights per tile element (`bgemm`) and
    transformed back (`inverse`)."""
    n, h, w, ci = (int(d) for d in data.shape)
    alpha, co = int(packed.shape[0]), int(packed.shape[3])
    top, left, bottom, right = padding
    out_h, out_w = h + top + bottom - KERNEL + 1, w + left + right - KERNEL + 1
    tiles_h, tiles_w = -(-out_h // TILE), -(-out_w // TILE)
    tiles = n * tiles_h * tiles_w
    a, b, _ = _matrices()
    # Pad to whole tiles, so that every 6x6 input tile reads inside the padded data.
    data_pad = topi.nn.pad(
        data,
        (0, top, left, 0),
        (0, tiles_h * TILE + KERNEL - 1 - h - top, tiles_w * TILE + KERNEL - 1 - w - left, 0),
        name="data_pad",
        attrs={"schedule_rule": "None"},
    )

    def read_tile(eps, nu, p, c):  # tile p's input at (eps, nu): tiles run along images, rows, columns
        img, y, x = p // (tiles_h * tiles_w), p // tiles_w % tiles_h * TILE, p % tiles_w * TILE
        return data_pad[img, y + eps, x + nu, c]

    input_tile = te.compute((alpha, alpha, tiles, ci), read_tile, name="input_tile", attrs={"schedule_rule": "None"})
    data_pack = _transform(input_tile, b, "data_pack")
    rc = te.reduce_axis((0, ci), "rc")
    bgemm = te.compute(
        (alpha, alpha, tiles, co),
        lambda eps, nu, p, o: te.sum(data_pack[eps, nu, p, rc] * packed[eps, nu, rc, o], axis=[rc]),
        name="bgemm",
        attrs={"meta_schedule.write_cache_level": [2]},
    )
    inverse = _transform(bgemm, a, "inverse")
    return te.compute(
        (n, out_h, out_w, co),
        lambda i, y, x, o: inverse[y % TILE, x % TILE, i * tiles_h * tiles_w + y // TILE * tiles_w + x // TILE, o],
        name="conv2d_winograd",
    )


def _legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if not eligible(call):
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    data, weight = call.args
    padding = tuple(int(p) for p in call.attrs.padding)
    packed = bb.emit_te(_transformed_weight, weight, primfunc_name_hint="winograd_weight")
    return bb.call_te(_conv, data, packed, padding, primfunc_name_hint="conv2d_winograd")


def legalize() -> tvm.transform.Pass:
    """Relax's LegalizeOps with eligible convolutions lowered as Winograd (run before the `zero` pipeline,
    whose own LegalizeOps then finds nothing left)."""
    return relax.transform.LegalizeOps(customize_legalize_map={"relax.nn.conv2d": _legalize})


def _schedule_transform(sch: tvm.s_tir.Schedule, block: tvm.s_tir.schedule.SBlockRV) -> list[tvm.s_tir.Schedule]:
    """MetaSchedule rule for `data_pack` and `inverse` (their `schedule_rule`): per tile and channel
    vector, the rows' pass into a local buffer and the columns' pass from it, unrolled over the tile
    and vectorised over the channels; how many tiles and channels a step takes is sampled."""
    rows = sch.get_producers(block)[0]
    i, j, p, c = sch.get_loops(block)
    p_outer, p_inner = sch.split(p, sch.sample_perfect_tile(p, n=2, max_innermost_factor=8))
    c_outer, c_inner = sch.split(c, sch.sample_perfect_tile(c, n=2, max_innermost_factor=16))
    sch.reorder(p_outer, c_outer, p_inner, i, j, c_inner)
    # The rows' pass per output row (6 vectors) rather than per tile (36): a smaller buffer to keep in L1.
    sch.compute_at(rows, i, preserve_unit_loops=True)
    sch.set_scope(rows, 0, "local")
    _, _, column, channel = sch.get_loops(rows)[-4:]
    for loop in (column, i, j):
        sch.unroll(loop)
    sch.vectorize(channel)
    sch.vectorize(c_inner)
    if sch.get(block).name_hint == "data_pack":
        # The input tile copied once per tile, its padding inlined there: with the padding's bounds checks
        # inlined into the rows' pass instead, a candidate took 4x as long to featurise for the cost model
        # and twice as long to build.
        tile = sch.get_producers(rows)[0]
        for pad in sch.get_producers(tile):
            sch.compute_inline(pad)
        sch.compute_at(tile, p_inner, preserve_unit_loops=True)
        sch.set_scope(tile, 0, "local")
        sch.vectorize(sch.get_loops(tile)[-1])
    sch.parallel(sch.fuse(p_outer, c_outer))
    return [sch]


# MetaSchedule's ApplyCustomRule looks a block's `schedule_rule` up as s_tir.meta_schedule.<target key>.<name>.
tvm_ffi.register_global_func("s_tir.meta_schedule.cpu.resaware_winograd_transform", _schedule_transform, override=True)
