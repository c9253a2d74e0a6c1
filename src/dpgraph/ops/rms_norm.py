"""``RMSNorm`` and ``RMSNormGradient`` (Caffe2's rms_norm_op).

X is viewed as an (M, N) matrix split at ``axis`` (default 1); per row
``rrms = 1 / sqrt(mean(x²) + eps)`` (``eps`` default 0.0) and ``Y = x·rrms·gamma + beta``.
Outputs Y (X's shape) and rrms (X's leading dims).
"""

from __future__ import annotations

import math

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2


def _split(ctx: OpContext, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(canonical axis, M, N) of X viewed as a matrix at ``axis``."""
    if len(shape) < 2:
        raise ctx.fail(f"RMSNorm needs an input of at least 2 dims, got shape {shape}")
    axis = ctx.int_arg("axis", 1)
    if not -len(shape) <= axis < len(shape):
        raise ctx.fail(f"axis {axis} is out of range for shape {shape}")
    axis %= len(shape)
    return axis, math.prod(shape[:axis]), math.prod(shape[axis:])


def _check_affine(ctx: OpContext, n: int, *indices: int) -> None:
    for index in indices:
        if ctx.inputs[index].size != n:
            raise ctx.fail(f"input {index} ({ctx.input_name(index)}) has "
                           f"{ctx.inputs[index].size} values, X has {n} per row")


def _rms_norm_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    x = shapes[0]
    if x is None:
        return [None, None]
    axis = next((a.i for a in op.arg if a.name == "axis"), 1) % max(len(x), 1)
    dtype = types[0] or caffe2_pb2.TensorProto.FLOAT
    return [(tuple(x), dtype), (tuple(x[:axis]), dtype)]


@register_op("RMSNorm", inputs=3, outputs=2, shape=_rms_norm_shape)
def rms_norm(ctx: OpContext) -> Outputs:
    """[X, gamma, beta] -> [Y, rrms]."""
    x, gamma, beta = ctx.inputs
    axis, m, n = _split(ctx, x.shape)
    _check_affine(ctx, n, 1, 2)
    xm = x.reshape(m, n)
    eps = x.dtype.type(ctx.float_arg("eps", 0.0))
    rrms = 1.0 / ctx.xp.sqrt((xm * xm).mean(axis=1) + eps) if n else ctx.xp.zeros(m, x.dtype)
    y = xm * rrms[:, None] * gamma.reshape(1, n) + beta.reshape(1, n)
    return (y.astype(x.dtype, copy=False).reshape(x.shape),
            rrms.astype(x.dtype, copy=False).reshape(x.shape[:axis]))


@register_op("RMSNormGradient", inputs=4, outputs=3)
def rms_norm_gradient(ctx: OpContext) -> Outputs:
    """[dY, X, gamma, rrms] -> [dX, dgamma, dbeta]."""
    dy, x, gamma, rrms = ctx.inputs
    _, m, n = _split(ctx, x.shape)
    _check_affine(ctx, n, 2)
    if dy.shape != x.shape or rrms.size != m:
        raise ctx.fail(f"dY {dy.shape} / rrms {rrms.shape} do not match X {x.shape}")
    dym, xm, r = dy.reshape(m, n), x.reshape(m, n), rrms.reshape(m, 1)
    g = gamma.reshape(1, n)
    ds = (dym * xm * g).sum(axis=1, keepdims=True)
    dx = r * dym * g - (ds * r ** 3 / max(n, 1)) * xm
    dgamma = (dym * xm * r).sum(axis=0)
    dbeta = dym.sum(axis=0)
    dtype = x.dtype
    return (dx.astype(dtype, copy=False).reshape(x.shape),
            dgamma.astype(dtype, copy=False).reshape(gamma.shape),
            dbeta.astype(dtype, copy=False).reshape(gamma.shape))


@register_gradient("RMSNorm")
def _rms_norm_grad(g: GradientBuilder) -> None:
    g.add("RMSNormGradient", [g.GO(0), g.I(0), g.I(1), g.O(1)], [g.GI(0), g.GI(1), g.GI(2)])
