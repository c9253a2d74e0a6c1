"""Detection operators (Caffe2's Detectron module and friends), each with Caffe2's gradient
op where it has one: SmoothL1Loss, SigmoidCrossEntropyLoss, (Weighted)SigmoidCrossEntropyWith
Logits, SigmoidFocalLoss, SoftmaxFocalLoss, ResizeNearest, RoIAlign, BatchPermutation,
SpatialNarrowAs.  The gradient-free RPN/FPN proposal ops live in :mod:`dpgraph.ops.proposals`.

Scalar losses are 0-d float arrays like Caffe2's.  RoIAlign is computed exactly as Caffe2's
bilinear sampling, but vectorised: the sampling weights of one RoI are separable into a
(pooled_h x H) row matrix and a (pooled_w x W) column matrix, so the pooled output of a chunk
of RoIs is two batched matrix products, and the gradient is their transpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, host, like_inputs, scalar_value
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

#: SigmoidCrossEntropyLoss's smallest normaliser (Caffe2 clamps the target count to it).
_MIN_NORMALIZER = 1e-5
#: Upper bound on the elements of one RoIAlign intermediate before chunking RoIs.
_ROI_CHUNK_ELEMENTS = 1 << 24


def _scalar_shape(op: Any, shapes: list, types: list) -> list:
    return [((), FLOAT)]


def _float_like(ctx: OpContext, x: Any) -> Any:
    """``x`` as a floating array (integers become float32)."""
    x = ctx.xp.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def _check_same_shape(ctx: OpContext, first: int, *others: int) -> None:
    shape = tuple(ctx.inputs[first].shape)
    for index in others:
        if tuple(ctx.inputs[index].shape) != shape:
            raise ctx.fail(f"input {ctx.input_name(index)!r} has shape "
                           f"{tuple(ctx.inputs[index].shape)}, expected {shape} (the shape of "
                           f"{ctx.input_name(first)!r})")


def _same_size(ctx: OpContext, first: int, *others: int) -> list[Any]:
    """Inputs ``others`` reshaped to input ``first``'s shape; like Caffe2, only their element
    counts must agree."""
    shape = tuple(ctx.inputs[first].shape)
    size = int(np.prod(shape, dtype=np.int64))
    out = []
    for index in others:
        value = ctx.xp.asarray(ctx.inputs[index])
        if value.size != size:
            raise ctx.fail(f"input {ctx.input_name(index)!r} has {value.size} elements (shape "
                           f"{tuple(value.shape)}), expected {size} like "
                           f"{ctx.input_name(first)!r} {shape}")
        out.append(value.reshape(shape))
    return out


# --- SmoothL1Loss ----------------------------------------------------------------------------
def _smooth_l1_parts(ctx: OpContext) -> tuple[Any, Any, Any, float, float]:
    """(alpha_in * (Y_hat - Y), alpha_in, alpha_out, beta, scale / N) after shape checks."""
    y_hat = ctx.inputs[0]
    if y_hat.ndim < 1 or ctx.inputs[1].ndim < 1 or y_hat.shape[0] != ctx.inputs[1].shape[0]:
        raise ctx.fail(f"Y_hat {tuple(y_hat.shape)} and Y {tuple(ctx.inputs[1].shape)} must "
                       f"be at least 1-D with the same batch size N (dimension 0)")
    y, alpha_in, alpha_out = _same_size(ctx, 0, 1, 2, 3)
    n = y_hat.shape[0]
    factor = ctx.float_arg("scale", 1.0) / n if n else 0.0
    return alpha_in * (y_hat - y), alpha_in, alpha_out, ctx.float_arg("beta", 1.0), factor


@register_op("SmoothL1Loss", inputs=4, outputs=1, shape=_scalar_shape)
def smooth_l1_loss(ctx: OpContext) -> Outputs:
    """[Y_hat, Y, alpha_in, alpha_out] -> loss = scale / N * sum(alpha_out *
    SmoothL1(alpha_in * (Y_hat - Y))); SmoothL1(x) = 0.5 x^2 / beta if |x| < beta else
    |x| - 0.5 beta.  Args beta (1.0), scale (1.0)."""
    xp = ctx.xp
    diff, _, alpha_out, beta, factor = _smooth_l1_parts(ctx)
    ad = xp.abs(diff)
    per = xp.where(ad < beta, 0.5 * diff * diff / beta, ad - 0.5 * beta)
    loss = (alpha_out * per).sum() * factor
    return (xp.asarray(loss, dtype=ctx.inputs[0].dtype),)


@register_gradient("SmoothL1Loss")
def _smooth_l1_loss_grad(g: GradientBuilder) -> None:
    g.add("SmoothL1LossGradient", [g.I(0), g.I(1), g.I(2), g.I(3), g.GO(0)], [g.GI(0)])


@register_op("SmoothL1LossGradient", inputs=5, outputs=1, shape=like_inputs(0))
def smooth_l1_loss_gradient(ctx: OpContext) -> Outputs:
    """[Y_hat, Y, alpha_in, alpha_out, d_loss] -> d_Y_hat."""
    xp = ctx.xp
    diff, alpha_in, alpha_out, beta, factor = _smooth_l1_parts(ctx)
    d_smooth = xp.where(xp.abs(diff) < beta, diff / beta, xp.sign(diff))
    scale = factor * scalar_value(ctx.inputs[4])
    d_y_hat = d_smooth * alpha_in * alpha_out * scale
    return (d_y_hat.astype(ctx.inputs[0].dtype, copy=False),)


# --- SigmoidCrossEntropyLoss -----------------------------------------------------------------
def _sigmoid_xent_targets(ctx: OpContext) -> Any:
    (targets,) = _same_size(ctx, 0, 1)
    if targets.dtype.kind not in "iu":
        raise ctx.fail(f"targets {ctx.input_name(1)!r} must be integers in {{-1, 0, 1}} "
                       f"(int32), got {targets.dtype}; cast with .astype(np.int32)")
    return targets


def _sigmoid_xent_scale(ctx: OpContext, valid: Any) -> float:
    """scale, divided by the number of non-ignored targets when ``normalize``."""
    scale = ctx.float_arg("scale", 1.0)
    if ctx.int_arg("normalize", 1):
        scale /= max(float(valid.sum()), _MIN_NORMALIZER)
    return scale


def _log1p_exp_neg_abs(xp: Any, x: Any) -> Any:
    """log(1 + exp(-|x|)), the stable part of the sigmoid cross entropy."""
    return xp.log1p(xp.exp(-xp.abs(x)))


def _sigmoid(xp: Any, x: Any) -> Any:
    """1 / (1 + exp(-x)) without overflow: exp is only taken of -|x|."""
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


@register_op("SigmoidCrossEntropyLoss", inputs=2, outputs=1, shape=_scalar_shape)
def sigmoid_cross_entropy_loss(ctx: OpContext) -> Outputs:
    """[X (logits), targets (int, -1 = ignore)] -> loss, the summed binary cross entropy
    of sigmoid(X), divided by the count of targets > -1 when ``normalize`` (default 1), times
    ``scale`` (default 1.0)."""
    xp = ctx.xp
    x = ctx.inputs[0]
    targets = _sigmoid_xent_targets(ctx)
    valid = targets != -1
    t = targets.astype(x.dtype)
    per = -x * (t - (x >= 0)) + _log1p_exp_neg_abs(xp, x)
    loss = xp.where(valid, per, 0).sum() * _sigmoid_xent_scale(ctx, valid)
    return (xp.asarray(loss, dtype=x.dtype),)


@register_gradient("SigmoidCrossEntropyLoss")
def _sigmoid_cross_entropy_loss_grad(g: GradientBuilder) -> None:
    g.add("SigmoidCrossEntropyLossGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("SigmoidCrossEntropyLossGradient", inputs=3, outputs=1, shape=like_inputs(0))
def sigmoid_cross_entropy_loss_gradient(ctx: OpContext) -> Outputs:
    """[X, targets, d_loss] -> dX = (sigmoid(X) - targets) * scale [/ count] * d_loss,
    zero where targets == -1."""
    xp = ctx.xp
    x = ctx.inputs[0]
    targets = _sigmoid_xent_targets(ctx)
    valid = targets != -1
    factor = _sigmoid_xent_scale(ctx, valid) * scalar_value(ctx.inputs[2])
    dx = xp.where(valid, _sigmoid(xp, x) - targets.astype(x.dtype), 0) * factor
    return (dx.astype(x.dtype, copy=False),)


# --- SigmoidCrossEntropyWithLogits -----------------------------------------------------------
def _with_logits_mode(ctx: OpContext) -> tuple[bool, bool]:
    log_d_trick = bool(ctx.int_arg("log_D_trick", 0))
    unjoined = bool(ctx.int_arg("unjoined_lr_loss", 0))
    if log_d_trick and unjoined:
        raise ctx.fail("log_D_trick and unjoined_lr_loss cannot both be set")
    return log_d_trick, unjoined


def _inner_size(x: Any) -> int:
    return int(x.shape[-1]) if x.ndim > 0 else 1


def _with_logits_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None:
        return [None]
    return [(tuple(shapes[0][:-1]), FLOAT)]


def _with_logits_forward(ctx: OpContext, weighted: bool) -> Outputs:
    xp = ctx.xp
    _check_same_shape(ctx, 0, 1, *((2,) if weighted else ()))
    lgt = _float_like(ctx, ctx.inputs[0])
    tgt = xp.asarray(ctx.inputs[1]).astype(lgt.dtype, copy=False)
    log_d_trick, unjoined = (False, False) if weighted else _with_logits_mode(ctx)
    pos = (lgt >= 0).astype(lgt.dtype)
    soft = _log1p_exp_neg_abs(xp, lgt)
    if unjoined:
        value = lgt * tgt + (tgt - 1) * lgt * pos - (1 - tgt) * soft
    elif log_d_trick:
        value = (2 * tgt - 1) * (lgt - (lgt * pos + soft))
    else:
        value = lgt * (tgt - pos) - soft
    if weighted:
        value = value * xp.asarray(ctx.inputs[2]).astype(lgt.dtype, copy=False)
    out_shape = lgt.shape[:-1] if lgt.ndim else ()
    if lgt.size == 0:
        return (xp.zeros(out_shape, dtype=lgt.dtype),)
    out = -value.reshape(-1, _inner_size(lgt)).mean(axis=1)
    return (out.reshape(out_shape).astype(lgt.dtype, copy=False),)


def _with_logits_backward(ctx: OpContext, weighted: bool) -> Outputs:
    xp = ctx.xp
    lgt = _float_like(ctx, ctx.inputs[1])
    tgt = xp.asarray(ctx.inputs[2]).astype(lgt.dtype, copy=False)
    inner = _inner_size(lgt)
    g = xp.asarray(ctx.inputs[0])
    if g.size * inner != lgt.size:
        raise ctx.fail(f"g has {g.size} entries, expected one per logits row "
                       f"({lgt.size // max(inner, 1)})")
    log_d_trick, unjoined = (False, False) if weighted else _with_logits_mode(ctx)
    if lgt.size == 0:
        return (xp.zeros_like(lgt),)
    if unjoined:
        back = tgt - (1 - tgt) * _sigmoid(xp, lgt)
    elif log_d_trick:
        back = (2 * tgt - 1) * _sigmoid(xp, -lgt)
    else:
        back = tgt - _sigmoid(xp, lgt)
    if weighted:
        back = back * xp.asarray(ctx.inputs[3]).astype(lgt.dtype, copy=False)
    factor = (-g.reshape(-1, 1).astype(lgt.dtype) / inner)
    return ((back.reshape(-1, inner) * factor).reshape(lgt.shape).astype(lgt.dtype),)


@register_op("SigmoidCrossEntropyWithLogits", inputs=2, outputs=1, shape=_with_logits_shape)
def sigmoid_cross_entropy_with_logits(ctx: OpContext) -> Outputs:
    """[logits, targets (float)] -> mean over the last axis of the binary cross entropy;
    args log_D_trick (0), unjoined_lr_loss (0)."""
    return _with_logits_forward(ctx, weighted=False)


@register_gradient("SigmoidCrossEntropyWithLogits")
def _sigmoid_cross_entropy_with_logits_grad(g: GradientBuilder) -> None:
    g.add("SigmoidCrossEntropyWithLogitsGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0)])


@register_op("SigmoidCrossEntropyWithLogitsGradient", inputs=3, outputs=1,
             shape=like_inputs(1))
def sigmoid_cross_entropy_with_logits_gradient(ctx: OpContext) -> Outputs:
    """[g, logits, targets] -> dlogits."""
    return _with_logits_backward(ctx, weighted=False)


@register_op("WeightedSigmoidCrossEntropyWithLogits", inputs=3, outputs=1,
             shape=_with_logits_shape)
def weighted_sigmoid_cross_entropy_with_logits(ctx: OpContext) -> Outputs:
    """[logits, targets, weights] -> mean over the last axis of the weighted binary cross
    entropy."""
    return _with_logits_forward(ctx, weighted=True)


@register_gradient("WeightedSigmoidCrossEntropyWithLogits")
def _weighted_sigmoid_cross_entropy_with_logits_grad(g: GradientBuilder) -> None:
    g.add("WeightedSigmoidCrossEntropyWithLogitsGradient",
          [g.GO(0), g.I(0), g.I(1), g.I(2)], [g.GI(0)])


@register_op("WeightedSigmoidCrossEntropyWithLogitsGradient", inputs=4, outputs=1,
             shape=like_inputs(1))
def weighted_sigmoid_cross_entropy_with_logits_gradient(ctx: OpContext) -> Outputs:
    """[g, logits, targets, weights] -> dlogits."""
    return _with_logits_backward(ctx, weighted=True)


# --- ResizeNearest ---------------------------------------------------------------------------
def _resize_scales(ctx: OpContext, scales_index: int) -> tuple[float, float]:
    """(height_scale, width_scale) from the args, or from the optional scales input."""
    if len(ctx.inputs) > scales_index:
        scales = host(ctx.inputs[scales_index]).astype(np.float32)
        if scales.shape != (2,):
            raise ctx.fail(f"scales must be a 1-D tensor of 2 values [height_scale, "
                           f"width_scale], got shape {scales.shape}")
        h_scale, w_scale = float(scales[0]), float(scales[1])
    else:
        h_scale = ctx.float_arg("height_scale", 1.0)
        w_scale = ctx.float_arg("width_scale", 1.0)
    if h_scale <= 0 or w_scale <= 0:
        raise ctx.fail(f"height_scale and width_scale must be > 0, got {h_scale}, {w_scale}")
    return h_scale, w_scale


def _spatial_axes(ctx: OpContext, x: Any) -> tuple[int, int]:
    if x.ndim != 4:
        raise ctx.fail(f"input must be 4-D, got shape {tuple(x.shape)}")
    order = ctx.str_arg("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise ctx.fail(f"order must be 'NCHW' or 'NHWC', got {order!r}")
    return (2, 3) if order == "NCHW" else (1, 2)


def _nearest_index(xp: Any, out_size: int, in_size: int, scale: float) -> Any:
    """Source index of each output row: min(int(i / scale), in_size - 1), in float32."""
    pos = xp.arange(out_size, dtype=np.float32) / np.float32(scale)
    return xp.minimum(pos.astype(np.int64), in_size - 1)


def _resize_out_size(size: int, scale: float) -> int:
    return int(np.float32(size) * np.float32(scale))


def _resize_shape(op: Any, shapes: list, types: list) -> list:
    args = arguments_dict(op.arg)
    if shapes[0] is None or len(shapes[0]) != 4 or len(op.input) > 1:
        return [None]
    n, a, b, c = shapes[0]
    h_scale, w_scale = float(args.get("height_scale", 1.0)), float(args.get("width_scale", 1.0))
    if args.get("order", "NCHW") in ("NHWC", b"NHWC"):
        dims = (n, _resize_out_size(a, h_scale), _resize_out_size(b, w_scale), c)
    else:
        dims = (n, a, _resize_out_size(b, h_scale), _resize_out_size(c, w_scale))
    return [(dims, types[0] or FLOAT)]


@register_op("ResizeNearest", inputs=(1, 2), outputs=1, shape=_resize_shape)
def resize_nearest(ctx: OpContext) -> Outputs:
    """[X (, scales)] -> Y, nearest-neighbour resize of the spatial axes to
    floor(H * height_scale) x floor(W * width_scale); args width_scale, height_scale (1.0),
    order (NCHW)."""
    xp = ctx.xp
    x = ctx.inputs[0]
    h_axis, w_axis = _spatial_axes(ctx, x)
    h_scale, w_scale = _resize_scales(ctx, 1)
    in_h, in_w = x.shape[h_axis], x.shape[w_axis]
    rows = _nearest_index(xp, _resize_out_size(in_h, h_scale), in_h, h_scale)
    cols = _nearest_index(xp, _resize_out_size(in_w, w_scale), in_w, w_scale)
    return (xp.take(xp.take(x, rows, axis=h_axis), cols, axis=w_axis),)


@register_gradient("ResizeNearest")
def _resize_nearest_grad(g: GradientBuilder) -> None:
    g.add("ResizeNearestGradient", [g.GO(0), *g.op.input[:2]], [g.GI(0)])


@register_op("ResizeNearestGradient", inputs=(2, 3), outputs=1, shape=like_inputs(1))
def resize_nearest_gradient(ctx: OpContext) -> Outputs:
    """[dY, X (, scales)] -> dX: each dY element added to the X element it was copied from."""
    xp = ctx.xp
    dy, x = ctx.inputs[0], ctx.inputs[1]
    h_axis, w_axis = _spatial_axes(ctx, x)
    h_scale, w_scale = _resize_scales(ctx, 2)
    in_h, in_w = x.shape[h_axis], x.shape[w_axis]
    rows = _nearest_index(xp, dy.shape[h_axis], in_h, h_scale)
    cols = _nearest_index(xp, dy.shape[w_axis], in_w, w_scale)
    # one-hot (out, in) matrices: summing dY through them scatters it back, vectorised
    row_map = (rows[:, None] == xp.arange(in_h)[None, :]).astype(dy.dtype)
    col_map = (cols[:, None] == xp.arange(in_w)[None, :]).astype(dy.dtype)
    moved = xp.moveaxis(dy, (h_axis, w_axis), (-2, -1))
    dx = xp.matmul(xp.matmul(row_map.T, moved), col_map)
    return (xp.moveaxis(dx, (-2, -1), (h_axis, w_axis)).astype(x.dtype, copy=False),)


# --- RoIAlign --------------------------------------------------------------------------------
class _RoIParams:
    """RoIAlign's arguments, read once."""

    def __init__(self, ctx: OpContext) -> None:
        self.spatial_scale = ctx.float_arg("spatial_scale", 1.0)
        self.pooled_h = ctx.int_arg("pooled_h", 1)
        self.pooled_w = ctx.int_arg("pooled_w", 1)
        self.sampling_ratio = ctx.int_arg("sampling_ratio", -1)
        self.aligned = bool(ctx.int_arg("aligned", 0))
        self.order = ctx.str_arg("order", "NCHW")
        if self.order not in ("NCHW", "NHWC"):
            raise ctx.fail(f"order must be 'NCHW' or 'NHWC', got {self.order!r}")
        if self.pooled_h <= 0 or self.pooled_w <= 0 or self.spatial_scale <= 0:
            raise ctx.fail("pooled_h, pooled_w and spatial_scale must be > 0")


def _rois(ctx: OpContext, rois: Any, batch: int) -> tuple[Any, Any]:
    """(batch index per RoI (int64), [R, 4] box corners) from a R x 4 or R x 5 RoI tensor."""
    xp = ctx.xp
    if rois.ndim != 2 or rois.shape[1] not in (4, 5):
        raise ctx.fail(f"RoIs must be R x 4 or R x 5 (batch, x1, y1, x2, y2), got shape "
                       f"{tuple(rois.shape)}")
    if rois.shape[1] == 4:
        return xp.zeros(rois.shape[0], dtype=np.int64), rois
    index = rois[:, 0].astype(np.int64)
    if index.size and (int(index.min()) < 0 or int(index.max()) >= batch):
        raise ctx.fail(f"RoI batch indices must lie in [0, {batch}), got "
                       f"[{int(index.min())}, {int(index.max())}]")
    return index, rois[:, 1:]


def _axis_weights(xp: Any, start: Any, length: Any, pooled: int, grid: Any, size: int,
                  dtype: Any) -> Any:
    """[R, pooled, size] matrix: the bilinear weights RoIAlign gives each feature row (or
    column) for every pooled bin, summed over the bin's ``grid`` sample points."""
    bin_size = length / dtype.type(pooled)
    steps = xp.arange(int(grid.max()) if grid.size else 0, dtype=dtype)
    inside = (steps[None, :] < grid[:, None])[:, None, :]  # [R, 1, G]
    gridf = xp.maximum(grid, 1).astype(dtype)
    pos = (start[:, None, None] + xp.arange(pooled, dtype=dtype)[None, :, None]
           * bin_size[:, None, None]
           + (steps[None, None, :] + dtype.type(0.5)) * bin_size[:, None, None]
           / gridf[:, None, None])  # [R, pooled, G]
    valid = inside & (pos >= -1) & (pos <= size)
    pos = xp.maximum(pos, 0)
    low = pos.astype(np.int64)
    at_edge = low >= size - 1
    low = xp.where(at_edge, size - 1, low)
    high = xp.where(at_edge, size - 1, low + 1)
    frac = xp.where(at_edge, 0, pos - low).astype(dtype)
    w_low = xp.where(valid, 1 - frac, 0)
    w_high = xp.where(valid, frac, 0)
    rows = start.shape[0] * pooled
    base = (xp.arange(rows, dtype=np.int64) * size).reshape(-1, pooled, 1)
    flat = xp.concatenate([(base + low).reshape(-1), (base + high).reshape(-1)])
    weights = xp.concatenate([w_low.reshape(-1), w_high.reshape(-1)])
    summed = xp.bincount(flat, weights=weights, minlength=rows * size)
    return summed.reshape(-1, pooled, size).astype(dtype)


def _roi_matrices(ctx: OpContext, params: _RoIParams, boxes: Any, height: int, width: int,
                  dtype: Any) -> tuple[Any, Any]:
    """Row weights [R, pooled_h, H] (already divided by the sample count) and column
    weights [R, pooled_w, W] of every RoI."""
    xp = ctx.xp
    dtype = np.dtype(dtype)
    boxes = boxes.astype(dtype) * dtype.type(params.spatial_scale)
    if params.aligned:
        boxes = boxes - dtype.type(0.5)
    start_w, start_h = boxes[:, 0], boxes[:, 1]
    roi_w, roi_h = boxes[:, 2] - start_w, boxes[:, 3] - start_h
    if params.aligned:
        if bool(((roi_w < 0) | (roi_h < 0)).any()):
            raise ctx.fail("RoIs in RoIAlign cannot have negative size when aligned=1")
    else:  # Caffe2 forces malformed RoIs to be 1 x 1
        roi_w, roi_h = xp.maximum(roi_w, 1), xp.maximum(roi_h, 1)
    if params.sampling_ratio > 0:
        grid_h = xp.full(boxes.shape[0], params.sampling_ratio, dtype=np.int64)
        grid_w = grid_h
    else:
        grid_h = xp.ceil(roi_h / dtype.type(params.pooled_h)).astype(np.int64)
        grid_w = xp.ceil(roi_w / dtype.type(params.pooled_w)).astype(np.int64)
    count = xp.maximum(grid_h * grid_w, 1).astype(dtype)
    rows = _axis_weights(xp, start_h, roi_h, params.pooled_h, grid_h, height, dtype)
    cols = _axis_weights(xp, start_w, roi_w, params.pooled_w, grid_w, width, dtype)
    return rows / count[:, None, None], cols


def _roi_chunks(xp: Any, index: Any, batch: int, per_roi: int) -> list[tuple[int, Any]]:
    """(image, RoI ids) groups: RoIs of one image, chunked to bound intermediate memory."""
    host_index = np.asarray(index.get() if hasattr(index, "get") else index)
    step = max(1, _ROI_CHUNK_ELEMENTS // max(per_roi, 1))
    groups: list[tuple[int, Any]] = []
    for image in np.unique(host_index):
        ids = np.flatnonzero(host_index == image)
        groups.extend((int(image), xp.asarray(ids[i:i + step]))
                      for i in range(0, ids.size, step))
    return groups


def _nchw(x: Any, order: str) -> Any:
    return x if order == "NCHW" else x.transpose(0, 3, 1, 2)


def _from_nchw(y: Any, order: str) -> Any:
    return y if order == "NCHW" else y.transpose(0, 2, 3, 1)


def roi_align_shape(op: Any, shapes: list, types: list) -> list:
    """[R, C, pooled_h, pooled_w] (NHWC: [R, pooled_h, pooled_w, C]) for X and R boxes."""
    if shapes[0] is None or shapes[1] is None or len(shapes[0]) != 4:
        return [None]
    args = arguments_dict(op.arg)
    ph, pw = int(args.get("pooled_h", 1)), int(args.get("pooled_w", 1))
    r = shapes[1][0]
    if args.get("order", "NCHW") in ("NHWC", b"NHWC"):
        return [((r, ph, pw, shapes[0][3]), types[0] or FLOAT)]
    return [((r, shapes[0][1], ph, pw), types[0] or FLOAT)]


@register_op("RoIAlign", inputs=2, outputs=1, shape=roi_align_shape)
def roi_align(ctx: OpContext) -> Outputs:
    """[X (N, C, H, W), RoIs (R x 5: batch, x1, y1, x2, y2; or R x 4)] -> Y
    (R, C, pooled_h, pooled_w): bilinear RoI pooling averaging sampling_ratio^2 points per
    bin (adaptive ceil(roi_size / pooled) when sampling_ratio <= 0).  Args spatial_scale (1.0),
    pooled_h, pooled_w (1), sampling_ratio (-1), order (NCHW), aligned (0)."""
    xp = ctx.xp
    params = _RoIParams(ctx)
    x = _nchw(ctx.inputs[0], params.order)
    rois = ctx.inputs[1]
    if x.ndim != 4:
        raise ctx.fail(f"X must be 4-D, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    ph, pw = params.pooled_h, params.pooled_w
    y = xp.zeros((rois.shape[0] if rois.ndim else 0, c, ph, pw), dtype=x.dtype)
    if rois.size == 0:
        return (_from_nchw(y, params.order),)
    index, boxes = _rois(ctx, rois, n)
    rows, cols = _roi_matrices(ctx, params, boxes, h, w, x.dtype)
    for image, ids in _roi_chunks(xp, index, n, ph * c * w):
        k = ids.shape[0]
        # [k*ph, H] @ [H, C*W] -> [k, ph, C, W]
        tmp = (rows[ids].reshape(k * ph, h) @ x[image].transpose(1, 0, 2).reshape(h, c * w))
        tmp = tmp.reshape(k, ph * c, w)
        out = xp.matmul(tmp, cols[ids].transpose(0, 2, 1))  # [k, ph*C, pw]
        y[ids] = out.reshape(k, ph, c, pw).transpose(0, 2, 1, 3)
    return (_from_nchw(y, params.order),)


@register_gradient("RoIAlign")
def _roi_align_grad(g: GradientBuilder) -> None:
    g.add("RoIAlignGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("RoIAlignGradient", inputs=3, outputs=1, shape=like_inputs(0))
def roi_align_gradient(ctx: OpContext) -> Outputs:
    """[X, RoIs, dY] -> dX: every dY bin spread back over its bilinear sampling points."""
    xp = ctx.xp
    params = _RoIParams(ctx)
    x = _nchw(ctx.inputs[0], params.order)
    rois = ctx.inputs[1]
    dy = _nchw(ctx.inputs[2], params.order)
    n, c, h, w = x.shape
    ph, pw = params.pooled_h, params.pooled_w
    dx = xp.zeros((n, c, h, w), dtype=x.dtype)
    if rois.size == 0:
        return (_from_nchw(dx, params.order),)
    index, boxes = _rois(ctx, rois, n)
    if tuple(dy.shape) != (rois.shape[0], c, ph, pw):
        raise ctx.fail(f"dY has shape {tuple(dy.shape)}, expected "
                       f"{(rois.shape[0], c, ph, pw)} (R, C, pooled_h, pooled_w)")
    rows, cols = _roi_matrices(ctx, params, boxes, h, w, x.dtype)
    dy = dy.astype(x.dtype, copy=False)
    for image, ids in _roi_chunks(xp, index, n, ph * c * w):
        k = ids.shape[0]
        # [k, C*ph, pw] @ [k, pw, W] -> [k, C, ph, W] -> [k*ph, C*W]
        tmp = xp.matmul(dy[ids].reshape(k, c * ph, pw), cols[ids])
        tmp = tmp.reshape(k, c, ph, w).transpose(0, 2, 1, 3).reshape(k * ph, c * w)
        grad = rows[ids].reshape(k * ph, h).T @ tmp  # [H, C*W]
        dx[image] += grad.reshape(h, c, w).transpose(1, 0, 2)
    return (_from_nchw(dx, params.order),)


# --- BatchPermutation ------------------------------------------------------------------------
def _permutation(ctx: OpContext, indices: Any, batch: int) -> Any:
    indices = ctx.xp.asarray(indices)
    if indices.ndim != 1 or indices.dtype.kind not in "iu":
        raise ctx.fail(f"indices must be a 1-D integer tensor, got shape "
                       f"{tuple(indices.shape)} and dtype {indices.dtype}")
    if indices.shape[0] != batch:
        raise ctx.fail(f"indices has {indices.shape[0]} entries, expected the batch size "
                       f"{batch}")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= batch):
        raise ctx.fail(f"indices must lie in [0, {batch}), got [{int(indices.min())}, "
                       f"{int(indices.max())}]")
    return indices.astype(np.int64)


@register_op("BatchPermutation", inputs=2, outputs=1, shape=like_inputs(0))
def batch_permutation(ctx: OpContext) -> Outputs:
    """[X, indices] -> Y with Y[i] = X[indices[i]]."""
    x = ctx.inputs[0]
    return (x[_permutation(ctx, ctx.inputs[1], x.shape[0])],)


@register_gradient("BatchPermutation")
def _batch_permutation_grad(g: GradientBuilder) -> None:
    g.add("BatchPermutationGradient", [g.I(1), g.GO(0)], [g.GI(0)])


@register_op("BatchPermutationGradient", inputs=2, outputs=1, shape=like_inputs(1))
def batch_permutation_gradient(ctx: OpContext) -> Outputs:
    """[indices, dY] -> dX with dX[indices[i]] = dY[i]."""
    dy = ctx.inputs[1]
    dx = ctx.xp.zeros_like(dy)
    dx[_permutation(ctx, ctx.inputs[0], dy.shape[0])] = dy
    return (dx,)


# --- SpatialNarrowAs -------------------------------------------------------------------------
def _narrow_size(ctx: OpContext, a: Any, b: Any) -> tuple[int, int]:
    """(height, width) of the narrowed output, with Caffe2's checks: A is (N, C, H, W); B is
    (N, C, H', W') or (N, H', W'), with H' <= H and W' <= W."""
    if a.ndim != 4 or b.ndim not in (3, 4):
        raise ctx.fail(f"A must be 4-D (N, C, H, W) and B 4-D (N, C, H', W') or 3-D "
                       f"(N, H', W'), got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ctx.fail(f"Input dim 0 must be equal: A {tuple(a.shape)}, B {tuple(b.shape)}")
    if b.ndim == 4 and a.shape[1] != b.shape[1]:
        raise ctx.fail(f"Input dim 1 must be equal: A {tuple(a.shape)}, B {tuple(b.shape)}")
    out_h, out_w = int(b.shape[-2]), int(b.shape[-1])
    if out_h > a.shape[2]:
        raise ctx.fail(f"Input 0 height must be >= input 1 height: B's {out_h} exceeds A's "
                       f"{a.shape[2]}")
    if out_w > a.shape[3]:
        raise ctx.fail(f"Input 0 width must be >= input 1 width: B's {out_w} exceeds A's "
                       f"{a.shape[3]}")
    return out_h, out_w


def _narrow_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None or shapes[1] is None or len(shapes[0]) != 4:
        return [None]
    return [((*shapes[0][:-2], *shapes[1][-2:]), types[0] or FLOAT)]


@register_op("SpatialNarrowAs", inputs=2, outputs=1, shape=_narrow_shape)
def spatial_narrow_as(ctx: OpContext) -> Outputs:
    """[A (N, C, H, W), B (N, C, H', W') or (N, H', W')] -> C = A[:, :, :H', :W'] (rows and
    columns removed from the bottom/right)."""
    a, b = ctx.inputs
    out_h, out_w = _narrow_size(ctx, a, b)
    return (ctx.xp.ascontiguousarray(a[..., :out_h, :out_w]),)


@register_gradient("SpatialNarrowAs")
def _spatial_narrow_as_grad(g: GradientBuilder) -> None:
    g.add("SpatialNarrowAsGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("SpatialNarrowAsGradient", inputs=3, outputs=1, shape=like_inputs(0))
def spatial_narrow_as_gradient(ctx: OpContext) -> Outputs:
    """[A, B, dC] -> dA: dC in the top-left window, zeros elsewhere."""
    a, b, dc = ctx.inputs
    out_h, out_w = _narrow_size(ctx, a, b)
    da = ctx.xp.zeros(a.shape, dtype=dc.dtype)
    da[..., :out_h, :out_w] = dc
    return (da,)


# --- Focal losses (RetinaNet) ----------------------------------------------------------------
_FLT_MIN = float(np.finfo(np.float32).tiny)
_LOG_FLT_MIN = float(np.log(_FLT_MIN))


class _FocalParams:
    """Focal-loss arguments and the (N, A, K, H, W) view of a (N, A*K, H, W) input."""

    def __init__(self, ctx: OpContext, default_classes: int) -> None:
        self.scale = ctx.float_arg("scale", 1.0)
        self.alpha = ctx.float_arg("alpha", 0.25)
        self.gamma = ctx.float_arg("gamma", 1.0)
        self.num_classes = ctx.int_arg("num_classes", default_classes)
        x, labels = ctx.inputs[0], ctx.xp.asarray(ctx.inputs[1])
        k = self.num_classes
        if x.ndim != 4 or k <= 0 or x.shape[1] % k:
            raise ctx.fail(f"input 0 must be 4-D (N, num_anchors * num_classes, H, W) with "
                           f"num_classes={k}, got shape {tuple(x.shape)}")
        n, d, h, w = x.shape
        if tuple(labels.shape) != (n, d // k, h, w) or labels.dtype.kind not in "iu":
            raise ctx.fail(f"labels must be integer (int32) of shape {(n, d // k, h, w)}, got "
                           f"{labels.dtype} {tuple(labels.shape)}")
        self.grouped = x.reshape(n, d // k, k, h, w)
        self.labels = labels.astype(np.int64)
        self.normalizer = max(scalar_value(ctx.inputs[2]), 1.0)


def _log_one_minus_sigmoid(xp: Any, x: Any) -> Any:
    """log(1 - sigmoid(x)) = -x * (x >= 0) - log(1 + exp(-|x|)), as Caffe2 computes it."""
    return -x * (x >= 0) - _log1p_exp_neg_abs(xp, x)


def _sigmoid_focal_terms(ctx: OpContext, fp: _FocalParams) -> tuple[Any, Any, Any, Any]:
    """(logits, p, positive mask * alpha / Np, negative mask * (1 - alpha) / Np)."""
    xp = ctx.xp
    x = fp.grouped
    classes = xp.arange(1, fp.num_classes + 1).reshape(1, 1, -1, 1, 1)
    t = fp.labels[:, :, None]
    positive = t == classes
    negative = (t != -1) & ~positive
    zp = positive * x.dtype.type(fp.alpha / fp.normalizer)
    zn = negative * x.dtype.type((1 - fp.alpha) / fp.normalizer)
    return x, _sigmoid(xp, x), zp, zn


def _clamped_log_sigmoid(xp: Any, x: Any) -> Any:
    """log(max(sigmoid(x), FLT_MIN)) as Caffe2 computes it, without forming sigmoid(x):
    log(sigmoid(x)) = -(max(-x, 0) + log(1 + exp(-|x|)))."""
    return xp.maximum(-(xp.maximum(-x, 0) + _log1p_exp_neg_abs(xp, x)), _LOG_FLT_MIN)


@register_op("SigmoidFocalLoss", inputs=3, outputs=1, shape=_scalar_shape)
def sigmoid_focal_loss(ctx: OpContext) -> Outputs:
    """[logits (N, A*K, H, W), labels (N, A, H, W): 1..K = class, 0 = background, -1 =
    ignore, normalizer] -> loss; args scale (1.0), alpha (0.25), gamma (1.0),
    num_classes (80)."""
    xp = ctx.xp
    fp = _FocalParams(ctx, 80)
    x, p, zp, zn = _sigmoid_focal_terms(ctx, fp)
    term1 = (1 - p) ** fp.gamma * _clamped_log_sigmoid(xp, x)
    term2 = p ** fp.gamma * _log_one_minus_sigmoid(xp, x)
    loss = -(zp * term1 + zn * term2).sum() * fp.scale
    return (xp.asarray(loss, dtype=x.dtype),)


@register_gradient("SigmoidFocalLoss")
def _sigmoid_focal_loss_grad(g: GradientBuilder) -> None:
    g.add("SigmoidFocalLossGradient", [g.I(0), g.I(1), g.I(2), g.GO(0)], [g.GI(0)])


@register_op("SigmoidFocalLossGradient", inputs=4, outputs=1, shape=like_inputs(0))
def sigmoid_focal_loss_gradient(ctx: OpContext) -> Outputs:
    """[logits, labels, normalizer, d_loss] -> d_logits."""
    xp = ctx.xp
    fp = _FocalParams(ctx, 80)
    x, p, zp, zn = _sigmoid_focal_terms(ctx, fp)
    g = fp.gamma
    term1 = (1 - p) ** g * (1 - p - p * g * _clamped_log_sigmoid(xp, x))
    term2 = p ** g * (_log_one_minus_sigmoid(xp, x) * (1 - p) * g - p)
    factor = x.dtype.type(fp.scale * scalar_value(ctx.inputs[3]))
    dx = -(zp * term1 + zn * term2) * factor
    return (dx.reshape(ctx.inputs[0].shape).astype(x.dtype, copy=False),)


def _softmax_focal_parts(ctx: OpContext, fp: _FocalParams, probs: Any) -> tuple[Any, Any, Any]:
    """(p of each location's labelled class [N, A, 1, H, W], per-location weight z with
    ignored locations zeroed, clipped label) for SoftmaxFocalLoss."""
    xp = ctx.xp
    labels = fp.labels
    if labels.size and int(labels.max()) >= fp.num_classes:
        raise ctx.fail(f"labels must lie in [-1, {fp.num_classes}), got max "
                       f"{int(labels.max())}")
    dtype = probs.dtype.type
    z = ((labels == 0) * dtype((1 - fp.alpha) / fp.normalizer)
         + (labels >= 1) * dtype(fp.alpha / fp.normalizer))
    safe = xp.maximum(labels, 0)[:, :, None]
    p_t = xp.take_along_axis(probs, safe, axis=2)
    return p_t, z[:, :, None].astype(probs.dtype), safe


@register_op("SoftmaxFocalLoss", inputs=3, outputs=2,
             shape=lambda op, s, t: [((), FLOAT), like_inputs(0)(op, s, t)[0]])
def softmax_focal_loss(ctx: OpContext) -> Outputs:
    """[scores (N, A*K, H, W), labels (N, A, H, W): 0..K-1, -1 = ignore, normalizer] ->
    [loss, probabilities] with a softmax over each anchor's K scores; args scale (1.0),
    alpha (0.25), gamma (1.0), num_classes (81)."""
    xp = ctx.xp
    fp = _FocalParams(ctx, 81)
    x = fp.grouped
    e = xp.exp(x - x.max(axis=2, keepdims=True))
    probs = e / e.sum(axis=2, keepdims=True)
    p_t, z, _ = _softmax_focal_parts(ctx, fp, probs)
    per = -((1 - p_t) ** fp.gamma) * xp.log(xp.maximum(p_t, _FLT_MIN)) * z
    loss = per.sum() * fp.scale
    return xp.asarray(loss, dtype=x.dtype), probs.reshape(ctx.inputs[0].shape)


@register_gradient("SoftmaxFocalLoss")
def _softmax_focal_loss_grad(g: GradientBuilder) -> None:
    g.add("SoftmaxFocalLossGradient", [g.I(0), g.I(1), g.I(2), g.O(1), g.GO(0)], [g.GI(0)])


@register_op("SoftmaxFocalLossGradient", inputs=5, outputs=1, shape=like_inputs(0))
def softmax_focal_loss_gradient(ctx: OpContext) -> Outputs:
    """[scores, labels, normalizer, probabilities, d_loss] -> d_scores."""
    xp = ctx.xp
    fp = _FocalParams(ctx, 81)
    probs = xp.asarray(ctx.inputs[3]).reshape(fp.grouped.shape)
    p_t, z, safe = _softmax_focal_parts(ctx, fp, probs)
    g = fp.gamma
    one_m = 1 - p_t
    # g (1 - p)^(g - 1) p log p tends to 0 as p -> 1, also for g < 1 (where the power alone
    # is infinite): evaluate it only where 1 - p > 0
    positive = one_m > 0
    power = xp.where(positive, xp.where(positive, one_m, 1) ** (g - 1), 0)
    buff = (-(one_m ** g) + g * power * p_t * xp.log(xp.maximum(p_t, _FLT_MIN))) * z
    is_label = safe == xp.arange(fp.num_classes).reshape(1, 1, -1, 1, 1)
    factor = probs.dtype.type(fp.scale * scalar_value(ctx.inputs[4]))
    dx = buff * (is_label - probs) * factor
    return (dx.reshape(ctx.inputs[0].shape).astype(probs.dtype, copy=False),)
