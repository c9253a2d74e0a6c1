"""Detectron's own operators (Caffe2's ``modules/detectron`` and Detectron's custom-ops example):
UpsampleNearest, SelectSmoothL1Loss, RoIPoolF, PSRoIPool, GroupSpatialSoftmax, SampleAs and
ZeroEven, each with its gradient op.

Caffe2 runs most of these on CUDA only; here every kernel runs on CPU and on (virtual or real)
GPU device options through the device's array module.  Index bookkeeping (RoI windows) is
computed on the host; the data stays on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import GradientError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, INT32, host, like_inputs, scalar_value
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

_FLT_MAX = float(np.finfo(np.float32).max)


def _scalar_shape(op: Any, shapes: list, types: list) -> list:
    return [((), FLOAT)]


def _require_4d(ctx: OpContext, index: int) -> Any:
    x = ctx.inputs[index]
    if x.ndim != 4:
        raise ctx.fail(f"input {ctx.input_name(index)!r} must be 4-D (N, C, H, W), got shape "
                       f"{tuple(x.shape)}")
    return x


# --- UpsampleNearest -------------------------------------------------------------------------
def _upsample_scale(ctx: OpContext) -> int:
    scale = ctx.int_arg("scale", 2)
    if scale < 1:
        raise ctx.fail(f"argument 'scale' must be an integer >= 1, got {scale}")
    return scale


def _check_upsample_input(ctx: OpContext, x: Any) -> None:
    if x.ndim not in (3, 4):
        raise ctx.fail(f"X must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape "
                       f"{tuple(x.shape)}")


def _upsample_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None or len(shapes[0]) not in (3, 4):
        return [None]
    scale = int(arguments_dict(op.arg).get("scale", 2))
    dims = (*shapes[0][:-2], shapes[0][-2] * scale, shapes[0][-1] * scale)
    return [(dims, types[0] or FLOAT)]


@register_op("UpsampleNearest", inputs=1, outputs=1, shape=_upsample_shape)
def upsample_nearest(ctx: OpContext) -> Outputs:
    """X (N, C, H, W) or (C, H, W) -> Y with H and W repeated ``scale`` (int, default 2)
    times: Y[..., h, w] = X[..., h // scale, w // scale]."""
    x = ctx.inputs[0]
    _check_upsample_input(ctx, x)
    scale = _upsample_scale(ctx)
    return (ctx.xp.repeat(ctx.xp.repeat(x, scale, axis=-2), scale, axis=-1),)


@register_gradient("UpsampleNearest")
def _upsample_nearest_grad(g: GradientBuilder) -> None:
    g.add("UpsampleNearestGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("UpsampleNearestGradient", inputs=2, outputs=1, shape=like_inputs(0))
def upsample_nearest_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX: each dX element is the sum of its scale x scale block of dY."""
    x, dy = ctx.inputs
    _check_upsample_input(ctx, x)
    scale = _upsample_scale(ctx)
    h, w = x.shape[-2], x.shape[-1]
    expected = (*x.shape[:-2], h * scale, w * scale)
    if tuple(dy.shape) != expected:
        raise ctx.fail(f"dY has shape {tuple(dy.shape)}, expected {expected} (X's shape with "
                       f"H and W times scale={scale})")
    blocks = dy.reshape(*x.shape[:-2], h, scale, w, scale)
    return (blocks.sum(axis=(-3, -1)).astype(dy.dtype, copy=False),)


# --- SelectSmoothL1Loss ----------------------------------------------------------------------
def _select_parts(ctx: OpContext) -> tuple[Any, Any, Any, float]:
    """(flat indices into Y_hat (M*4), selected Y_hat values, targets (M*4), 1/max(1, S))."""
    xp = ctx.xp
    y_hat = _require_4d(ctx, 0)
    y, locations = ctx.inputs[1], ctx.inputs[2]
    m = int(y.shape[0]) if y.ndim else 0
    if y.size != 4 * m or locations.size != 4 * m:
        raise ctx.fail(f"Y and locations must both be (M, 4), got {tuple(y.shape)} and "
                       f"{tuple(locations.shape)}")
    n, d, h, w = (int(s) for s in y_hat.shape)
    loc = host(locations).reshape(m, 4).astype(np.int64)  # Caffe2 truncates float locations
    n_i, c_i, y_i, x_i = loc.T
    channels = c_i[:, None] + np.arange(4)[None, :]
    bad = ((n_i < 0) | (n_i >= n) | (c_i < 0) | (c_i + 3 >= d) | (y_i < 0) | (y_i >= h)
           | (x_i < 0) | (x_i >= w))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ctx.fail(f"location {loc[row].tolist()} (row {row} of {ctx.input_name(2)!r}) "
                       f"lies outside Y_hat {(n, d, h, w)}; each (n, c, y, x) must select 4 "
                       f"channels c..c+3 inside it")
    flat = ((n_i[:, None] * d + channels) * h + y_i[:, None]) * w + x_i[:, None]
    flat_dev = xp.asarray(flat.reshape(-1))
    picked = y_hat.reshape(-1)[flat_dev]
    inv_norm = 1.0 / max(scalar_value(ctx.inputs[3]), 1.0)
    return flat_dev, picked, xp.asarray(y).reshape(-1).astype(y_hat.dtype), inv_norm


@register_op("SelectSmoothL1Loss", inputs=4, outputs=1, shape=_scalar_shape)
def select_smooth_l1_loss(ctx: OpContext) -> Outputs:
    """[Y_hat (N, D, H, W), Y (M, 4), locations (M, 4): (n, c, y, x), normalizer] -> loss =
    scale / max(1, normalizer) * sum of SmoothL1(Y_hat[n, c + j, y, x] - Y[i, j]) over the
    4 channels j of each location (a location selected twice counts once, as in Caffe2's
    buffer).  Args beta (1.0), scale (1.0)."""
    xp = ctx.xp
    y_hat = ctx.inputs[0]
    if ctx.inputs[1].size == 0:
        return (xp.asarray(0.0, dtype=y_hat.dtype),)
    flat, picked, target, inv_norm = _select_parts(ctx)
    beta = ctx.float_arg("beta", 1.0)
    diff = picked - target
    ad = xp.abs(diff)
    per = xp.where(ad < beta, 0.5 * diff * diff / beta, ad - 0.5 * beta) * inv_norm
    buffer = xp.zeros(y_hat.size, dtype=y_hat.dtype)
    buffer[flat] = per
    loss = buffer.sum() * ctx.float_arg("scale", 1.0)
    return (xp.asarray(loss, dtype=y_hat.dtype),)


@register_gradient("SelectSmoothL1Loss")
def _select_smooth_l1_loss_grad(g: GradientBuilder) -> None:
    g.add("SelectSmoothL1LossGradient", [g.I(0), g.I(1), g.I(2), g.I(3), g.GO(0)], [g.GI(0)])


@register_op("SelectSmoothL1LossGradient", inputs=5, outputs=1, shape=like_inputs(0))
def select_smooth_l1_loss_gradient(ctx: OpContext) -> Outputs:
    """[Y_hat, Y, locations, normalizer, d_loss] -> d_Y_hat, non-zero only at the selected
    entries."""
    xp = ctx.xp
    y_hat = ctx.inputs[0]
    d_y_hat = xp.zeros(y_hat.size, dtype=y_hat.dtype)
    if ctx.inputs[1].size:
        flat, picked, target, inv_norm = _select_parts(ctx)
        beta = ctx.float_arg("beta", 1.0)
        diff = picked - target
        slope = xp.where(xp.abs(diff) < beta, diff / beta, xp.sign(diff))
        factor = ctx.float_arg("scale", 1.0) * scalar_value(ctx.inputs[4]) * inv_norm
        d_y_hat[flat] = slope * y_hat.dtype.type(factor)
    return (d_y_hat.reshape(y_hat.shape),)


# --- RoI windows (RoIPoolF, PSRoIPool) -------------------------------------------------------
def _roi_rows(ctx: OpContext, batch: int) -> np.ndarray:
    """The (R, 5) RoIs on the host as float64, with the batch index checked."""
    rois = host(ctx.inputs[1])
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ctx.fail(f"RoIs {ctx.input_name(1)!r} must be (R, 5): batch index, x1, y1, x2, "
                       f"y2; got shape {tuple(rois.shape)}")
    index = rois[:, 0].astype(np.int64)
    if index.size and (int(index.min()) < 0 or int(index.max()) >= batch):
        raise ctx.fail(f"RoI batch indices must lie in [0, {batch}), got "
                       f"[{int(index.min())}, {int(index.max())}]")
    return rois.astype(np.float64)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves round away from zero (numpy's round goes to even)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _pool_params(ctx: OpContext) -> tuple[float, int, int]:
    scale = ctx.float_arg("spatial_scale", 1.0)
    ph, pw = ctx.int_arg("pooled_h", 1), ctx.int_arg("pooled_w", 1)
    if scale <= 0 or ph <= 0 or pw <= 0:
        raise ctx.fail(f"spatial_scale, pooled_h and pooled_w must be > 0, got {scale}, {ph}, "
                       f"{pw}")
    return scale, ph, pw


def _roipool_windows(rois: np.ndarray, scale: float, ph: int, pw: int, height: int,
                     width: int) -> tuple[np.ndarray, ...]:
    """RoIPoolF's integer bin bounds: hstart, hend (R, ph) and wstart, wend (R, pw), clipped
    to the feature map; all arithmetic in float32 like Caffe2's kernel."""
    f32 = np.float32
    corners = _round_half_away(rois[:, 1:].astype(f32) * f32(scale)).astype(np.int64)
    start_w, start_h, end_w, end_h = corners.T
    roi_w = np.maximum(end_w - start_w + 1, 1).astype(f32)
    roi_h = np.maximum(end_h - start_h + 1, 1).astype(f32)

    def bounds(start: np.ndarray, size: np.ndarray, pooled: int, limit: int) -> tuple:
        bin_size = size / f32(pooled)
        steps = np.arange(pooled, dtype=f32)
        lo = np.floor(steps[None, :] * bin_size[:, None]).astype(np.int64) + start[:, None]
        hi = np.ceil((steps[None, :] + 1) * bin_size[:, None]).astype(np.int64) + start[:, None]
        return np.clip(lo, 0, limit), np.clip(hi, 0, limit)

    hs, he = bounds(start_h, roi_h, ph, height)
    ws, we = bounds(start_w, roi_w, pw, width)
    return hs, he, ws, we


def _masked_max(xp: Any, values: Any, mask: Any, axis: int) -> tuple[Any, Any, Any]:
    """(max, first argmax, any) of ``values`` along ``axis`` where ``mask`` is set."""
    filled = xp.where(mask, values, -xp.inf)
    index = filled.argmax(axis=axis)
    best = xp.take_along_axis(filled, xp.expand_dims(index, axis), axis=axis)
    return xp.squeeze(best, axis=axis), index, mask.any(axis=axis)


def _roipool_one(xp: Any, feat: Any, hs: np.ndarray, he: np.ndarray, ws: np.ndarray,
                 we: np.ndarray) -> tuple[Any, Any]:
    """Max and flat argmax (-1 for empty bins) of one RoI over feature map (C, H, W), taken
    separably: the max over each bin's columns, then over its rows (first maximum in
    row-major order, like Caffe2's strict '>' scan)."""
    c, height, width = feat.shape
    h0, h1 = int(hs.min()), int(he.max())
    w0, w1 = int(ws.min()), int(we.max())
    ph, pw = hs.size, ws.size
    if h1 <= h0 or w1 <= w0:
        return (xp.zeros((c, ph, pw), dtype=feat.dtype),
                xp.full((c, ph, pw), -1, dtype=np.int32))
    crop = feat[:, h0:h1, w0:w1]  # (C, h, w)
    cols = np.arange(w0, w1)
    rows = np.arange(h0, h1)
    col_mask = xp.asarray((cols[None, :] >= ws[:, None]) & (cols[None, :] < we[:, None]))
    row_mask = xp.asarray((rows[None, :] >= hs[:, None]) & (rows[None, :] < he[:, None]))
    # stage 1: over columns -> (C, h, pw)
    col_best, col_arg, _ = _masked_max(xp, crop[:, :, None, :], col_mask[None, None], axis=3)
    # stage 2: over rows -> (C, ph, pw)
    stacked = col_best.transpose(0, 2, 1)[:, None, :, :]  # (C, 1, pw, h)
    best, row_arg, _ = _masked_max(xp, stacked, row_mask[None, :, None, :], axis=3)
    empty = xp.asarray((he <= hs)[:, None] | (we <= ws)[None, :])  # (ph, pw)
    col_of = xp.take_along_axis(col_arg.transpose(0, 2, 1)[:, None, :, :],
                                row_arg[..., None], axis=3)[..., 0]  # (C, ph, pw)
    argmax = (row_arg + h0) * width + (col_of + w0)
    best = xp.where(empty[None], 0, best).astype(feat.dtype)
    argmax = xp.where(empty[None], -1, argmax).astype(np.int32)
    return best, argmax


def _roipool_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None or shapes[1] is None or len(shapes[0]) != 4:
        return [None] * len(op.output)
    args = arguments_dict(op.arg)
    dims = (shapes[1][0], shapes[0][1], int(args.get("pooled_h", 1)),
            int(args.get("pooled_w", 1)))
    return [(dims, types[0] or FLOAT), (dims, INT32)][:len(op.output)]


@register_op("RoIPoolF", inputs=2, outputs=(1, 2), shape=_roipool_shape)
def roi_pool_f(ctx: OpContext) -> Outputs:
    """[X (N, C, H, W), RoIs (R, 5)] -> [Y (R, C, pooled_h, pooled_w), argmaxes (int32, flat
    H*W index of each maximum, -1 for an empty bin)]: Fast R-CNN max pooling over RoI
    corners rounded after scaling.  Args spatial_scale (1.0), pooled_h, pooled_w (1);
    sampling_ratio is accepted and ignored, as in Caffe2."""
    xp = ctx.xp
    x = _require_4d(ctx, 0)
    scale, ph, pw = _pool_params(ctx)
    n, c, height, width = (int(s) for s in x.shape)
    rois = _roi_rows(ctx, n)
    r = rois.shape[0]
    y = xp.zeros((r, c, ph, pw), dtype=x.dtype)
    argmax = xp.full((r, c, ph, pw), -1, dtype=np.int32)
    if r:
        hs, he, ws, we = _roipool_windows(rois, scale, ph, pw, height, width)
        for i in range(r):
            y[i], argmax[i] = _roipool_one(xp, x[int(rois[i, 0])], hs[i], he[i], ws[i], we[i])
    return (y, argmax)[:ctx.num_outputs]


@register_gradient("RoIPoolF")
def _roi_pool_f_grad(g: GradientBuilder) -> None:
    if len(g.op.output) < 2:
        raise GradientError(f"RoIPoolF {list(g.op.input)} -> {list(g.op.output)} has no "
                            "argmaxes output; its gradient (RoIPoolFGradient) needs it: give "
                            "the op a second output")
    g.add("RoIPoolFGradient", [g.I(0), g.I(1), g.O(1), g.GO(0)], [g.GI(0)])


def _scatter_add(xp: Any, size: int, index: Any, values: Any, dtype: Any) -> Any:
    """A flat array of ``size`` with ``values`` summed in at ``index``."""
    if index.size == 0:
        return xp.zeros(size, dtype=dtype)
    summed = xp.bincount(index, weights=values.astype(np.float64), minlength=size)
    return summed.astype(dtype)


@register_op("RoIPoolFGradient", inputs=4, outputs=1, shape=like_inputs(0))
def roi_pool_f_gradient(ctx: OpContext) -> Outputs:
    """[X, RoIs, argmaxes, dY] -> dX: each dY element added at its argmax."""
    xp = ctx.xp
    x = _require_4d(ctx, 0)
    n, c, height, width = (int(s) for s in x.shape)
    rois = _roi_rows(ctx, n)
    argmax, dy = xp.asarray(ctx.inputs[2]), ctx.inputs[3]
    if tuple(argmax.shape) != tuple(dy.shape) or (dy.size and dy.shape[:2] !=
                                                     (rois.shape[0], c)):
        raise ctx.fail(f"argmaxes {tuple(argmax.shape)} and dY {tuple(dy.shape)} must both be "
                       f"(R={rois.shape[0]}, C={c}, pooled_h, pooled_w)")
    if dy.size == 0:
        return (xp.zeros_like(x),)
    batch = xp.asarray(rois[:, 0].astype(np.int64))
    plane = (batch[:, None] * c + xp.arange(c)[None, :]) * (height * width)  # (R, C)
    flat = plane[:, :, None, None] + argmax.astype(np.int64)
    hit = (argmax >= 0).reshape(-1)
    dx = _scatter_add(xp, x.size, flat.reshape(-1)[hit], dy.reshape(-1)[hit], x.dtype)
    return (dx.reshape(x.shape),)


# --- PSRoIPool -------------------------------------------------------------------------------
def _psroi_params(ctx: OpContext) -> tuple[float, int, int]:
    scale = ctx.float_arg("spatial_scale", 1.0)
    group, out_dim = ctx.int_arg("group_size", 1), ctx.int_arg("output_dim", 1)
    if scale <= 0 or group <= 0 or out_dim <= 0:
        raise ctx.fail(f"spatial_scale, group_size and output_dim must be > 0, got {scale}, "
                       f"{group}, {out_dim}")
    return scale, group, out_dim


def _psroi_windows(rois: np.ndarray, scale: float, group: int, height: int,
                   width: int) -> tuple[np.ndarray, ...]:
    """PSRoIPool's bin bounds: hstart, hend, wstart, wend, each (R, group), clipped."""
    f32 = np.float32
    corners = _round_half_away(rois[:, 1:].astype(f32)).astype(f32)
    start_w, start_h = corners[:, 0] * f32(scale), corners[:, 1] * f32(scale)
    end_w, end_h = (corners[:, 2] + 1) * f32(scale), (corners[:, 3] + 1) * f32(scale)

    def bounds(start: np.ndarray, end: np.ndarray, limit: int) -> tuple:
        bin_size = np.maximum(end - start, f32(0.1)) / f32(group)
        steps = np.arange(group, dtype=f32)
        lo = np.floor(steps[None, :] * bin_size[:, None] + start[:, None]).astype(np.int64)
        hi = np.ceil((steps[None, :] + 1) * bin_size[:, None] + start[:, None]).astype(np.int64)
        return np.clip(lo, 0, limit), np.clip(hi, 0, limit)

    hs, he = bounds(start_h, end_h, height)
    ws, we = bounds(start_w, end_w, width)
    return hs, he, ws, we


class _PSBins:
    """Every PSRoIPool bin as flat arrays over (R, output_dim, group, group)."""

    def __init__(self, ctx: OpContext, x: Any) -> None:
        scale, group, out_dim = _psroi_params(ctx)
        n, c, height, width = (int(s) for s in x.shape)
        if c != out_dim * group * group:
            raise ctx.fail(f"X has {c} channels, expected output_dim * group_size^2 = "
                           f"{out_dim} * {group}^2 = {out_dim * group * group}")
        rois = _roi_rows(ctx, n)
        r = rois.shape[0]
        hs, he, ws, we = _psroi_windows(rois, scale, group, height, width)
        shape = (r, out_dim, group, group)
        self.hs = np.broadcast_to(hs[:, None, :, None], shape).reshape(-1)
        self.he = np.broadcast_to(he[:, None, :, None], shape).reshape(-1)
        self.ws = np.broadcast_to(ws[:, None, None, :], shape).reshape(-1)
        self.we = np.broadcast_to(we[:, None, None, :], shape).reshape(-1)
        grid = np.arange(group)
        channel = ((np.arange(out_dim)[:, None, None] * group + grid[None, :, None]) * group
                   + grid[None, None, :])
        self.channel = np.broadcast_to(channel[None], shape).reshape(-1)
        self.batch = np.broadcast_to(rois[:, 0].astype(np.int64)[:, None, None, None],
                                     shape).reshape(-1)
        self.shape, self.c, self.height, self.width = shape, c, height, width
        self.area = (self.he - self.hs) * (self.we - self.ws)
        self.empty = (self.he <= self.hs) | (self.we <= self.ws)


@register_op("PSRoIPool", inputs=2, outputs=2,
             shape=lambda op, s, t: _psroi_shape(op, s, t))
def ps_roi_pool(ctx: OpContext) -> Outputs:
    """[X (N, output_dim * group_size^2, H, W), RoIs (R, 5)] -> [Y (R, output_dim,
    group_size, group_size), mapping_channel (int32)]: R-FCN's position-sensitive average
    pooling; bin (i, j) of output channel k averages input channel (k * G + i) * G + j.
    Args spatial_scale (1.0), group_size (1), output_dim (1)."""
    xp = ctx.xp
    x = _require_4d(ctx, 0)
    bins = _PSBins(ctx, x)
    if bins.batch.size == 0:
        return xp.zeros(bins.shape, dtype=x.dtype), xp.zeros(bins.shape, dtype=np.int32)
    # a summed-area table makes every rectangle sum four lookups
    table = xp.zeros((x.shape[0], x.shape[1], bins.height + 1, bins.width + 1),
                     dtype=np.float64)
    table[:, :, 1:, 1:] = x.astype(np.float64).cumsum(axis=2).cumsum(axis=3)
    b, ch = xp.asarray(bins.batch), xp.asarray(bins.channel)

    def corner(rows: np.ndarray, cols: np.ndarray) -> Any:
        return table[b, ch, xp.asarray(rows), xp.asarray(cols)]

    total = (corner(bins.he, bins.we) - corner(bins.hs, bins.we) - corner(bins.he, bins.ws)
             + corner(bins.hs, bins.ws))
    area = xp.asarray(np.maximum(bins.area, 1).astype(np.float64))
    y = xp.where(xp.asarray(bins.empty), 0.0, total / area).astype(x.dtype)
    mapping = xp.asarray(bins.channel.astype(np.int32))
    return y.reshape(bins.shape), mapping.reshape(bins.shape)


def _psroi_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[1] is None:
        return [None, None]
    args = arguments_dict(op.arg)
    group = int(args.get("group_size", 1))
    dims = (shapes[1][0], int(args.get("output_dim", 1)), group, group)
    return [(dims, (types[0] or FLOAT)), (dims, INT32)]


@register_gradient("PSRoIPool")
def _ps_roi_pool_grad(g: GradientBuilder) -> None:
    g.add("PSRoIPoolGradient", [g.I(0), g.I(1), g.O(1), g.GO(0)], [g.GI(0)])


@register_op("PSRoIPoolGradient", inputs=4, outputs=1, shape=like_inputs(0))
def ps_roi_pool_gradient(ctx: OpContext) -> Outputs:
    """[X, RoIs, mapping_channel, dY] -> dX: each dY bin spread evenly over its window of its
    mapped channel."""
    xp = ctx.xp
    x = _require_4d(ctx, 0)
    bins = _PSBins(ctx, x)
    dy = ctx.inputs[3]
    if tuple(dy.shape) != bins.shape:
        raise ctx.fail(f"dY has shape {tuple(dy.shape)}, expected {bins.shape} (R, output_dim, "
                       f"group_size, group_size)")
    mapping = host(ctx.inputs[2]).reshape(-1).astype(np.int64)
    if mapping.size != bins.channel.size:
        raise ctx.fail(f"mapping_channel has {mapping.size} entries, expected "
                       f"{bins.channel.size} like dY")
    if bins.batch.size == 0:
        return (xp.zeros_like(x),)
    # difference array: +v at (hs, ws) and (he, we), -v at (hs, we) and (he, ws); the 2-D
    # running sum of it is v on the window and 0 elsewhere
    h1, w1 = bins.height + 1, bins.width + 1
    plane = (bins.batch * bins.c + mapping) * (h1 * w1)
    share = xp.where(xp.asarray(bins.empty), 0.0,
                     dy.reshape(-1).astype(np.float64)
                     / xp.asarray(np.maximum(bins.area, 1).astype(np.float64)))
    index = np.concatenate([plane + bins.hs * w1 + bins.ws, plane + bins.he * w1 + bins.we,
                            plane + bins.hs * w1 + bins.we, plane + bins.he * w1 + bins.ws])
    values = xp.concatenate([share, share, -share, -share])
    diff = _scatter_add(xp, x.shape[0] * bins.c * h1 * w1, xp.asarray(index), values,
                        np.float64)
    dense = diff.reshape(x.shape[0], bins.c, h1, w1).cumsum(axis=2).cumsum(axis=3)
    return (dense[:, :, :-1, :-1].astype(x.dtype),)


# --- GroupSpatialSoftmax ---------------------------------------------------------------------
def _grouped(ctx: OpContext, x: Any) -> Any:
    """(N, A, K, H, W) view of a (N, A*K, H, W) input with K = num_classes (default 81)."""
    k = ctx.int_arg("num_classes", 81)
    if x.ndim != 4 or k <= 0 or x.shape[1] % k:
        raise ctx.fail(f"input must be 4-D (N, num_anchors * num_classes, H, W) with "
                       f"num_classes={k}, got shape {tuple(x.shape)}")
    n, d, h, w = x.shape
    return x.reshape(n, d // k, k, h, w)


@register_op("GroupSpatialSoftmax", inputs=1, outputs=1, shape=like_inputs(0))
def group_spatial_softmax(ctx: OpContext) -> Outputs:
    """scores (N, A * num_classes, H, W) -> probabilities: a softmax over each anchor's
    num_classes (default 81) contiguous channels at every location."""
    xp = ctx.xp
    x = ctx.inputs[0]
    g = _grouped(ctx, x)
    e = xp.exp(g - g.max(axis=2, keepdims=True))
    return ((e / e.sum(axis=2, keepdims=True)).reshape(x.shape).astype(x.dtype, copy=False),)


@register_gradient("GroupSpatialSoftmax")
def _group_spatial_softmax_grad(g: GradientBuilder) -> None:
    g.add("GroupSpatialSoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_op("GroupSpatialSoftmaxGradient", inputs=2, outputs=1, shape=like_inputs(0))
def group_spatial_softmax_gradient(ctx: OpContext) -> Outputs:
    """[probabilities, d_probabilities] -> d_scores = P * (dP - sum over the group of
    P * dP)."""
    p, dp = ctx.inputs
    if tuple(dp.shape) != tuple(p.shape):
        raise ctx.fail(f"d_probabilities has shape {tuple(dp.shape)}, expected "
                       f"{tuple(p.shape)}")
    pg, dg = _grouped(ctx, p), _grouped(ctx, dp)
    dx = pg * (dg - (pg * dg).sum(axis=2, keepdims=True))
    return (dx.reshape(p.shape).astype(p.dtype, copy=False),)


# --- SampleAs --------------------------------------------------------------------------------
def _sample_mask(ctx: OpContext, x: Any) -> np.ndarray:
    labels = host(ctx.inputs[1]).reshape(-1)
    if x.ndim < 1 or labels.size != x.shape[0]:
        raise ctx.fail(f"X.dim32(0) must be equal to L.dim32(0): X {tuple(x.shape)} has "
                       f"{x.shape[0] if x.ndim else 0} rows, labels "
                       f"{ctx.input_name(1)!r} has {labels.size} entries")
    return labels > 0


@register_op("SampleAs", inputs=2, outputs=1)
def sample_as(ctx: OpContext) -> Outputs:
    """[X (N, ...), labels (N) int] -> Y: the rows of X whose label is > 0, in order."""
    x = ctx.inputs[0]
    mask = _sample_mask(ctx, x)
    return (x[ctx.xp.asarray(np.flatnonzero(mask))],)


@register_gradient("SampleAs")
def _sample_as_grad(g: GradientBuilder) -> None:
    g.add("SampleAsGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("SampleAsGradient", inputs=3, outputs=1, shape=like_inputs(0))
def sample_as_gradient(ctx: OpContext) -> Outputs:
    """[X, labels, dY] -> dX: dY's rows written back to the selected rows, zeros
    elsewhere."""
    x, dy = ctx.inputs[0], ctx.inputs[2]
    rows = np.flatnonzero(_sample_mask(ctx, x))
    if tuple(dy.shape) != (rows.size, *x.shape[1:]):
        raise ctx.fail(f"dY has shape {tuple(dy.shape)}, expected "
                       f"{(rows.size, *x.shape[1:])} (one row per label > 0)")
    dx = ctx.xp.zeros(x.shape, dtype=dy.dtype)
    dx[ctx.xp.asarray(rows)] = dy
    return (dx,)


# --- ZeroEven (Detectron's custom-operator example) ------------------------------------------
@register_op("ZeroEven", inputs=1, outputs=1, shape=like_inputs(0))
def zero_even(ctx: OpContext) -> Outputs:
    """1-D X -> a copy with the elements at even indices set to 0."""
    x = ctx.inputs[0]
    if x.ndim != 1:
        raise ctx.fail(f"enforce fail: X.ndim() == 1 (X {ctx.input_name(0)!r} has shape "
                       f"{tuple(x.shape)}); ZeroEven takes a 1-D tensor")
    y = x.copy()
    y[0::2] = 0
    return (y,)


@register_gradient("ZeroEven")
def _zero_even_grad(g: GradientBuilder) -> None:
    # Detectron registers no gradient; d/dX of ZeroEven is ZeroEven applied to dY.
    g.add("ZeroEven", [g.GO(0)], [g.GI(0)])
