"""Region-proposal operators (Caffe2's Detectron RPN and FPN ops), run on the host and
without gradients: GenerateProposals, CollectRpnProposals, DistributeFpnProposals and
CollectAndDistributeFpnRpnProposals."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.nms import hard_nms

# --- GenerateProposals (RPN) -----------------------------------------------------------------
_BBOX_XFORM_CLIP = float(np.log(1000.0 / 16.0))


def _apply_deltas(boxes: np.ndarray, deltas: np.ndarray, offset: float) -> np.ndarray:
    """Caffe2's bbox_transform with weights (1, 1, 1, 1): anchors + deltas -> boxes."""
    widths = boxes[:, 2] - boxes[:, 0] + offset
    heights = boxes[:, 3] - boxes[:, 1] + offset
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    dw = np.minimum(deltas[:, 2], _BBOX_XFORM_CLIP)
    dh = np.minimum(deltas[:, 3], _BBOX_XFORM_CLIP)
    px, py = deltas[:, 0] * widths + ctr_x, deltas[:, 1] * heights + ctr_y
    pw, ph = np.exp(dw) * widths, np.exp(dh) * heights
    return np.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw - offset,
                     py + 0.5 * ph - offset], axis=1).astype(boxes.dtype, copy=False)


def _box_areas(boxes: Any, offset: float) -> Any:
    return (boxes[:, 2] - boxes[:, 0] + offset) * (boxes[:, 3] - boxes[:, 1] + offset)


class _ProposalParams:
    def __init__(self, ctx: OpContext) -> None:
        self.spatial_scale = ctx.float_arg("spatial_scale", 1.0 / 16)
        self.pre_nms_top_n = ctx.int_arg("pre_nms_topN", 6000)
        self.post_nms_top_n = ctx.int_arg("post_nms_topN", 300)
        self.nms_thresh = ctx.float_arg("nms_thresh", 0.7)
        self.min_size = ctx.float_arg("min_size", 16.0)
        self.offset = 1.0 if ctx.int_arg("legacy_plus_one", 1) else 0.0


def _proposals_one_image(p: _ProposalParams, scores: np.ndarray, deltas: np.ndarray,
                         im_info: np.ndarray, anchors: np.ndarray) -> tuple[Any, Any]:
    """(boxes [k, 4], scores [k]) of one image; scores (A, H, W), deltas (4A, H, W)."""
    a, h, w = scores.shape
    stride = np.float32(1.0 / p.spatial_scale)
    sy, sx = np.meshgrid(np.arange(h, dtype=np.float32) * stride,
                         np.arange(w, dtype=np.float32) * stride, indexing="ij")
    shifts = np.stack([sx, sy, sx, sy], axis=-1).reshape(h * w, 1, 4)
    all_anchors = (shifts + anchors.reshape(1, a, 4)).reshape(-1, 4)
    flat_scores = scores.transpose(1, 2, 0).reshape(-1)
    flat_deltas = deltas.reshape(a, 4, h, w).transpose(2, 3, 0, 1).reshape(-1, 4)
    order = np.argsort(-flat_scores, kind="stable")
    if 0 < p.pre_nms_top_n < order.size:
        order = order[:p.pre_nms_top_n]
    top_scores = flat_scores[order]
    boxes = _apply_deltas(all_anchors[order], flat_deltas[order], p.offset)
    height, width, im_scale = (np.float32(v) for v in im_info[:3])
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, width - p.offset)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, height - p.offset)
    ws = boxes[:, 2] - boxes[:, 0] + p.offset
    hs = boxes[:, 3] - boxes[:, 1] + p.offset
    min_size = np.float32(p.min_size) * im_scale
    keep = np.flatnonzero((ws >= min_size) & (hs >= min_size)
                          & (boxes[:, 0] + ws / 2 < width) & (boxes[:, 1] + hs / 2 < height))
    boxes, top_scores = boxes[keep], top_scores[keep]
    kept = hard_nms(boxes, np.arange(boxes.shape[0]), p.nms_thresh, p.post_nms_top_n, p.offset)
    return boxes[kept], top_scores[kept]


@register_op("GenerateProposals", inputs=4, outputs=2)
def generate_proposals(ctx: OpContext) -> Outputs:
    """[scores (N, A, H, W), bbox_deltas (N, 4A, H, W), im_info (N, 3: height, width, scale),
    anchors (A, 4)] -> [rois (n, 5: image, x1, y1, x2, y2), rois_probs (n,)]: RPN proposals
    (anchors + deltas, clipped, small boxes removed, NMS).  Args spatial_scale (1/16),
    pre_nms_topN (6000), post_nms_topN (300), nms_thresh (0.7), min_size (16),
    legacy_plus_one (1).  Rotated (5-value) boxes are not supported."""
    scores, deltas, im_info, anchors = (host(v) for v in ctx.inputs)
    if scores.ndim != 4 or anchors.ndim != 2 or anchors.shape != (scores.shape[1], 4):
        raise ctx.fail(f"expected scores (N, A, H, W) and anchors (A, 4), got "
                       f"{scores.shape} and {anchors.shape} (rotated boxes are unsupported)")
    if deltas.shape != (scores.shape[0], 4 * scores.shape[1], *scores.shape[2:]):
        raise ctx.fail(f"bbox_deltas must have shape (N, 4A, H, W), got {deltas.shape}")
    if im_info.shape != (scores.shape[0], 3):
        raise ctx.fail(f"im_info must have shape (N, 3), got {im_info.shape}")
    params = _ProposalParams(ctx)
    rois, probs = [], []
    for image in range(scores.shape[0]):
        boxes, kept = _proposals_one_image(params, scores[image].astype(np.float32),
                                           deltas[image].astype(np.float32), im_info[image],
                                           anchors.astype(np.float32))
        rois.append(np.concatenate([np.full((len(boxes), 1), image, np.float32), boxes], 1))
        probs.append(kept)
    out_rois = np.concatenate(rois) if rois else np.zeros((0, 5), np.float32)
    out_probs = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    return ctx.xp.asarray(out_rois), ctx.xp.asarray(out_probs.astype(np.float32))


# --- FPN proposal collection / distribution --------------------------------------------------
def _fpn_levels(rois: np.ndarray, ctx: OpContext) -> np.ndarray:
    """Target FPN level of each RoI: floor(canonical_level + log2(sqrt(area) /
    canonical_scale + 1e-6)), clamped to [roi_min_level, roi_max_level]."""
    offset = 1.0 if ctx.int_arg("legacy_plus_one", 1) else 0.0
    scale = np.sqrt(_box_areas(rois[:, 1:5], offset))
    level = np.floor(ctx.int_arg("roi_canonical_level", 4)
                     + np.log2(scale / ctx.int_arg("roi_canonical_scale", 224) + 1e-6))
    return np.clip(level, ctx.int_arg("roi_min_level", 2), ctx.int_arg("roi_max_level", 5))


def _collect(ctx: OpContext) -> np.ndarray:
    """The top rpn_post_nms_topN RoIs of all RPN levels, by descending score (stable)."""
    levels = ctx.int_arg("rpn_max_level", 6) - ctx.int_arg("rpn_min_level", 2) + 1
    if len(ctx.inputs) != 2 * levels:
        raise ctx.fail(f"expected {2 * levels} inputs (RoIs then scores of each RPN level "
                       f"{ctx.int_arg('rpn_min_level', 2)}..{ctx.int_arg('rpn_max_level', 6)}), "
                       f"got {len(ctx.inputs)}")
    arrays = [host(v) for v in ctx.inputs]
    rois = np.concatenate([r.reshape(-1, 5) for r in arrays[:levels]]).astype(np.float32)
    scores = np.concatenate([s.reshape(-1) for s in arrays[levels:]])
    if scores.shape[0] != rois.shape[0]:
        raise ctx.fail(f"{rois.shape[0]} RoIs but {scores.shape[0]} scores")
    order = np.argsort(-scores, kind="stable")[:max(ctx.int_arg("rpn_post_nms_topN", 2000), 0)]
    return rois[order]


def _distribute(ctx: OpContext, rois: np.ndarray) -> list[Any]:
    """[RoIs of each level roi_min..roi_max, rois_idx_restore_int32]."""
    levels = _fpn_levels(rois, ctx)
    low, high = ctx.int_arg("roi_min_level", 2), ctx.int_arg("roi_max_level", 5)
    expected = high - low + 2
    if ctx.num_outputs - (ctx.op.type == "CollectAndDistributeFpnRpnProposals") != expected:
        raise ctx.fail(f"expected {expected} distribution outputs (RoIs of each level "
                       f"{low}..{high}, then rois_idx_restore_int32), got {ctx.num_outputs}")
    per_level = [np.flatnonzero(levels == lvl) for lvl in range(low, high + 1)]
    order = np.concatenate(per_level) if per_level else np.zeros(0, np.int64)
    restore = np.argsort(order, kind="stable").astype(np.int32)
    return [ctx.xp.asarray(rois[idx]) for idx in per_level] + [ctx.xp.asarray(restore)]


@register_op("CollectAndDistributeFpnRpnProposals", inputs=(2, None), outputs=(3, None))
def collect_and_distribute_fpn_rpn_proposals(ctx: OpContext) -> Outputs:
    """[rpn_rois_fpn<min..max>, rpn_roi_probs_fpn<min..max>] -> [rois, rois_fpn<min..max>,
    rois_idx_restore_int32]; args roi_canonical_scale (224), roi_canonical_level (4),
    roi_min_level (2), roi_max_level (5), rpn_min_level (2), rpn_max_level (6),
    rpn_post_nms_topN (2000), legacy_plus_one (1)."""
    rois = _collect(ctx)
    return [ctx.xp.asarray(rois), *_distribute(ctx, rois)]


@register_op("CollectRpnProposals", inputs=(2, None), outputs=1)
def collect_rpn_proposals(ctx: OpContext) -> Outputs:
    """[rpn_rois_fpn<min..max>, rpn_roi_probs_fpn<min..max>] -> rois (top by score)."""
    return (ctx.xp.asarray(_collect(ctx)),)


@register_op("DistributeFpnProposals", inputs=1, outputs=(2, None))
def distribute_fpn_proposals(ctx: OpContext) -> Outputs:
    """[rois] -> [rois_fpn<min..max>, rois_idx_restore_int32] by FPN level."""
    rois = host(ctx.inputs[0]).astype(np.float32).reshape(-1, 5)
    return _distribute(ctx, rois)
