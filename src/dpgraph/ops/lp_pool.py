"""``LpPool`` and ``LpPoolGradient`` (Caffe2's lp_pool_op): the Lp norm of every pooling
window, ``Y = (Σ |x|^p)^(1/p)`` with ``p`` (float, default 2.0); padding adds nothing.

The window geometry (kernel, stride, pads, global_pooling, order) is the one every
Caffe2 pooling op reads (:mod:`dpgraph.ops._conv_util`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops import _conv_util as cu
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.nn import _pool_grad_shape, _pool_setup, _pool_shape


def _setup(ctx: OpContext, x: Any) -> tuple[str, Any, cu.Geometry, float]:
    order, xc, geom = _pool_setup(ctx, x)
    return order, xc, geom, ctx.float_arg("p", 2.0)


@register_op("LpPool", inputs=1, outputs=1, shape=_pool_shape)
def lp_pool(ctx: OpContext) -> Outputs:
    """X -> Y: (Σ_window |x|^p)^(1/p) per output position."""
    order, xc, geom, p = _setup(ctx, ctx.inputs[0])
    xp = ctx.xp
    out = geom.out_shape(xc.shape[2:])
    powered = cu.pad_spatial(xp, xp.abs(xc.astype(np.float32, copy=False)) ** p, geom)
    total = xp.zeros((*xc.shape[:2], *out), dtype=np.float32)
    for _, block in cu.offset_slices(geom, out):
        total += powered[block]
    y = (total ** (1.0 / p)).astype(np.float32, copy=False)
    return (cu.channel_last(y, order, xp),)


@register_op("LpPoolGradient", inputs=3, outputs=1, shape=_pool_grad_shape)
def lp_pool_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dY] -> dX: Σ over windows of dY · x · |x|^(p-2) / Y^(p-1)."""
    x, y, dy = ctx.inputs
    order, xc, geom, p = _setup(ctx, x)
    xp = ctx.xp
    yc, dyc = cu.channel_first(y, order), cu.channel_first(dy, order)
    if yc.shape != dyc.shape or yc.shape[:2] != xc.shape[:2]:
        raise ctx.fail(f"Y {y.shape} and dY {dy.shape} do not match X {x.shape}")
    out = yc.shape[2:]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = dyc / yc ** (p - 1)
        local = cu.pad_spatial(xp, xc * xp.abs(xc) ** (p - 2), geom)
    dxpad = xp.zeros((*xc.shape[:2], *geom.padded(xc.shape[2:])), dtype=np.float32)
    for _, block in cu.offset_slices(geom, out):
        dxpad[block] += share
    with np.errstate(invalid="ignore"):
        dx = (dxpad * local)[cu.inner_slices(geom, xc.shape[2:])]
    return (cu.channel_last(dx.astype(np.float32, copy=False), order, xp),)


@register_gradient("LpPool")
def _lp_pool_grad(g: GradientBuilder) -> None:
    g.add("LpPoolGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])
