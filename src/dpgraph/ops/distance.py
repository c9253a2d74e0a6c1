"""Row-wise distances of Caffe2's distance_op: ``L1Distance`` and ``CosineSimilarity`` and their
gradient ops (``SquaredL2Distance`` and ``DotProduct`` live in :mod:`dpgraph.ops.loss`).

X and Y must have the same shape.  Both are read as N rows of D values: N is the first
dimension (1 for a scalar) and D the product of the others, so a 1-D input is N rows of one
value each.  The output is the N-vector of per-row results.
"""

from __future__ import annotations

from typing import Any

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, like_inputs
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

#: Caffe2's guard: |x - y| at or below it counts as zero (L1), squared norms are at least it
#: (cosine).
_EPS = 1e-12


def _rows_shape(op: Any, shapes: list, types: list) -> list:
    """Caffe2's IdenticalTypeAndShapeOfInputDim(0, 0): [X.dims(0)] of X's type."""
    x = shapes[0]
    if x is None:
        return [None]
    return [((x[0] if len(x) else 1,), types[0] or FLOAT)]


def _operands(ctx: OpContext) -> tuple[Any, Any, int]:
    """X and Y as (N, D) matrices, and N; X and Y must have equal shapes."""
    x, y = (ctx.xp.asarray(v) for v in ctx.inputs[:2])
    if x.shape != y.shape:
        raise ctx.fail(f"X {tuple(x.shape)} and Y {tuple(y.shape)} must have the same shape")
    n = x.shape[0] if x.ndim else 1
    d = x.size // n if n else 0
    return x.reshape(n, d), y.reshape(n, d), n


def _row_gradient(ctx: OpContext, n: int) -> Any:
    """The incoming gradient dOUT (input 2) as an (N, 1) column; it must be an N-vector."""
    grad = ctx.xp.asarray(ctx.inputs[2])
    if grad.ndim != 1 or grad.shape[0] != n:
        raise ctx.fail(f"the output gradient must be a vector of {n} values (one per row), "
                       f"got shape {tuple(grad.shape)}")
    return grad.reshape(n, 1)


# --- L1Distance ------------------------------------------------------------------------------
@register_op("L1Distance", inputs=2, outputs=1, shape=_rows_shape)
def l1_distance(ctx: OpContext) -> Outputs:
    """[X, Y] -> Σ|X - Y| per row (an N-vector)."""
    x, y, _ = _operands(ctx)
    x0 = ctx.inputs[0]
    return (ctx.xp.abs(x - y).sum(axis=1).astype(x0.dtype, copy=False),)


@register_op("L1DistanceGradient", inputs=3, outputs=2, shape=like_inputs(0, 1))
def l1_distance_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dD] -> [dX = sign(X - Y)·dD, dY = -dX]; differences within 1e-12 of zero give 0."""
    x, y, n = _operands(ctx)
    xp = ctx.xp
    diff = x - y
    sign = (diff > _EPS).astype(x.dtype) - (diff < -_EPS).astype(x.dtype)
    dx = (sign * _row_gradient(ctx, n)).astype(x.dtype, copy=False)
    shape = ctx.inputs[0].shape
    return dx.reshape(shape), xp.negative(dx).reshape(shape)


@register_gradient("L1Distance")
def _l1_distance_grad(g: GradientBuilder) -> None:
    g.add("L1DistanceGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])


# --- CosineSimilarity ------------------------------------------------------------------------
def _norms(xp: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
    """Per-row ||x|| and ||y|| (squared norms floored at 1e-12) and x·y, as (N,) vectors."""
    x_norm = xp.sqrt(xp.maximum((x * x).sum(axis=1), x.dtype.type(_EPS)))
    y_norm = xp.sqrt(xp.maximum((y * y).sum(axis=1), y.dtype.type(_EPS)))
    return x_norm, y_norm, (x * y).sum(axis=1)


@register_op("CosineSimilarity", inputs=2, outputs=1, shape=_rows_shape)
def cosine_similarity(ctx: OpContext) -> Outputs:
    """[X, Y] -> x·y / (||x||·||y||) per row (an N-vector)."""
    x, y, _ = _operands(ctx)
    x_norm, y_norm, dot = _norms(ctx.xp, x, y)
    return ((dot / (x_norm * y_norm)).astype(ctx.inputs[0].dtype, copy=False),)


@register_op("CosineSimilarityGradient", inputs=3, outputs=2, shape=like_inputs(0, 1))
def cosine_similarity_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dCos] -> dX = dCos·(y/(|x||y|) - (x·y)·x/(|x|³|y|)), dY symmetrically."""
    x, y, n = _operands(ctx)
    x_norm, y_norm, dot = _norms(ctx.xp, x, y)
    grad = _row_gradient(ctx, n)
    both = (x_norm * y_norm)[:, None]
    dx = grad * (y / both - (dot / (x_norm * x_norm))[:, None] * x / both)
    dy = grad * (x / both - (dot / (y_norm * y_norm))[:, None] * y / both)
    dtype, shape = ctx.inputs[0].dtype, ctx.inputs[0].shape
    return (dx.astype(dtype, copy=False).reshape(shape),
            dy.astype(dtype, copy=False).reshape(shape))


@register_gradient("CosineSimilarity")
def _cosine_similarity_grad(g: GradientBuilder) -> None:
    g.add("CosineSimilarityGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])
