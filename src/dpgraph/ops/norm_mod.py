"""``Normalize`` (L2 along an axis, with its gradient) and ``Mod`` (integer remainder)."""

from __future__ import annotations

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import as_dtype, host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.gradient_builder import GradientBuilder

#: Caffe2's floor on the L2 norm (no division by zero for an all-zero slice).
_KEPS = 1e-12


def _axis(ctx: OpContext, ndim: int) -> int:
    axis = ctx.int_arg("axis", -1)
    if not -ndim <= axis < ndim:
        raise ctx.fail(f"axis {axis} is out of range for a {ndim}-D input")
    return axis % ndim


@register_op("Normalize", inputs=1, outputs=1, shape=same_as_input())
def normalize(ctx: OpContext) -> Outputs:
    """Y = X / max(||X||_2 along ``axis`` (-1), 1e-12)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    norm = ctx.xp.sqrt((x * x).sum(axis=_axis(ctx, x.ndim), keepdims=True))
    return (as_dtype(ctx.xp, x / ctx.xp.maximum(norm, _KEPS), x.dtype),)


@register_op("NormalizeGradient", inputs=2, outputs=1, shape=same_as_input())
def normalize_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = (dY - Y <Y, dY>) / ||X|| (dY / 1e-12 where the norm is floored)."""
    x, dy = (ctx.xp.asarray(v) for v in ctx.inputs)
    axis = _axis(ctx, x.ndim)
    norm = ctx.xp.sqrt((x * x).sum(axis=axis, keepdims=True))
    floored = norm < _KEPS
    safe = ctx.xp.where(floored, _KEPS, norm)
    y = x / safe
    projected = dy - y * (y * dy).sum(axis=axis, keepdims=True)
    dx = ctx.xp.where(floored, dy / _KEPS, projected / safe)
    return (as_dtype(ctx.xp, dx, dy.dtype),)


@register_gradient("Normalize")
def _normalize_gradient(g: GradientBuilder) -> None:
    g.add("NormalizeGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("Mod", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def mod(ctx: OpContext) -> Outputs:
    """Integer X mod ``divisor``: the remainder takes the dividend's sign (C's %), or the
    divisor's with ``sign_follow_divisor``."""
    x = host(ctx.inputs[0])
    if x.dtype.kind not in "iu":
        raise ctx.fail(f"Mod takes int32 or int64 data, got {x.dtype}")
    divisor = ctx.int_arg("divisor", 0)
    if divisor == 0:
        raise ctx.fail("divisor must not be 0")
    d = np.asarray(divisor, dtype=x.dtype)
    out = np.mod(x, d) if ctx.int_arg("sign_follow_divisor", 0) else np.fmod(x, d)
    return (out.astype(x.dtype, copy=False),)


register_gradient("Mod")(no_gradient)
