"""``DotProductWithPadding``: row-wise dot products of X [N, M] and Y [N, K] of different
widths.  The narrower one is padded with ``pad_value`` (0) or, with ``replicate=1``, tiled
(the wider width must then be a multiple of the narrower one)."""

from __future__ import annotations

from typing import Any

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import as_dtype
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


def _operands(ctx: OpContext) -> tuple[Any, Any]:
    """X and Y as [N, M] and [N, K] row matrices: N is the first dim, the rest is one row (a
    1-D input is N rows of one value, as in Caffe2)."""
    x, y = (ctx.xp.asarray(v) for v in ctx.inputs[:2])
    if x.ndim != y.ndim or x.ndim == 0 or x.shape[0] != y.shape[0]:
        raise ctx.fail(f"X and Y must have the same rank (>= 1) and first dim N; got "
                       f"{tuple(x.shape)} and {tuple(y.shape)}")
    n = x.shape[0]
    x = x.reshape(n, x.size // n if n else 0)
    y = y.reshape(n, y.size // n if n else 0)
    if ctx.int_arg("replicate", 0):
        narrow, wide = sorted((x.shape[1], y.shape[1]))
        if narrow == 0 or wide % narrow:
            raise ctx.fail(f"replicate=1 needs the wider width ({wide}) to be a multiple of "
                           f"the narrower one ({narrow})")
    return x, y


def _widened(ctx: OpContext, a: Any, width: int) -> Any:
    """``a`` [N, m] made ``width`` wide: tiled (replicate) or padded with pad_value."""
    if a.shape[1] == width:
        return a
    if ctx.int_arg("replicate", 0):
        return ctx.xp.tile(a, (1, width // a.shape[1]))
    padded = ctx.xp.full((a.shape[0], width), ctx.float_arg("pad_value", 0.0), dtype=a.dtype)
    padded[:, :a.shape[1]] = a
    return padded


def _narrowed(ctx: OpContext, grad: Any, width: int) -> Any:
    """The gradient of :func:`_widened`: tiles summed, padding dropped."""
    if grad.shape[1] == width:
        return grad
    if ctx.int_arg("replicate", 0):
        return grad.reshape(grad.shape[0], -1, width).sum(axis=1)
    return grad[:, :width]


@register_op("DotProductWithPadding", inputs=2, outputs=1)
def dot_product_with_padding(ctx: OpContext) -> Outputs:
    """[X, Y] -> [N]: each row's dot product after widening the narrower input."""
    x, y = _operands(ctx)
    width = max(x.shape[1], y.shape[1])
    out = (_widened(ctx, x, width) * _widened(ctx, y, width)).sum(axis=1)
    return (as_dtype(ctx.xp, out, x.dtype),)


@register_op("DotProductWithPaddingGradient", inputs=3, outputs=2)
def dot_product_with_padding_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dOUT] -> [dX, dY]."""
    x, y = _operands(ctx)
    d_out = ctx.xp.asarray(ctx.inputs[2]).reshape(-1, 1)
    width = max(x.shape[1], y.shape[1])
    dx = _narrowed(ctx, d_out * _widened(ctx, y, width), x.shape[1])
    dy = _narrowed(ctx, d_out * _widened(ctx, x, width), y.shape[1])
    return (as_dtype(ctx.xp, dx, x.dtype).reshape(ctx.inputs[0].shape),
            as_dtype(ctx.xp, dy, y.dtype).reshape(ctx.inputs[1].shape))


@register_gradient("DotProductWithPadding")
def _dot_product_with_padding_gradient(g: GradientBuilder) -> None:
    g.add("DotProductWithPaddingGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])
