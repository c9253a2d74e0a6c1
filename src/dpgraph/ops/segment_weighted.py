"""Weighted-sum segment reductions (Caffe2's segment_reduction_op with the WeightedSum
reducer): ``(Sparse)(Sorted|Unsorted)SegmentWeightedSum`` and their gradients.

Forward inputs are ``[DATA, SCALARS, SEGMENT_IDS]`` (dense) or ``[DATA, SCALARS, INDICES,
SEGMENT_IDS]`` (sparse: rows ``DATA[INDICES]``); ``OUT[s] = Σ_{i: seg[i]=s} w[i]·row_i``.
Unsorted ops take ``num_segments`` (default max id + 1); sorted ones need non-decreasing
ids (last id + 1 segments).  The gradient op ``(Sorted|Unsorted)SegmentWeightedSumGradient``
takes ``[SCALARS, dOUT, SEGMENT_IDS]`` and gives ``w[i]·dOUT[seg[i]]`` per row, a
GradientSlice on INDICES for the sparse ops; like Caffe2 there is no gradient for the
weights (``grad_on_weights`` is refused).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import GradientError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops._sparse_rows import check_indices, integer_indices
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


def _segments(ctx: OpContext, ids: Any, rows: int, sorted_ids: bool) -> tuple[np.ndarray, int]:
    """(segment id per row, number of output segments)."""
    seg = integer_indices(ctx, ids, "SEGMENT_IDS").reshape(-1)
    if seg.size != rows:
        raise ctx.fail(f"SEGMENT_IDS has {seg.size} entries, expected one per row ({rows})")
    if seg.size and int(seg.min()) < 0:
        raise ctx.fail("SEGMENT_IDS must be non-negative")
    if sorted_ids:
        if seg.size > 1 and bool((np.diff(seg) < 0).any()):
            raise ctx.fail("SEGMENT_IDS must be sorted (non-decreasing)")
        return seg, int(seg[-1]) + 1 if seg.size else 0
    count = ctx.int_arg("num_segments", -1)
    count = (int(seg.max()) + 1 if seg.size else 0) if count < 0 else count
    if seg.size and int(seg.max()) >= count:
        raise ctx.fail(f"segment id {int(seg.max())} >= num_segments {count}")
    return seg, count


def _weights(ctx: OpContext, rows: int) -> np.ndarray:
    w = host(ctx.inputs[1])
    if w.ndim != 1 or w.size != rows:
        raise ctx.fail(f"SCALARS must be a vector of {rows} weights (one per row), got shape "
                       f"{w.shape}")
    return w


def _weighted_sum(ctx: OpContext, rows: Any, ids: Any, sorted_ids: bool) -> np.ndarray:
    rows = host(rows)
    w = _weights(ctx, rows.shape[0])
    seg, count = _segments(ctx, ids, rows.shape[0], sorted_ids)
    scaled = rows * w.astype(rows.dtype).reshape((-1,) + (1,) * (rows.ndim - 1))
    out = np.zeros((count, *rows.shape[1:]), dtype=rows.dtype)
    np.add.at(out, seg, scaled)
    return out


def _gradient(ctx: OpContext) -> Outputs:
    """[SCALARS, dOUT, SEGMENT_IDS] -> per-row gradient w[i]·dOUT[seg[i]]."""
    w, dout, ids = (host(v) for v in ctx.inputs)
    seg = integer_indices(ctx, ids, "SEGMENT_IDS").reshape(-1)
    if w.size != seg.size:
        raise ctx.fail(f"SCALARS has {w.size} weights for {seg.size} segment ids")
    if seg.size and int(seg.max()) >= dout.shape[0]:
        raise ctx.fail(f"segment id {int(seg.max())} is outside dOUT's {dout.shape[0]} rows")
    rows = dout[seg]
    return ((rows * w.astype(dout.dtype).reshape((-1,) + (1,) * (rows.ndim - 1)))
            .astype(dout.dtype, copy=False),)


def _refuse_weight_grad(g: GradientBuilder) -> None:
    if g.arg("grad_on_weights", 0):
        raise GradientError(f"{g.op.type} {list(g.op.input)}: grads on aux inputs "
                            f"(grad_on_weights) are not implemented for Segment operators")


def _register(sorted_ids: bool) -> None:
    kind = "Sorted" if sorted_ids else "Unsorted"
    grad_type = f"{kind}SegmentWeightedSumGradient"

    def dense(ctx: OpContext) -> Outputs:
        return (_weighted_sum(ctx, ctx.inputs[0], ctx.inputs[2], sorted_ids),)

    def sparse(ctx: OpContext) -> Outputs:
        data = host(ctx.inputs[0])
        idx = check_indices(ctx, ctx.inputs[2], data.shape[0], "INDICES")
        return (_weighted_sum(ctx, data[idx], ctx.inputs[3], sorted_ids),)

    def dense_grad(g: GradientBuilder) -> None:
        _refuse_weight_grad(g)
        g.add(grad_type, [g.I(1), g.GO(0), g.I(2)], [g.GI(0)])

    def sparse_grad(g: GradientBuilder) -> None:
        _refuse_weight_grad(g)
        values = g.GI_V(0)
        g.add(grad_type, [g.I(1), g.GO(0), g.I(3)], [values])
        g.set_input_grad(0, GradientSlice(g.I(2), values))

    dense.__doc__ = f"[DATA, SCALARS, SEGMENT_IDS] -> weighted per-segment sums ({kind})"
    sparse.__doc__ = "[DATA, SCALARS, INDICES, SEGMENT_IDS] -> weighted sums of DATA[INDICES]"
    register_op(f"{kind}SegmentWeightedSum", inputs=3, outputs=1)(dense)
    register_op(f"Sparse{kind}SegmentWeightedSum", inputs=4, outputs=1)(sparse)
    register_op(grad_type, inputs=3, outputs=1)(_gradient)
    register_gradient(f"{kind}SegmentWeightedSum")(dense_grad)
    register_gradient(f"Sparse{kind}SegmentWeightedSum")(sparse_grad)


for _sorted in (True, False):
    _register(_sorted)
