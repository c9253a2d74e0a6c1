"""Elementwise unary ops of Caffe2's final release: Gelu, Mish, Softsign, Cbrt, Log1p,
Reciprocal and Logit, each with its gradient op and Caffe2's gradient-op inputs, and
ReplaceNaN.

Gelu's exact form uses erf (``fast_gelu=1``: the tanh approximation).
"""

from __future__ import annotations

import math

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import as_dtype, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.math import erf

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _arrays(ctx: OpContext) -> list:
    return [ctx.xp.asarray(v) for v in ctx.inputs]


def _normal_cdf(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + erf(ctx.xp, x / math.sqrt(2.0)))


def _fast_gelu_parts(xp: object, x: np.ndarray) -> tuple:
    inner = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x ** 3)
    return inner, xp.tanh(inner)  # type: ignore[attr-defined]


@register_op("Gelu", inputs=1, outputs=1, shape=same_as_input())
def gelu(ctx: OpContext) -> Outputs:
    """Y = X * Phi(X) (``fast_gelu``: 0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3))))."""
    (x,) = _arrays(ctx)
    if ctx.int_arg("fast_gelu", 0):
        _, t = _fast_gelu_parts(ctx.xp, x)
        return (as_dtype(ctx.xp, 0.5 * x * (1 + t), x.dtype),)
    return (as_dtype(ctx.xp, x * _normal_cdf(ctx, x), x.dtype),)


@register_op("GeluGradient", inputs=2, outputs=1, shape=same_as_input(1))
def gelu_gradient(ctx: OpContext) -> Outputs:
    """[dY, X] -> dX = dY (Phi(X) + X phi(X)) (or the derivative of the tanh form)."""
    dy, x = _arrays(ctx)
    xp = ctx.xp
    if ctx.int_arg("fast_gelu", 0):
        inner, t = _fast_gelu_parts(xp, x)
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * x * x)
        dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner)
    else:
        pdf = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        dx = dy * (_normal_cdf(ctx, x) + x * pdf)
    return (as_dtype(xp, dx, dy.dtype),)


@register_gradient("Gelu")
def _gelu_gradient(g: GradientBuilder) -> None:
    g.add("GeluGradient", [g.GO(0), g.I(0)], [g.GI(0)])


@register_op("Mish", inputs=1, outputs=1, shape=same_as_input())
def mish(ctx: OpContext) -> Outputs:
    """Y = X * tanh(softplus(X))."""
    (x,) = _arrays(ctx)
    return (as_dtype(ctx.xp, x * ctx.xp.tanh(ctx.xp.logaddexp(x, 0)), x.dtype),)


@register_op("MishGradient", inputs=3, outputs=1, shape=same_as_input())
def mish_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dY] -> dX = dY (tanh(sp) + X sigmoid(X) (1 - tanh(sp)^2)), sp = softplus(X)."""
    x, _, dy = _arrays(ctx)
    xp = ctx.xp
    t = xp.tanh(xp.logaddexp(x, 0))
    sigmoid = xp.exp(-xp.logaddexp(-x, 0))
    return (as_dtype(xp, dy * (t + x * sigmoid * (1 - t * t)), dy.dtype),)


@register_gradient("Mish")
def _mish_gradient(g: GradientBuilder) -> None:
    g.add("MishGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


@register_op("Softsign", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def softsign(ctx: OpContext) -> Outputs:
    """Y = X / (1 + |X|)."""
    (x,) = _arrays(ctx)
    return (as_dtype(ctx.xp, x / (1 + ctx.xp.abs(x)), x.dtype),)


@register_op("SoftsignGradient", inputs=2, outputs=1, shape=same_as_input(1))
def softsign_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = dY / (1 + |X|)^2."""
    x, dy = _arrays(ctx)
    return (as_dtype(ctx.xp, dy / (1 + ctx.xp.abs(x)) ** 2, dy.dtype),)


@register_gradient("Softsign")
def _softsign_gradient(g: GradientBuilder) -> None:
    g.add("SoftsignGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("Cbrt", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def cbrt(ctx: OpContext) -> Outputs:
    """Y = X^(1/3) (real cube root)."""
    (x,) = _arrays(ctx)
    return (as_dtype(ctx.xp, ctx.xp.cbrt(x), x.dtype),)


@register_op("CbrtGradient", inputs=2, outputs=1, shape=same_as_input(1))
def cbrt_gradient(ctx: OpContext) -> Outputs:
    """[dY, Y] -> dX = dY / (3 Y^2)."""
    dy, y = _arrays(ctx)
    return (as_dtype(ctx.xp, dy / (3 * y * y), dy.dtype),)


@register_gradient("Cbrt")
def _cbrt_gradient(g: GradientBuilder) -> None:
    g.add("CbrtGradient", [g.GO(0), g.O(0)], [g.GI(0)])


@register_op("Log1p", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def log1p(ctx: OpContext) -> Outputs:
    """Y = log(1 + X)."""
    (x,) = _arrays(ctx)
    return (as_dtype(ctx.xp, ctx.xp.log1p(x), x.dtype),)


@register_op("Log1pGradient", inputs=2, outputs=1, shape=same_as_input(1))
def log1p_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = dY / (1 + X)."""
    x, dy = _arrays(ctx)
    return (as_dtype(ctx.xp, dy / (1 + x), dy.dtype),)


@register_gradient("Log1p")
def _log1p_gradient(g: GradientBuilder) -> None:
    g.add("Log1pGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("Reciprocal", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def reciprocal(ctx: OpContext) -> Outputs:
    """Y = 1 / X."""
    (x,) = _arrays(ctx)
    return (as_dtype(ctx.xp, 1 / x, x.dtype),)


@register_op("ReciprocalGradient", inputs=2, outputs=1, shape=same_as_input())
def reciprocal_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY] -> dX = -dY Y^2."""
    y, dy = _arrays(ctx)
    return (as_dtype(ctx.xp, -dy * y * y, dy.dtype),)


@register_gradient("Reciprocal")
def _reciprocal_gradient(g: GradientBuilder) -> None:
    g.add("ReciprocalGradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_op("Logit", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def logit(ctx: OpContext) -> Outputs:
    """Y = log(p / (1 - p)) with p = X clipped to [eps, 1 - eps] (eps 1e-6)."""
    (x,) = _arrays(ctx)
    eps = ctx.float_arg("eps", 1e-6)
    p = ctx.xp.clip(x, eps, 1.0 - eps)
    return (as_dtype(ctx.xp, ctx.xp.log(p / (1.0 - p)), x.dtype),)


@register_op("LogitGradient", inputs=2, outputs=1, shape=same_as_input())
def logit_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = dY / (X (1 - X)) inside [eps, 1 - eps], 0 where X was clipped."""
    x, dy = _arrays(ctx)
    eps = ctx.float_arg("eps", 1e-6)
    inside = (x >= eps) & (x <= 1.0 - eps)
    safe = ctx.xp.where(inside, x, 0.5)
    return (as_dtype(ctx.xp, ctx.xp.where(inside, dy / (safe * (1.0 - safe)), 0.0), dy.dtype),)


@register_gradient("Logit")
def _logit_gradient(g: GradientBuilder) -> None:
    g.add("LogitGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("ReplaceNaN", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def replace_nan(ctx: OpContext) -> Outputs:
    """Y = X with every NaN replaced by ``value`` (0)."""
    (x,) = _arrays(ctx)
    value = ctx.float_arg("value", 0.0)
    return (ctx.xp.where(ctx.xp.isnan(x), ctx.xp.asarray(value, dtype=x.dtype), x),)
