"""``SpaceToBatch`` and ``BatchToSpace``: move ``block_size`` x ``block_size`` spatial
blocks into the batch dimension and back (each the other's gradient).

SpaceToBatch zero-pads X (``pad``, or ``pad_t``/``pad_l``/``pad_b``/``pad_r``), then output
image ``(oh * block_size + ow) * N + n`` holds the pixels ``(ph * block_size + oh,
pw * block_size + ow)`` of image ``n``.  BatchToSpace inverts it and crops the padding.
``order`` NCHW (default) or NHWC.
"""

from __future__ import annotations

from typing import Any

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


def _geometry(ctx: OpContext) -> tuple[int, tuple[int, int, int, int]]:
    block = ctx.int_arg("block_size", 2)
    pad = ctx.int_arg("pad", 0)
    pads = tuple(ctx.int_arg(name, pad) for name in ("pad_t", "pad_l", "pad_b", "pad_r"))
    if block < 1 or min(pads) < 0:
        raise ctx.fail(f"block_size must be >= 1 and pads >= 0; got {block} and {pads}")
    return block, pads  # type: ignore[return-value]


def _nchw(ctx: OpContext) -> Any:
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.ndim != 4:
        raise ctx.fail(f"X must be 4-D, got shape {tuple(x.shape)}")
    order = ctx.arg("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise ctx.fail(f"order must be NCHW or NHWC, got {order!r}")
    return x if order == "NCHW" else x.transpose(0, 3, 1, 2)


def _in_order(ctx: OpContext, y: Any) -> Any:
    y = y if ctx.arg("order", "NCHW") == "NCHW" else y.transpose(0, 2, 3, 1)
    return ctx.xp.asarray(y, order="C")


@register_op("SpaceToBatch", inputs=1, outputs=1)
def space_to_batch(ctx: OpContext) -> Outputs:
    """X [N, C, H, W] -> [N * b * b, C, (H + pads) / b, (W + pads) / b]."""
    x = _nchw(ctx)
    block, (top, left, bottom, right) = _geometry(ctx)
    n, c, h, w = x.shape
    height, width = h + top + bottom, w + left + right
    if height % block or width % block:
        raise ctx.fail(f"the padded size {height}x{width} must be a multiple of block_size "
                       f"{block}")
    padded = ctx.xp.zeros((n, c, height, width), dtype=x.dtype)
    padded[:, :, top:top + h, left:left + w] = x
    blocks = padded.reshape(n, c, height // block, block, width // block, block)
    y = blocks.transpose(3, 5, 0, 1, 2, 4).reshape(
        block * block * n, c, height // block, width // block)
    return (_in_order(ctx, y),)


@register_op("BatchToSpace", inputs=1, outputs=1)
def batch_to_space(ctx: OpContext) -> Outputs:
    """X [N * b * b, C, H, W] -> [N, C, H * b - pads, W * b - pads]."""
    x = _nchw(ctx)
    block, (top, left, bottom, right) = _geometry(ctx)
    batch, c, h, w = x.shape
    if batch % (block * block):
        raise ctx.fail(f"the batch {batch} must be a multiple of block_size^2 = "
                       f"{block * block}")
    n = batch // (block * block)
    if h * block - top - bottom < 0 or w * block - left - right < 0:
        raise ctx.fail(f"the pads {top, left, bottom, right} crop more than the "
                       f"{h * block}x{w * block} image")
    full = x.reshape(block, block, n, c, h, w).transpose(2, 3, 4, 0, 5, 1).reshape(
        n, c, h * block, w * block)
    y = full[:, :, top:h * block - bottom, left:w * block - right]
    return (_in_order(ctx, y),)


@register_gradient("SpaceToBatch")
def _space_to_batch_gradient(g: GradientBuilder) -> None:
    g.add("BatchToSpace", [g.GO(0)], [g.GI(0)])


@register_gradient("BatchToSpace")
def _batch_to_space_gradient(g: GradientBuilder) -> None:
    g.add("SpaceToBatch", [g.GO(0)], [g.GI(0)])
