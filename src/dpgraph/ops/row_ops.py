"""Row-wise ops: RowMul (scale each row of X by one value) and ReduceTailSum (sum each row
to one value), which together form RowMul's gradient."""

from __future__ import annotations

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import as_dtype
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


@register_op("RowMul", inputs=2, outputs=1)
def row_mul(ctx: OpContext) -> Outputs:
    """X [N, ...], W [N] -> ``Y[i] = X[i] * W[i]``."""
    xp = ctx.xp
    x, w = xp.asarray(ctx.inputs[0]), xp.asarray(ctx.inputs[1])
    if x.ndim < 1 or w.size != x.shape[0]:
        raise ctx.fail(f"W must hold one value per row of X: X {tuple(x.shape)}, W "
                       f"{tuple(w.shape)}")
    return (as_dtype(xp, x * w.reshape(-1, *(1,) * (x.ndim - 1)), x.dtype),)


@register_op("ReduceTailSum", inputs=1, outputs=1)
def reduce_tail_sum(ctx: OpContext) -> Outputs:
    """X [N, ...] -> [N]: each row summed."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.ndim < 1:
        raise ctx.fail("X must have at least one dimension")
    return (x.reshape(x.shape[0], -1).sum(axis=1).astype(x.dtype),)


@register_gradient("RowMul")
def _row_mul_gradient(g: GradientBuilder) -> None:
    scaled = g.GI(1) + "before_aggregate"
    g.add("RowMul", [g.GO(0), g.I(1)], [g.GI(0)])
    g.add("Mul", [g.GO(0), g.I(0)], [scaled])
    g.add("ReduceTailSum", [scaled], [g.GI(1)])
