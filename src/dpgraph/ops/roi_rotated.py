"""``RoIAlignRotated`` and ``RoIAlignRotatedGradient`` (Caffe2's roi_align_rotated_op):
RoIAlign over rotated boxes ``[batch?, center_x, center_y, w, h, angle°]`` (R x 5 or R x 6),
the angle counter-clockwise in degrees.

Each bin averages ``grid_h × grid_w`` bilinear samples (``sampling_ratio``, or
``ceil(roi_size / pooled)`` when it is <= 0) taken on the box's own axes and rotated into
the feature map; samples more than one pixel outside the map count as zero.  Arguments as
RoIAlign: ``spatial_scale`` (1.0), ``pooled_h``/``pooled_w`` (1), ``sampling_ratio`` (-1),
``aligned`` (0: boxes smaller than 1 are grown to 1), ``order`` (NCHW).  Float32 math, as
Caffe2's kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import like_inputs
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.detection import roi_align_shape
from dpgraph.ops.gradient_builder import GradientBuilder

_F = np.float32


class _Params:
    """The op's arguments, read and checked once."""

    def __init__(self, ctx: OpContext) -> None:
        self.spatial_scale = _F(ctx.float_arg("spatial_scale", 1.0))
        self.pooled = (ctx.int_arg("pooled_h", 1), ctx.int_arg("pooled_w", 1))
        self.sampling_ratio = ctx.int_arg("sampling_ratio", -1)
        self.aligned = bool(ctx.int_arg("aligned", 0))
        self.order = ctx.str_arg("order", "NCHW")
        if self.order not in ("NCHW", "NHWC"):
            raise ctx.fail(f"order must be 'NCHW' or 'NHWC', got {self.order!r}")
        if min(self.pooled) <= 0:
            raise ctx.fail(f"pooled_h and pooled_w must be > 0, got {self.pooled}")


def _check_rois(ctx: OpContext, rois: Any, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(batch index per RoI, [R, 5] center_x, center_y, w, h, angle)."""
    if rois.ndim != 2 or rois.shape[1] not in (5, 6):
        raise ctx.fail(f"RoIs must be R x 5 or R x 6 ([batch,] cx, cy, w, h, angle), got "
                       f"shape {tuple(rois.shape)}")
    rois = np.asarray(rois, dtype=_F)
    if rois.shape[1] == 5:
        return np.zeros(rois.shape[0], np.int64), rois
    index = rois[:, 0].astype(np.int64)
    if index.size and (index.min() < 0 or index.max() >= batch):
        raise ctx.fail(f"RoI batch indices must lie in [0, {batch}), got "
                       f"[{index.min()}, {index.max()}]")
    return index, rois[:, 1:]


def _grid(length: np.float32, pooled: int, sampling_ratio: int) -> int:
    return sampling_ratio if sampling_ratio > 0 else int(np.ceil(length / _F(pooled)))


def _sample_axis(start: np.float32, bin_size: np.float32, pooled: int, grid: int) -> np.ndarray:
    """[pooled, grid] sample offsets along one box axis."""
    steps = (np.arange(grid, dtype=_F) + _F(0.5)) * bin_size / _F(max(grid, 1))
    return start + np.arange(pooled, dtype=_F)[:, None] * bin_size + steps[None, :]


def _interpolation(ctx: OpContext, p: _Params, roi: np.ndarray, height: int,
                   width: int) -> np.ndarray:
    """[pooled_h·pooled_w, H·W] matrix: each bin's averaged bilinear weights over X."""
    offset = _F(0.5) if p.aligned else _F(0.0)
    cx, cy = roi[0] * p.spatial_scale - offset, roi[1] * p.spatial_scale - offset
    roi_w, roi_h = roi[2] * p.spatial_scale, roi[3] * p.spatial_scale
    if p.aligned and (roi_w < 0 or roi_h < 0):
        raise ctx.fail("RoIs in RoIAlignRotated cannot have negative size when aligned=1")
    if not p.aligned:
        roi_w, roi_h = max(roi_w, _F(1.0)), max(roi_h, _F(1.0))
    ph, pw = p.pooled
    gh, gw = _grid(roi_h, ph, p.sampling_ratio), _grid(roi_w, pw, p.sampling_ratio)
    theta = _F(float(roi[4]) * np.pi / 180.0)
    cos, sin = np.cos(theta), np.sin(theta)
    yy = _sample_axis(-roi_h / _F(2.0), roi_h / _F(ph), ph, gh)[:, None, :, None]
    xx = _sample_axis(-roi_w / _F(2.0), roi_w / _F(pw), pw, gw)[None, :, None, :]
    x = np.broadcast_to(xx * cos + yy * sin + cx, (ph, pw, gh, gw)).reshape(ph * pw, -1)
    y = np.broadcast_to(yy * cos - xx * sin + cy, (ph, pw, gh, gw)).reshape(ph * pw, -1)
    valid = (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    y, x = np.maximum(y, 0), np.maximum(x, 0)
    y_low, x_low = y.astype(np.int64), x.astype(np.int64)
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = np.where(y_edge, height - 1, y_low), np.where(x_edge, width - 1, x_low)
    y_high, x_high = np.where(y_edge, y_low, y_low + 1), np.where(x_edge, x_low, x_low + 1)
    ly = np.where(y_edge, _F(0), y - y_low).astype(_F)
    lx = np.where(x_edge, _F(0), x - x_low).astype(_F)
    hy, hx = _F(1) - ly, _F(1) - lx
    rows = np.broadcast_to(np.arange(ph * pw)[:, None], x.shape)
    matrix = np.zeros((ph * pw, height * width), dtype=_F)
    for yi, xi, weight in ((y_low, x_low, hy * hx), (y_low, x_high, hy * lx),
                           (y_high, x_low, ly * hx), (y_high, x_high, ly * lx)):
        np.add.at(matrix, (rows[valid], (yi * width + xi)[valid]), weight[valid])
    with np.errstate(divide="ignore", invalid="ignore"):
        return matrix / _F(gh * gw)


def _as_nchw(x: Any, order: str) -> np.ndarray:
    return np.asarray(x) if order == "NCHW" else np.asarray(x).transpose(0, 3, 1, 2)


def _from_nchw(y: np.ndarray, order: str) -> np.ndarray:
    return y if order == "NCHW" else np.ascontiguousarray(y.transpose(0, 2, 3, 1))


@register_op("RoIAlignRotated", inputs=2, outputs=1, shape=roi_align_shape)
def roi_align_rotated(ctx: OpContext) -> Outputs:
    """[X (N, C, H, W), RoIs] -> Y (R, C, pooled_h, pooled_w) (NHWC: R, ph, pw, C)."""
    p = _Params(ctx)
    x = _as_nchw(ctx.inputs[0], p.order)
    if x.ndim != 4:
        raise ctx.fail(f"X must be 4-D, got shape {tuple(x.shape)}")
    rois = ctx.inputs[1]
    n, c, h, w = x.shape
    count = rois.shape[0] if rois.ndim and rois.size else 0
    y = np.zeros((count, c, *p.pooled), dtype=_F)
    if count:
        index, boxes = _check_rois(ctx, rois, n)
        for r in range(count):
            weights = _interpolation(ctx, p, boxes[r], h, w)
            y[r] = (x[index[r]].reshape(c, h * w).astype(_F) @ weights.T).reshape(c, *p.pooled)
    return (_from_nchw(y, p.order),)


@register_op("RoIAlignRotatedGradient", inputs=3, outputs=1, shape=like_inputs(0))
def roi_align_rotated_gradient(ctx: OpContext) -> Outputs:
    """[X, RoIs, dY] -> dX: every dY bin spread back over its bilinear samples."""
    p = _Params(ctx)
    x = _as_nchw(ctx.inputs[0], p.order)
    rois = ctx.inputs[1]
    n, c, h, w = x.shape
    dx = np.zeros((n, c, h, w), dtype=_F)
    count = rois.shape[0] if rois.ndim and rois.size else 0
    if count:
        index, boxes = _check_rois(ctx, rois, n)
        dy = _as_nchw(ctx.inputs[2], p.order)
        if tuple(dy.shape) != (count, c, *p.pooled):
            raise ctx.fail(f"dY has shape {tuple(dy.shape)}, expected "
                           f"{(count, c, *p.pooled)} (R, C, pooled_h, pooled_w)")
        for r in range(count):
            weights = _interpolation(ctx, p, boxes[r], h, w)
            dx[index[r]] += (dy[r].reshape(c, -1).astype(_F) @ weights).reshape(c, h, w)
    return (_from_nchw(dx, p.order),)


@register_gradient("RoIAlignRotated")
def _roi_align_rotated_grad(g: GradientBuilder) -> None:
    g.add("RoIAlignRotatedGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])
