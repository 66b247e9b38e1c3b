"""Winograd convolutions: 3x3 stride-1 convolutions in NHWC lowered as F(4x4, 3x3) instead of directly.

A direct 3x3 convolution spends 9 multiply-adds per output and input channel; Winograd's F(4x4, 3x3)
transforms 6x6 input tiles and the weights once, multiplies them in 36 independent matrix products
(the bulk of the work: 36 / 16 = 2.25 multiply-adds per output and input channel) and transforms the
4x4 output tiles back. The weights' transform is a separate kernel on constants, so it folds into the
compiled module's constants; the input and output transforms carry TVM's own MetaSchedule rules for
Winograd on CPU (`conv2d_nhwc_winograd_data_pack` / `_inverse`), the products its multi-level tiling.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi
from tvm.topi.nn.winograd_util import winograd_transform_matrices

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
    _, _, g = winograd_transform_matrices(TILE, KERNEL, str(weight.dtype))
    alpha = TILE + KERNEL - 1
    kh, kw = te.reduce_axis((0, KERNEL), "kh"), te.reduce_axis((0, KERNEL), "kw")
    return te.compute(
        (alpha, alpha, weight.shape[2], weight.shape[3]),
        lambda eps, nu, i, o: te.sum(g[eps, kh] * weight[kh, kw, i, o] * g[nu, kw], axis=[kh, kw]),
        name="winograd_weight",
    )


def _tile_transform(tiles: te.Tensor, matrix: te.Tensor, size: int, name: str) -> te.Tensor:
    """matrix^T t matrix for every tile t (the first two axes of `tiles`) and channel: the input transform
    (`data_pack`, B) or the output one (`inverse`, A), each with TVM's MetaSchedule rule for it on CPU."""
    ra, rb = te.reduce_axis((0, tiles.shape[0]), "r_a"), te.reduce_axis((0, tiles.shape[1]), "r_b")
    return te.compute(
        (size, size, tiles.shape[2], tiles.shape[3]),
        lambda i, j, p, c: te.sum(tiles[ra, rb, p, c] * matrix[ra, i] * matrix[rb, j], axis=[ra, rb]),
        name=name,
        attrs={"schedule_rule": f"conv2d_nhwc_winograd_{name}"},
    )


def _conv(data: te.Tensor, packed: te.Tensor, padding: tuple[int, int, int, int]) -> te.Tensor:
    """The convolution of NHWC `data` with weights already transformed (`_transformed_weight`).

    The block names and `schedule_rule` annotations are the ones TVM's MetaSchedule rules for
    Winograd on CPU look for: the input transform pulls its tile and padding in, the output
    transform inlines its constant matrix."""
    n, h, w, ci = (int(d) for d in data.shape)
    alpha, co = int(packed.shape[0]), int(packed.shape[3])
    top, left, bottom, right = padding
    out_h, out_w = h + top + bottom - KERNEL + 1, w + left + right - KERNEL + 1
    tiles_h, tiles_w = -(-out_h // TILE), -(-out_w // TILE)
    tiles = n * tiles_h * tiles_w
    a, b, _ = winograd_transform_matrices(TILE, KERNEL, str(data.dtype))
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
    data_pack = _tile_transform(input_tile, b, alpha, "data_pack")
    rc = te.reduce_axis((0, ci), "rc")
    bgemm = te.compute(
        (alpha, alpha, tiles, co),
        lambda eps, nu, p, o: te.sum(data_pack[eps, nu, p, rc] * packed[eps, nu, rc, o], axis=[rc]),
        name="bgemm",
        attrs={"meta_schedule.write_cache_level": [2]},
    )
    inverse = _tile_transform(bgemm, a, TILE, "inverse")
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
