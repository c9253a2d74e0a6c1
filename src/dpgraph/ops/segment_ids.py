"""Lengths and segment-id conversions: LengthsToOffsets, LengthsToWeights,
SegmentIdsToLengths and SegmentIdsToRanges (none has a gradient).

Segment ids are sorted (non-decreasing, from 0); a missing id is an empty segment.  The
optional second input of the SegmentIdsTo* ops fixes the number of segments to its first
dimension (trailing empty segments included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient


def _lengths(ctx: OpContext) -> np.ndarray:
    lengths = host(ctx.inputs[0]).reshape(-1).astype(np.int64)
    if lengths.size and int(lengths.min()) < 0:
        raise ctx.fail(f"lengths must be non-negative, got {lengths.tolist()}")
    return lengths


@register_op("LengthsToOffsets", inputs=1, outputs=1)
def lengths_to_offsets(ctx: OpContext) -> Outputs:
    """LENGTHS -> the int32 offset where each segment starts (``include_last_offset``: and
    the total at the end)."""
    lengths = _lengths(ctx)
    ends = np.cumsum(lengths)
    offsets = np.concatenate([[0], ends[:-1]]) if lengths.size else ends
    if ctx.int_arg("include_last_offset", 0):
        offsets = np.concatenate([offsets, [int(ends[-1]) if lengths.size else 0]])
    return (offsets.astype(np.int32),)


@register_op("LengthsToWeights", inputs=1, outputs=1)
def lengths_to_weights(ctx: OpContext) -> Outputs:
    """LENGTHS -> one float weight per element: ``1 / length ** power`` (power 0.5)."""
    lengths = _lengths(ctx)
    power = ctx.float_arg("power", 0.5)
    per_segment = 1.0 / np.power(np.maximum(lengths, 1).astype(np.float64), power)
    return (np.repeat(per_segment, lengths).astype(np.float32),)


def _segment_lengths(ctx: OpContext) -> np.ndarray:
    ids = host(ctx.inputs[0]).reshape(-1).astype(np.int64)
    if ids.size and (int(ids[0]) < 0 or np.any(np.diff(ids) < 0)):
        raise ctx.fail(f"segment ids must be sorted and start at >= 0, got {ids.tolist()[:10]}")
    count = int(ids[-1]) + 1 if ids.size else 0
    if len(ctx.inputs) > 1:
        declared = int(np.shape(ctx.inputs[1])[0]) if np.ndim(ctx.inputs[1]) else 0
        if declared < count:
            raise ctx.fail(f"segment id {count - 1} is out of range for {declared} segments "
                           f"(the first dimension of {ctx.input_name(1)!r})")
        count = declared
    return np.bincount(ids, minlength=count).astype(np.int64)


@register_op("SegmentIdsToLengths", inputs=(1, 2), outputs=1)
def segment_ids_to_lengths(ctx: OpContext) -> Outputs:
    """Sorted SEGMENT_IDS (, DATA_TO_INFER_DIM) -> the int32 length of every segment."""
    return (_segment_lengths(ctx).astype(np.int32),)


@register_op("SegmentIdsToRanges", inputs=(1, 2), outputs=1)
def segment_ids_to_ranges(ctx: OpContext) -> Outputs:
    """Sorted SEGMENT_IDS (, DATA_TO_INFER_DIM) -> int32 ``[start, length]`` per segment."""
    lengths = _segment_lengths(ctx)
    starts = np.cumsum(lengths) - lengths
    ranges: Any = np.stack([starts, lengths], axis=1) if lengths.size else np.zeros((0, 2))
    return (ranges.astype(np.int32),)


for _type in ("LengthsToOffsets", "LengthsToWeights", "SegmentIdsToLengths",
              "SegmentIdsToRanges"):
    register_gradient(_type)(no_gradient)
