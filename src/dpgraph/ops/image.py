"""Image and detection operators: bilinear upsampling, padding, integral images, box transforms
and per-class NMS, Box-Cox, bucketizing and sinusoid position encodings.

Resampling ops (``UpsampleBilinear``, ``PadImage``) are separable: each spatial axis is a
small (out × in) matrix, so a forward pass is ``A_h · X · A_wᵀ`` and the gradient is
``A_hᵀ · dY · A_w`` — vectorised einsums, no per-pixel loops.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, NotSupportedError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, host, same_as_input
from dpgraph.ops._conv_util import (
    channel_first,
    channel_last,
    check_order,
    col2im,
    inner_slices,
    pad_spatial,
    parse_geometry,
    window_view,
)
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.nms import SOFT_NMS_METHODS, hard_nms, soft_nms


def _check_4d(ctx: OpContext, x: Any, what: str = "X") -> None:
    if x.ndim != 4:
        raise ctx.fail(f"{what} must be a 4-D image batch, got shape {tuple(x.shape)}")


def _separable(xp: Any, x: Any, rows: Any, cols: Any, nhwc: bool = False) -> Any:
    """``rows · x · colsᵀ`` over the two spatial axes of an NCHW (or NHWC) batch."""
    rows = xp.asarray(rows, dtype=x.dtype)
    cols = xp.asarray(cols, dtype=x.dtype)
    planes = xp.moveaxis(x, 3, 1) if nhwc else x  # (N, C, H, W)
    out = xp.matmul(rows, xp.matmul(planes, cols.T))  # two BLAS products, not a 3-way einsum
    return xp.ascontiguousarray(xp.moveaxis(out, 1, 3)) if nhwc else out


# --- UpsampleBilinear ------------------------------------------------------------------------
def _interp_matrix(size_in: int, size_out: int) -> np.ndarray:
    """(out × in) align-corners bilinear weights, exactly as Caffe2's float32 arithmetic."""
    ratio = np.float32((size_in - 1) / (size_out - 1)) if size_out > 1 else np.float32(0)
    pos = ratio * np.arange(size_out, dtype=np.float32)
    low = pos.astype(np.int64)
    step = (low < size_in - 1).astype(np.int64)
    frac = pos - low.astype(np.float32)
    mat = np.zeros((size_out, size_in), np.float32)
    rows = np.arange(size_out)
    np.add.at(mat, (rows, low), np.float32(1) - frac)
    np.add.at(mat, (rows, low + step), frac)
    return mat


def _upsample_scales(ctx: OpContext) -> tuple[float, float]:
    if ctx.num_inputs == 2:
        scales = host(ctx.inputs[-1]).reshape(-1)
        if scales.size != 2:
            raise ctx.fail(f"scales must hold [height_scale, width_scale], got {scales}")
        return float(np.float32(scales[0])), float(np.float32(scales[1]))
    return ctx.float_arg("height_scale", 1.0), ctx.float_arg("width_scale", 1.0)


@register_op("UpsampleBilinear", inputs=(1, 2), outputs=1)
def upsample_bilinear(ctx: OpContext) -> Outputs:
    """[X (NCHW), scales?] -> X resized by (height_scale, width_scale), align-corners."""
    x = ctx.inputs[0]
    _check_4d(ctx, x)
    h_scale, w_scale = _upsample_scales(ctx)
    out_h = int(np.float32(x.shape[2]) * np.float32(h_scale))
    out_w = int(np.float32(x.shape[3]) * np.float32(w_scale))
    rows = _interp_matrix(x.shape[2], out_h)
    cols = _interp_matrix(x.shape[3], out_w)
    return (_separable(ctx.xp, x, rows, cols),)


@register_gradient("UpsampleBilinear")
def _upsample_grad(g: GradientBuilder) -> None:
    inputs = [g.GO(0), g.I(0)] + ([g.I(1)] if len(g.op.input) == 2 else [])
    g.add("UpsampleBilinearGradient", inputs, [g.GI(0)])


@register_op("UpsampleBilinearGradient", inputs=(2, 3), outputs=1, shape=same_as_input(1))
def upsample_bilinear_gradient(ctx: OpContext) -> Outputs:
    """[dY, X, scales?] -> dX: the transposed interpolation applied to dY."""
    dy, x = ctx.inputs[0], ctx.inputs[1]
    _check_4d(ctx, dy, "dY")
    rows = _interp_matrix(x.shape[2], dy.shape[2]).T
    cols = _interp_matrix(x.shape[3], dy.shape[3]).T
    return (_separable(ctx.xp, dy, rows, cols),)


# --- PadImage --------------------------------------------------------------------------------
def _pads(ctx: OpContext) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads``, ``pad`` or ``pad_t/pad_l/pad_b/pad_r``."""
    if ctx.has_arg("pads"):
        pads = ctx.ints_arg("pads")
        if len(pads) != 4:
            raise ctx.fail(f"pads must have 4 entries [t, l, b, r], got {pads}")
        return pads[0], pads[1], pads[2], pads[3]
    pad = ctx.int_arg("pad", 0)
    return (ctx.int_arg("pad_t", pad), ctx.int_arg("pad_l", pad), ctx.int_arg("pad_b", pad),
            ctx.int_arg("pad_r", pad))


def _pad_matrix(ctx: OpContext, size: int, before: int, after: int, mode: str) -> np.ndarray:
    """(out × in) 0/1 matrix mapping input rows to padded rows (all-zero rows = constant)."""
    out = size + before + after
    if out < 0:
        raise ctx.fail(f"padding ({before}, {after}) crops more than the {size} rows")
    src = np.arange(out) - before
    if mode == "constant":
        valid = (src >= 0) & (src < size)
    elif mode == "reflect":
        if max(before, after) >= size:
            raise ctx.fail(f"reflect padding {max(before, after)} needs more than {size} rows")
        src = np.abs(src)
        src = np.where(src >= size, 2 * size - 2 - src, src)
        valid = np.ones(out, bool)
    elif mode == "edge":
        src = np.clip(src, 0, size - 1)
        valid = np.full(out, size > 0)
    else:
        raise ctx.fail(f"unknown mode {mode!r}: use 'constant', 'reflect' or 'edge'")
    mat = np.zeros((out, size), np.float32)
    mat[np.flatnonzero(valid), src[valid]] = 1
    return mat


def _pad_matrices(ctx: OpContext, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    top, left, bottom, right = _pads(ctx)
    mode = ctx.str_arg("mode", "constant")
    return (_pad_matrix(ctx, height, top, bottom, mode),
            _pad_matrix(ctx, width, left, right, mode))


def _is_nhwc(ctx: OpContext) -> bool:
    order = ctx.str_arg("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise ctx.fail(f"order must be NCHW or NHWC, got {order!r}")
    return order == "NHWC"


@register_op("PadImage", inputs=1, outputs=1)
def pad_image(ctx: OpContext) -> Outputs:
    """X -> X padded by (pad_t, pad_l, pad_b, pad_r); ``mode`` constant/reflect/edge.

    Negative pads crop.  Constant padding fills with ``value`` (default 0).
    """
    x = ctx.inputs[0]
    _check_4d(ctx, x)
    nhwc = _is_nhwc(ctx)
    h_axis = 1 if nhwc else 2
    rows, cols = _pad_matrices(ctx, x.shape[h_axis], x.shape[h_axis + 1])
    y = _separable(ctx.xp, x, rows, cols, nhwc)
    value = ctx.float_arg("value", 0.0)
    if value != 0.0 and ctx.str_arg("mode", "constant") == "constant":
        border = 1 - np.outer(rows.sum(axis=1), cols.sum(axis=1))
        border = border[:, :, None] if nhwc else border
        y = y + ctx.xp.asarray(border * value, dtype=y.dtype)
    return (y,)


@register_gradient("PadImage")
def _pad_image_grad(g: GradientBuilder) -> None:
    g.add("PadImageGradient", [g.GO(0)], [g.GI(0)])


@register_op("PadImageGradient", inputs=1, outputs=1)
def pad_image_gradient(ctx: OpContext) -> Outputs:
    """dY -> dX: padded positions routed back to the input pixel each one copied."""
    dy = ctx.inputs[0]
    _check_4d(ctx, dy, "dY")
    nhwc = _is_nhwc(ctx)
    h_axis = 1 if nhwc else 2
    top, left, bottom, right = _pads(ctx)
    height = dy.shape[h_axis] - top - bottom
    width = dy.shape[h_axis + 1] - left - right
    rows, cols = _pad_matrices(ctx, height, width)
    return (_separable(ctx.xp, dy, rows.T, cols.T, nhwc),)


# --- IntegralImage ---------------------------------------------------------------------------
def _integral_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None or len(shapes[0]) != 4:
        return [None]
    n, c, h, w = shapes[0]
    return [((n, c, h + 1, w + 1), types[0] or FLOAT)]


@register_op("IntegralImage", inputs=1, outputs=1, shape=_integral_shape)
def integral_image(ctx: OpContext) -> Outputs:
    """X (N×C×H×W) -> (N×C×(H+1)×(W+1)) with Y[..., i, j] = sum(X[..., :i, :j])."""
    x = ctx.inputs[0]
    _check_4d(ctx, x)
    xp = ctx.xp
    y = xp.zeros((*x.shape[:2], x.shape[2] + 1, x.shape[3] + 1), dtype=x.dtype)
    y[:, :, 1:, 1:] = xp.cumsum(xp.cumsum(x, axis=2, dtype=x.dtype), axis=3, dtype=x.dtype)
    return (y,)


@register_gradient("IntegralImage")
def _integral_image_grad(g: GradientBuilder) -> None:
    g.add("IntegralImageGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("IntegralImageGradient", inputs=2, outputs=1, shape=same_as_input(0))
def integral_image_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX, computed as Caffe2 does: the running 2-D sum of dY's top-left H×W block.

    This reproduces Caffe2's kernel (the recorded golden case), which is not the exact
    adjoint of ``IntegralImage`` (that would sum ``dY[..., h+1:, w+1:]``).
    """
    x, dy = ctx.inputs
    _check_4d(ctx, dy, "dY")
    if tuple(dy.shape) != (*x.shape[:2], x.shape[2] + 1, x.shape[3] + 1):
        raise ctx.fail(f"dY shape {tuple(dy.shape)} does not match X shape {tuple(x.shape)}")
    xp = ctx.xp
    block = dy[:, :, :x.shape[2], :x.shape[3]]
    return (xp.cumsum(xp.cumsum(block, axis=2, dtype=dy.dtype), axis=3, dtype=dy.dtype),)


# --- BBoxTransform ---------------------------------------------------------------------------
def _upright_transform(boxes: np.ndarray, deltas: np.ndarray, weights: list[float],
                       minus_one: float) -> np.ndarray:
    """Apply (dx, dy, dw, dh) deltas (R × 4K) to boxes (R × 4), Detectron style."""
    widths = boxes[:, 2:3] - boxes[:, 0:1] + 1.0
    heights = boxes[:, 3:4] - boxes[:, 1:2] + 1.0
    ctr_x = boxes[:, 0:1] + 0.5 * widths
    ctr_y = boxes[:, 1:2] + 0.5 * heights
    clip = math.log(1000.0 / 16.0)
    dx, dy = deltas[:, 0::4] / weights[0], deltas[:, 1::4] / weights[1]
    dw = np.minimum(deltas[:, 2::4] / weights[2], clip)
    dh = np.minimum(deltas[:, 3::4] / weights[3], clip)
    pred_x, pred_y = dx * widths + ctr_x, dy * heights + ctr_y
    pred_w, pred_h = np.exp(dw) * widths, np.exp(dh) * heights
    out = np.empty_like(deltas)
    out[:, 0::4] = pred_x - 0.5 * pred_w
    out[:, 1::4] = pred_y - 0.5 * pred_h
    out[:, 2::4] = pred_x + 0.5 * pred_w - minus_one
    out[:, 3::4] = pred_y + 0.5 * pred_h - minus_one
    return out


def _rotated_transform(boxes: np.ndarray, deltas: np.ndarray, weights: list[float],
                       bound: tuple[int, int] | None) -> np.ndarray:
    """Apply (dx, dy, dw, dh, da) deltas (R × 5K, da in radians) to rotated boxes
    (R × 5: ctr_x, ctr_y, w, h, angle°); angles outside ``bound`` move by one period."""
    f32 = np.float32
    ctr_x, ctr_y = boxes[:, 0:1], boxes[:, 1:2]
    widths, heights, angles = boxes[:, 2:3], boxes[:, 3:4], boxes[:, 4:5]
    clip = f32(math.log(1000.0 / 16.0))
    out = np.empty_like(deltas)
    out[:, 0::5] = deltas[:, 0::5] / f32(weights[0]) * widths + ctr_x
    out[:, 1::5] = deltas[:, 1::5] / f32(weights[1]) * heights + ctr_y
    out[:, 2::5] = np.exp(np.minimum(deltas[:, 2::5] / f32(weights[2]), clip)) * widths
    out[:, 3::5] = np.exp(np.minimum(deltas[:, 3::5] / f32(weights[3]), clip)) * heights
    angle = deltas[:, 4::5] * f32(180.0) / f32(math.pi) + angles
    if bound is not None:
        low, high = bound
        period = f32(high - low)
        angle = np.where(angle < low, angle + period,
                         np.where(angle > high, angle - period, angle))
    out[:, 4::5] = angle
    return out


def _clip_rotated(boxes: np.ndarray, img_h: np.ndarray, img_w: np.ndarray,
                  angle_thresh: float, minus_one: float) -> np.ndarray:
    """Clip the nearly upright boxes (|angle| <= angle_thresh) of R × 5K rotated boxes to
    the image, through their corner form; the others are left unchanged."""
    out = boxes.copy()
    f32 = np.float32
    off, half = f32(minus_one), f32(0.5)
    for k in range(boxes.shape[1] // 5):
        cols = boxes[:, 5 * k:5 * k + 5]
        upright = np.abs(cols[:, 4]) <= angle_thresh
        w_lim, h_lim = img_w - off, img_h - off
        x1 = np.clip(cols[:, 0] - (cols[:, 2] - off) * half, 0, w_lim)
        y1 = np.clip(cols[:, 1] - (cols[:, 3] - off) * half, 0, h_lim)
        x2 = np.clip(cols[:, 0] + (cols[:, 2] - off) * half, 0, w_lim)
        y2 = np.clip(cols[:, 1] + (cols[:, 3] - off) * half, 0, h_lim)
        clipped = np.stack([(x1 + x2) * half, (y1 + y2) * half, x2 - x1 + off,
                            y2 - y1 + off], axis=1).astype(np.float32)
        out[upright, 5 * k:5 * k + 4] = clipped[upright]
    return out


def _bbox_args(ctx: OpContext, rotated: bool) -> tuple[list[float], float,
                                                      tuple[int, int] | None]:
    """(weights, minus_one, angle bound or None) from BBoxTransform's arguments."""
    weights = ctx.floats_arg("weights", [1.0, 1.0, 1.0, 1.0])
    if len(weights) != 4:
        raise ctx.fail(f"weights must have 4 values, got {weights}")
    if ctx.has_arg("legacy_plus_one"):
        minus_one = float(ctx.int_arg("legacy_plus_one", 1))
    else:
        minus_one = float(ctx.int_arg("correct_transform_coords", 0))
    bound = None
    if rotated and ctx.int_arg("angle_bound_on", 1):
        bound = (ctx.int_arg("angle_bound_lo", -90), ctx.int_arg("angle_bound_hi", 90))
        period = bound[1] - bound[0]
        if period <= 0 or period % 180:
            raise ctx.fail(f"angle_bound_hi - angle_bound_lo must be a positive multiple of "
                           f"180, got {period}")
    return weights, minus_one, bound


@register_op("BBoxTransform", inputs=3, outputs=(1, 2))
def bbox_transform(ctx: OpContext) -> Outputs:
    """[rois (R×4 or R×5 with batch index; rotated: R×5 or R×6), deltas (R×4K; rotated
    R×5K), im_info (B×3: h, w, scale)] -> [boxes clipped to the image(, roi_batch_splits
    (B))].  Boxes are divided by the image scale first and multiplied back only with
    ``apply_scale``; rotated boxes (ctr_x, ctr_y, w, h, angle°) take ``angle_bound_on``,
    ``angle_bound_lo``/``hi`` and ``clip_angle_thresh``."""
    rotated = bool(ctx.int_arg("rotated", 0))
    dim = 5 if rotated else 4
    rois, deltas, im_info = (host(v).astype(np.float32) for v in ctx.inputs)
    if (rois.ndim != 2 or rois.shape[1] not in (dim, dim + 1) or deltas.ndim != 2
            or deltas.shape[0] != rois.shape[0] or deltas.shape[1] % dim):
        raise ctx.fail(f"rois {rois.shape} must be R×{dim} or R×{dim + 1} matching deltas "
                       f"{deltas.shape} (R×{dim}K)")
    if im_info.ndim != 2 or im_info.shape[1] != 3:
        raise ctx.fail(f"im_info must be B×3 (height, width, scale), got {im_info.shape}")
    weights, minus_one, bound = _bbox_args(ctx, rotated)
    batch = (rois[:, 0].astype(np.int64) if rois.shape[1] == dim + 1
             else np.zeros(rois.shape[0], np.int64))
    if batch.size and (batch.min() < 0 or batch.max() >= im_info.shape[0]):
        raise ctx.fail(f"RoI batch indices must lie in [0, {im_info.shape[0]})")
    boxes = rois[:, -dim:].copy()
    scale = im_info[batch, 2]
    after = scale if ctx.int_arg("apply_scale", 1) else np.ones_like(scale)
    boxes[:, :4] /= scale[:, None]
    img_h = np.floor(im_info[batch, 0] / scale + 0.5)
    img_w = np.floor(im_info[batch, 1] / scale + 0.5)
    if rotated:
        out = _rotated_transform(boxes, deltas, weights, bound)
        out = _clip_rotated(out, img_h, img_w,
                            ctx.float_arg("clip_angle_thresh", 1.0), minus_one)
        for axis in range(4):
            out[:, axis::5] *= after[:, None]
    else:
        out = _upright_transform(boxes, deltas, weights, minus_one)
        for axis, limit in ((0, img_w), (1, img_h), (2, img_w), (3, img_h)):
            out[:, axis::4] = np.clip(out[:, axis::4], 0, (limit - minus_one)[:, None])
        out = out * after[:, None]
    splits = np.bincount(batch, minlength=im_info.shape[0]).astype(np.float32)
    return [out.astype(np.float32), splits][:ctx.num_outputs]


# --- BoxWithNMSLimit -------------------------------------------------------------------------
class _NMSLayout:
    """Where class ``j`` (0 = background) reads its scores and boxes, and the class id it
    outputs (Caffe2's cls_agnostic_bbox_reg, input_boxes_include_bg_cls and
    output_classes_include_bg_cls)."""

    def __init__(self, ctx: OpContext, num_classes: int, box_cols: int) -> None:
        self.with_bg = bool(ctx.int_arg("input_boxes_include_bg_cls", 1))
        self.agnostic = bool(ctx.int_arg("cls_agnostic_bbox_reg", 0))
        self.out_bg = bool(ctx.int_arg("output_classes_include_bg_cls", 1))
        self.box_dim = 5 if ctx.int_arg("rotated", 0) else 4
        expected = self.box_dim * (self.box_block(num_classes - 1) + 1)
        if box_cols == self.box_dim and expected != self.box_dim:
            self.agnostic = True  # dpgraph also accepts R×4 boxes without the flag
        elif box_cols != expected:
            raise ctx.fail(f"boxes have {box_cols} columns, expected {expected} for "
                           f"{num_classes} score columns")

    def box_block(self, j: int) -> int:
        return 0 if self.agnostic else (j if self.with_bg else j - 1)

    def box_cols(self, j: int) -> slice:
        start = self.box_dim * self.box_block(j)
        return slice(start, start + self.box_dim)

    def score_col(self, j: int) -> int:
        return j - 1 + int(self.with_bg)

    def out_class(self, j: int) -> int:
        return j - int(not self.out_bg)


class _NMSParams:
    """BoxWithNMSLimit's arguments for one run."""

    def __init__(self, ctx: OpContext) -> None:
        self.score_thresh = ctx.float_arg("score_thresh", 0.05)
        self.nms = ctx.float_arg("nms", 0.3)
        self.limit = ctx.int_arg("detections_per_im", 100)
        self.plus_one = float(ctx.int_arg("legacy_plus_one", 1))
        self.soft = bool(ctx.int_arg("soft_nms_enabled", 0))
        method = ctx.str_arg("soft_nms_method", "linear")
        if method not in SOFT_NMS_METHODS:
            raise ArgumentError(ctx.describe(f"soft_nms_method must be 'linear' or "
                                             f"'gaussian', got {method!r}."))
        self.soft_method = SOFT_NMS_METHODS[method]
        self.soft_sigma = ctx.float_arg("soft_nms_sigma", 0.5)
        self.soft_min_score = ctx.float_arg("soft_nms_min_score_thres", 0.001)


def _nms_class(params: _NMSParams, boxes: np.ndarray, scores: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """One class of one image: the kept rows and the (Soft-NMS rescored) scores."""
    rows = np.flatnonzero(scores > params.score_thresh)
    if params.soft:
        keep, rescored = soft_nms(boxes, scores, rows, params.soft_sigma, params.nms,
                                  params.soft_min_score, params.soft_method,
                                  params.plus_one)
        return np.array(keep, np.int64), rescored
    order = rows[np.argsort(-scores[rows], kind="stable")]
    return hard_nms(boxes, order, params.nms, params.limit, params.plus_one), scores


def _nms_image(params: _NMSParams, layout: _NMSLayout, scores: np.ndarray,
               boxes: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Per class (skipping background 0): kept row indices after threshold, NMS and limit,
    and the scores they are ranked and reported by (rescored by Soft-NMS)."""
    num_classes = scores.shape[1]
    out_scores = scores.copy()
    keeps = [np.zeros(0, np.int64)]
    for j in range(1, num_classes):
        col = layout.score_col(j)
        kept, out_scores[:, col] = _nms_class(params, boxes[:, layout.box_cols(j)],
                                              scores[:, col])
        keeps.append(kept)
    total = sum(k.size for k in keeps)
    if 0 < params.limit < total:
        cls = np.concatenate([np.full(k.size, j) for j, k in enumerate(keeps)])
        rows = np.concatenate(keeps)
        cols = np.array([layout.score_col(j) for j in cls], np.int64)
        best = np.argsort(-out_scores[rows, cols], kind="stable")[:params.limit]
        keeps = [rows[best[cls[best] == j]] for j in range(num_classes)]
    return keeps, out_scores


def _as_2d(ctx: OpContext, value: Any, what: str) -> np.ndarray:
    x = host(value)
    if x.ndim == 4 and x.shape[2:] == (1, 1):
        x = x.reshape(x.shape[:2])
    if x.ndim != 2:
        raise ctx.fail(f"{what} must be 2-D (or N×C×1×1), got shape {x.shape}")
    return x.astype(np.float32)


@register_op("BoxWithNMSLimit", inputs=(2, 3), outputs=(3, 6))
def box_with_nms_limit(ctx: OpContext) -> Outputs:
    """[scores (R×C), boxes (R×4C; R×4 with cls_agnostic_bbox_reg; R×4(C-1) without
    input_boxes_include_bg_cls; 5 values per box with ``rotated``), batch_splits?] ->
    [scores, boxes (n×4 or n×5), classes (, batch_splits, keeps, keeps_size)]: per-class NMS
    (legacy_plus_one; Soft-NMS with ``soft_nms_enabled``, whose rescored scores rank and
    are reported) with a per-image detection limit; keeps are row indices within each
    image."""
    params = _NMSParams(ctx)
    scores = _as_2d(ctx, ctx.inputs[0], "scores")
    boxes = _as_2d(ctx, ctx.inputs[1], "boxes")
    if boxes.shape[0] != scores.shape[0]:
        raise ctx.fail(f"boxes {boxes.shape} and scores {scores.shape} differ in rows")
    layout = _NMSLayout(ctx, scores.shape[1], boxes.shape[1])
    splits = (host(ctx.inputs[2]).reshape(-1).astype(np.int64) if ctx.num_inputs > 2
              else np.array([scores.shape[0]]))
    if int(splits.sum()) != scores.shape[0]:
        raise ctx.fail(f"batch_splits sum to {int(splits.sum())}, expected {scores.shape[0]}")
    out_scores: list[np.ndarray] = [np.zeros(0, np.float32)]
    out_boxes: list[np.ndarray] = [np.zeros((0, layout.box_dim), np.float32)]
    out_classes: list[np.ndarray] = [np.zeros(0, np.float32)]
    out_keeps: list[np.ndarray] = [np.zeros(0, np.int64)]
    counts, sizes = [], []
    start = 0
    for size in splits:
        sl = slice(start, start + int(size))
        keeps, image_scores = _nms_image(params, layout, scores[sl], boxes[sl])
        for j, rows in enumerate(keeps[1:], start=1):  # class 0 (background) keeps none
            out_scores.append(image_scores[rows, layout.score_col(j)])
            out_boxes.append(boxes[sl][rows, layout.box_cols(j)])
            out_classes.append(np.full(rows.size, layout.out_class(j), np.float32))
            out_keeps.append(rows)
        counts.append(sum(k.size for k in keeps))
        sizes.append([k.size for k in keeps])
        start += int(size)
    outs = [np.concatenate(out_scores).astype(np.float32),
            np.concatenate(out_boxes).reshape(-1, layout.box_dim).astype(np.float32),
            np.concatenate(out_classes), np.array(counts, np.float32),
            np.concatenate(out_keeps).astype(np.int32),
            np.array(sizes, np.int32).reshape(len(splits), scores.shape[1])]
    return outs[:ctx.num_outputs]


# --- BatchBoxCox / BatchBucketize / SinusoidPositionEncoding ---------------------------------
@register_op("BatchBoxCox", inputs=3, outputs=1, shape=same_as_input(0))
def batch_box_cox(ctx: OpContext) -> Outputs:
    """[data (N×D), lambda1 (D), lambda2 (D)] -> Box-Cox per column:
    ((x + l2)^l1 - 1) / l1, or log(x + l2) where l1 == 0 (x + l2 floored at 1e-6)."""
    data, lambda1, lambda2 = ctx.inputs
    xp = ctx.xp
    if data.ndim != 2 or lambda1.shape != (data.shape[1],) or lambda2.shape != lambda1.shape:
        raise ctx.fail(f"data {tuple(data.shape)} must be N×D with D-sized lambdas")
    shifted = xp.maximum(data + lambda2, data.dtype.type(1e-6))
    zero = lambda1 == 0
    safe = xp.where(zero, data.dtype.type(1), lambda1)
    power = (xp.power(shifted, safe) - 1) / safe
    return (xp.where(zero, xp.log(shifted), power).astype(data.dtype),)


@register_op("BatchBucketize", inputs=4, outputs=1)
def batch_bucketize(ctx: OpContext) -> Outputs:
    """[feature (N×D), indices (K), boundaries, lengths (K)] -> (N×K) int32 buckets:
    the number of column ``indices[k]``'s boundaries below each value."""
    feature = host(ctx.inputs[0])
    indices = host(ctx.inputs[1]).reshape(-1).astype(np.int64)
    boundaries = host(ctx.inputs[2]).reshape(-1)
    lengths = host(ctx.inputs[3]).reshape(-1).astype(np.int64)
    if lengths.size != indices.size or int(lengths.sum()) != boundaries.size:
        raise ctx.fail("lengths must give one boundary count per index, summing to the "
                       "number of boundaries")
    if indices.size and (indices.min() < 0 or indices.max() >= feature.shape[1]):
        raise ctx.fail(f"indices must lie in [0, {feature.shape[1]})")
    values = feature[:, indices]
    ends = np.cumsum(lengths).astype(np.int64)
    segment = np.repeat(np.arange(indices.size), lengths)
    below = (boundaries[None, :] < values[:, segment]).astype(np.int32)
    running = np.concatenate([np.zeros((below.shape[0], 1), np.int32),
                              np.cumsum(below, axis=1, dtype=np.int32)], axis=1)
    out = running[:, ends] - running[:, ends - lengths]
    return (out,)


def _sinusoid_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None:
        return [None]
    size = int(arguments_dict(op.arg).get("embedding_size", 100))
    return [((*shapes[0], size), FLOAT)]


@register_op("SinusoidPositionEncoding", inputs=1, outputs=1, shape=_sinusoid_shape)
def sinusoid_position_encoding(ctx: OpContext) -> Outputs:
    """positions (M×K) -> (M×K×E): amplitude·sin(pos / alpha^(k/E)), odd k phase-shifted
    to cosines.  As in Caffe2, row i uses positions[i, 0] for every column."""
    positions = host(ctx.inputs[0])
    if positions.ndim != 2:
        raise ctx.fail(f"positions must be 2-D, got shape {positions.shape}")
    size = ctx.int_arg("embedding_size", 100)
    alpha = ctx.float_arg("alpha", 10000.0)
    amplitude = np.float32(ctx.float_arg("amplitude", 1.0))
    k = np.arange(size, dtype=np.float32)
    scale = np.exp(-np.float32(math.log(alpha)) * k / np.float32(size)).astype(np.float32)
    pos = positions[:, 0].astype(np.float32)[:, None]
    angles = pos * scale[None, :] + np.where(k % 2 == 1, np.float32(math.pi / 2), 0)
    row = (amplitude * np.sin(angles.astype(np.float32))).astype(np.float32)
    return (np.ascontiguousarray(np.broadcast_to(row[:, None, :], (*positions.shape, size))),)



# --- LC (locally connected) ------------------------------------------------------------------
def _lc_setup(ctx: OpContext, x: Any, w: Any) -> tuple[Any, Any, Any, tuple[int, ...], str]:
    """(geometry, padded channel-first X, filter as (P, M, C·K), output size, order)."""
    order = check_order(ctx)
    xc = channel_first(x, order)
    spatial = tuple(xc.shape[2:])
    nd = len(spatial)
    if w.ndim != 2 * nd + 2:
        raise ctx.fail(f"filter {tuple(w.shape)} must have {2 * nd + 2} dims: output size, "
                       "M, C and kernel")
    kernel = tuple(w.shape[nd + 1:2 * nd + 1] if order == "NHWC" else w.shape[nd + 2:])
    geom = parse_geometry(ctx, spatial, kernel)
    if geom.group != 1:
        raise NotSupportedError(ctx.describe("grouped locally connected layers"))
    out = geom.out_shape(spatial)
    filt = w if order == "NCHW" else ctx.xp.moveaxis(w, -1, nd + 1)
    if tuple(filt.shape) != (*out, filt.shape[nd], xc.shape[1], *geom.kernel):
        raise ctx.fail(f"filter {tuple(w.shape)} does not match output {out}, "
                       f"{xc.shape[1]} channels and kernel {geom.kernel}")
    flat = filt.reshape(math.prod(out), filt.shape[nd], -1)
    return geom, pad_spatial(ctx.xp, xc, geom), flat, out, order


def _lc_columns(ctx: OpContext, padded: Any, geom: Any, out: tuple[int, ...]) -> Any:
    n, c = padded.shape[:2]
    cols = window_view(ctx.xp, padded, geom, out)
    return ctx.xp.ascontiguousarray(cols).reshape(n, c * math.prod(geom.kernel),
                                                  math.prod(out))


def _lc_forward(ctx: OpContext) -> Outputs:
    """[X, filter (*out, M, C, *kernel), bias (*out, M)?] -> Y: a convolution whose filter
    differs at every output position."""
    x, w = ctx.inputs[0], ctx.inputs[1]
    geom, padded, flat, out, order = _lc_setup(ctx, x, w)
    cols = _lc_columns(ctx, padded, geom, out)
    y = ctx.xp.einsum("nqp,pmq->nmp", cols, flat)
    if ctx.num_inputs > 2:
        y = y + ctx.inputs[2].reshape(flat.shape[0], flat.shape[1]).T[None]
    y = y.reshape(x.shape[0], flat.shape[1], *out).astype(x.dtype)
    return (channel_last(y, order, ctx.xp),)


def _lc_backward(ctx: OpContext) -> Outputs:
    """[X, filter, dY] -> [dfilter(, dbias), dX]."""
    x, w, dy = ctx.inputs
    xp = ctx.xp
    geom, padded, flat, out, order = _lc_setup(ctx, x, w)
    cols = _lc_columns(ctx, padded, geom, out)
    dyf = channel_first(dy, order).reshape(x.shape[0], flat.shape[1], -1)
    dflat = xp.einsum("nmp,nqp->pmq", dyf, cols)
    nd = len(out)
    dfilt = dflat.reshape(*out, flat.shape[1], padded.shape[1], *geom.kernel)
    dw = dfilt if order == "NCHW" else xp.moveaxis(dfilt, nd + 1, -1)
    dcols = xp.einsum("pmq,nmp->nqp", flat, dyf)
    dcols = dcols.reshape(x.shape[0], padded.shape[1], *geom.kernel, *out)
    dpadded = col2im(xp, dcols, geom, out, tuple(padded.shape[2:]))
    spatial = tuple(channel_first(x, order).shape[2:])
    dx = channel_last(dpadded[inner_slices(geom, spatial)], order, xp)
    outs = [xp.ascontiguousarray(dw).astype(w.dtype)]
    if not ctx.int_arg("no_bias", 0):
        outs.append(dyf.sum(axis=0).T.reshape(*out, flat.shape[1]).astype(w.dtype))
    outs.append(xp.ascontiguousarray(dx).astype(x.dtype))
    if ctx.num_outputs != len(outs):
        raise ctx.fail(f"expects {len(outs)} outputs (dfilter, dbias unless no_bias, dX), "
                       f"got {ctx.num_outputs}")
    return outs


def _lc_grad_maker(grad_type: str) -> Any:
    def maker(g: GradientBuilder) -> None:
        if len(g.op.input) == 3:
            g.add(grad_type, [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(2), g.GI(0)])
        else:
            g.add(grad_type, [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(0)], no_bias=1)

    return maker


for _lc_type in ("LC", "LC1D", "LC2D", "LC3D"):
    register_op(_lc_type, inputs=(2, 3), outputs=1)(_lc_forward)
    register_op(_lc_type + "Gradient", inputs=3, outputs=(2, 3))(_lc_backward)
    register_gradient(_lc_type)(_lc_grad_maker(_lc_type + "Gradient"))
