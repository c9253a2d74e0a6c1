"""``RoIPool`` and ``RoIPoolGradient`` (Caffe2's roi_pool_op): Fast R-CNN max pooling.

The arithmetic is Detectron's ``RoIPoolF`` (:mod:`dpgraph.ops.detectron`): each RoI
``[batch, x1, y1, x2, y2]`` is scaled by ``spatial_scale``, rounded and cut into
``pooled_h`` x ``pooled_w`` bins whose maxima (and flat H*W argmaxes) are the outputs.  RoIPool
adds Caffe2's ``is_test`` contract: one output (Y) with ``is_test=1``, two (Y, argmaxes)
otherwise; only the NCHW order exists.  Caffe2 implemented the gradient only on GPU; dpgraph
runs it everywhere.
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import GradientError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, INT32, like_inputs
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.detectron import roi_pool_f, roi_pool_f_gradient
from dpgraph.ops.gradient_builder import GradientBuilder


def _check_contract(ctx: OpContext) -> None:
    """Caffe2's constructor checks: NCHW order; 1 output iff is_test."""
    order = ctx.str_arg("order", "NCHW")
    if order != "NCHW":
        raise ctx.fail(f"only the NCHW order is supported, got order={order!r}")
    is_test = bool(ctx.int_arg("is_test", 0))
    if ctx.num_outputs != (1 if is_test else 2):
        raise ctx.fail(f"with is_test={int(is_test)} RoIPool has "
                       f"{'1 output (Y)' if is_test else '2 outputs (Y, argmaxes)'}, got "
                       f"{ctx.num_outputs}; set is_test or change the outputs")


def _roi_pool_shape(op: Any, shapes: list, types: list) -> list:
    """Y (R, C, pooled_h, pooled_w) of X's type; argmaxes the same shape, int32, unless
    is_test (Caffe2's channel dim follows ``order``)."""
    x, rois = shapes[0], shapes[1]
    if x is None or rois is None or len(x) != 4 or not rois:
        return [None] * len(op.output)
    args = arguments_dict(op.arg)
    channels = x[3] if args.get("order", "NCHW") == "NHWC" else x[1]
    dims = (rois[0], channels, int(args.get("pooled_h", 1)), int(args.get("pooled_w", 1)))
    if int(args.get("is_test", 0)):
        return [(dims, types[0] or FLOAT)]
    return [(dims, types[0] or FLOAT), (dims, INT32)][:len(op.output)]


@register_op("RoIPool", inputs=2, outputs=(1, 2), shape=_roi_pool_shape)
def roi_pool(ctx: OpContext) -> Outputs:
    """[X (N, C, H, W), RoIs (R, 5)] -> [Y (R, C, pooled_h, pooled_w), argmaxes (int32; not
    with is_test=1)].  Args: spatial_scale (1.0), pooled_h (1), pooled_w (1), is_test (0)."""
    _check_contract(ctx)
    return roi_pool_f(ctx)


@register_op("RoIPoolGradient", inputs=4, outputs=1, shape=like_inputs(0))
def roi_pool_gradient(ctx: OpContext) -> Outputs:
    """[X, RoIs, argmaxes, dY] -> dX: each dY element added at its argmax."""
    return roi_pool_f_gradient(ctx)


@register_gradient("RoIPool")
def _roi_pool_grad(g: GradientBuilder) -> None:
    if len(g.op.output) < 2:
        raise GradientError(f"RoIPool {list(g.op.input)} -> {list(g.op.output)} has no "
                            "argmaxes output (is_test=1); its gradient needs them: run it "
                            "with is_test=0 and two outputs")
    g.add("RoIPoolGradient", [g.I(0), g.I(1), g.O(1), g.GO(0)], [g.GI(0)])
