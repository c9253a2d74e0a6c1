"""``LpNorm`` and its gradient (Caffe2's lpnorm_op): the L1 norm or the *squared* L2 norm
of a whole tensor, a [1] float tensor; ``average`` divides by the element count (an
empty tensor then gives nan).

Gradient clipping by norm takes ``Pow(LpNorm(g, p=2), exponent=0.5)`` for the L2 norm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import like_inputs
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2


def _norm_shape(op: Any, shapes: list, types: list) -> list:
    return [((1,), caffe2_pb2.TensorProto.FLOAT)]


def _order(ctx: OpContext) -> int:
    p = ctx.int_arg("p", 2)
    if p not in (1, 2):
        raise ctx.fail(f"p must be 1 or 2 (L1 or squared L2 norm), got {p}")
    return p


@register_op("LpNorm", inputs=1, outputs=1, shape=_norm_shape)
def lp_norm(ctx: OpContext) -> Outputs:
    """X -> [Σ|x|] (p=1) or [Σx²] (p=2), divided by numel(X) with ``average``."""
    x = ctx.xp.asarray(ctx.inputs[0]).astype(np.float32, copy=False)
    p = _order(ctx)
    total = ctx.xp.abs(x).sum() if p == 1 else (x * x).sum()
    if ctx.int_arg("average", 0):  # an empty X averages to 0/0 = nan, as in Caffe2
        total = total / x.size if x.size else np.float32(np.nan)
    return (ctx.xp.asarray(total, dtype=np.float32).reshape(1),)


@register_gradient("LpNorm")
def _lp_norm_grad(g: GradientBuilder) -> None:
    g.add("LpNormGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("LpNormGradient", inputs=2, outputs=1, shape=like_inputs(0))
def lp_norm_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = dY·sign(x) (p=1) or dY·2x (p=2), divided by numel(X) with
    ``average``."""
    x = ctx.xp.asarray(ctx.inputs[0])
    dy = float(np.asarray(ctx.inputs[1]).reshape(-1)[0]) if np.size(ctx.inputs[1]) else 0.0
    p = _order(ctx)
    grad = ctx.xp.sign(x) if p == 1 else 2.0 * x
    scale = dy / x.size if ctx.int_arg("average", 0) and x.size else dy
    return ((grad * scale).astype(x.dtype, copy=False),)
