"""Sparse and segment operators: gathers, scatters, lengths/segment reductions, one-hots, masks.

``Gather`` has no gradient op: its input gradient is the sparse
``GradientSlice(indices=INDICES, values=dY)``.  The fused ``SparseLengths*`` reductions make a
gradient op for the values part only and declare ``GradientSlice(INDICES, DATA_grad_values)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.arguments import MakeArgument, arguments_dict
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, FLOAT16, host
from dpgraph.ops._sparse_rows import check_indices, check_rows, integer_indices, writable
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.gradient_builder import GradientBuilder


def _int_array(x: Any) -> Any:
    return host(x).reshape(-1).astype(np.int64)


def _out_dtype(data: Any) -> Any:
    """Reductions of float16 data give float32, as Caffe2's fused lengths ops."""
    return np.float32 if data.dtype == np.float16 else data.dtype


# --- gathers ---------------------------------------------------------------------------------
def _gather_indices(ctx: OpContext, indices: Any, size: int) -> Any:
    idx = integer_indices(ctx, indices)
    if ctx.int_arg("wrap_indices", 0):
        idx = np.where(idx < 0, idx + size, idx)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise ctx.fail(f"indices must lie in [0, {size}), got [{int(idx.min())}, "
                       f"{int(idx.max())}]")
    return idx


def _gather_shape(default_axis: int) -> Any:
    def shape_fn(op: Any, shapes: list, types: list) -> list:
        data, idx = shapes[0], shapes[1]
        if data is None or idx is None:
            return [None]
        axis = int(arguments_dict(op.arg).get("axis", default_axis))
        axis = axis + len(data) if axis < 0 else axis
        return [((*data[:axis], *idx, *data[axis + 1:]), types[0] or FLOAT)]

    return shape_fn


@register_op("Gather", inputs=2, outputs=1, shape=_gather_shape(0))
def gather(ctx: OpContext) -> Outputs:
    """[DATA, INDICES] -> DATA's slices at INDICES along ``axis`` (default 0)."""
    data, indices = ctx.inputs
    axis = ctx.int_arg("axis", 0)
    axis = axis + data.ndim if axis < 0 else axis
    idx = _gather_indices(ctx, indices, data.shape[axis])
    if ctx.int_arg("match_outer", 0):
        return (_gather_match_outer(ctx, data, idx, axis),)
    return (ctx.xp.take(data, ctx.xp.asarray(idx), axis=axis),)


def _outer_views(ctx: OpContext, shape: tuple[int, ...], idx: Any, axis: int
                 ) -> tuple[int, int, Any]:
    """``match_outer``: INDICES' first ``axis`` dims are DATA's; returns (outer size, inner
    size after the axis, INDICES as [outer, per-outer count])."""
    if tuple(idx.shape[:axis]) != tuple(shape[:axis]):
        raise ctx.fail(f"match_outer needs INDICES {tuple(idx.shape)} to start with DATA's "
                       f"outer dims {tuple(shape[:axis])}")
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, inner, idx.reshape(outer, -1)


def _gather_match_outer(ctx: OpContext, data: Any, idx: Any, axis: int) -> Any:
    """``out[o..., j..., r...] = data[o..., idx[o..., j...], r...]``."""
    outer, inner, rows = _outer_views(ctx, data.shape, idx, axis)
    flat = data.reshape(outer, data.shape[axis], inner)
    picked = flat[np.arange(outer)[:, None], rows]
    return picked.reshape(*data.shape[:axis], *idx.shape[axis:], *data.shape[axis + 1:])


def _scatter_add(size: int, positions: Any, values: Any, dtype: Any) -> Any:
    """A length-``size`` array with ``values`` summed at ``positions`` (np.bincount: one C
    pass, unlike np.add.at; sums in float64, then cast)."""
    summed = np.bincount(positions.reshape(-1), weights=values.reshape(-1).astype(np.float64),
                         minlength=size)
    return summed.astype(dtype, copy=False)


@register_gradient("Gather")
def _gather_grad(g: GradientBuilder) -> None:
    axis = int(g.arg("axis", 0))
    if axis == 0:
        if g.arg("dense_gradient", 0):
            g.add("SparseToDense", [g.I(1), g.GO(0), g.I(0)], [g.GI(0)])
        else:
            g.set_input_grad(0, GradientSlice(g.I(1), g.GO(0)))
        return
    g.add("BatchGatherGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)], axis=axis)


@register_op("BatchGather", inputs=2, outputs=1, shape=_gather_shape(1))
def batch_gather(ctx: OpContext) -> Outputs:
    """[DATA (B×N×...), INDICES] -> DATA[:, INDICES] (gather along ``axis``, default 1)."""
    data, indices = ctx.inputs
    axis = ctx.int_arg("axis", 1)
    axis = axis + data.ndim if axis < 0 else axis
    idx = _gather_indices(ctx, indices, data.shape[axis])
    if ctx.int_arg("match_outer", 0):
        return (_gather_match_outer(ctx, data, idx, axis),)
    return (ctx.xp.take(data, ctx.xp.asarray(idx), axis=axis),)


@register_gradient("BatchGather")
def _batch_gather_grad(g: GradientBuilder) -> None:
    g.add("BatchGatherGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("BatchGatherGradient", inputs=3, outputs=1,
             shape=lambda op, s, t: [None if s[0] is None else (tuple(s[0]), t[0] or FLOAT)])
def batch_gather_gradient(ctx: OpContext) -> Outputs:
    """[DATA, INDICES, dOut] -> dDATA: dOut scattered back (summed) along ``axis``."""
    data, indices, dout = ctx.inputs
    axis = ctx.int_arg("axis", 1)
    axis = axis + data.ndim if axis < 0 else axis
    idx = _gather_indices(ctx, indices, data.shape[axis])
    dout = np.asarray(dout)
    size = data.shape[axis]
    if ctx.int_arg("match_outer", 0):
        outer, inner, rows = _outer_views(ctx, data.shape, idx, axis)
        base = np.arange(outer)[:, None] * size + rows  # row of data.reshape(-1, inner)
    else:
        outer = int(np.prod(data.shape[:axis], dtype=np.int64))
        inner = int(np.prod(data.shape[axis + 1:], dtype=np.int64))
        base = np.arange(outer)[:, None] * size + idx.reshape(1, -1)
    positions = base[..., None] * inner + np.arange(inner)
    grad = _scatter_add(outer * size * inner, positions, dout, dout.dtype)
    return (grad.reshape(data.shape),)


# --- scatter ---------------------------------------------------------------------------------
@register_op("ScatterAssign", inputs=3, outputs=1, inplace=[(0, 0)],
             shape=lambda op, s, t: [None if s[0] is None else (tuple(s[0]), t[0] or FLOAT)])
def scatter_assign(ctx: OpContext) -> Outputs:
    """[DATA, INDICES, SLICES] -> DATA with DATA[INDICES] = SLICES (in place)."""
    data, indices, slices = ctx.inputs
    idx = check_indices(ctx, indices, data.shape[0])
    rows = check_rows(ctx, data, idx, slices, "slices")
    out = writable(ctx, data, 0, 0)
    out[idx] = rows.astype(data.dtype, copy=False)
    return (out,)


# --- lengths and segment reductions ----------------------------------------------------------
def _segment_ids(ctx: OpContext, lengths: Any, total: int) -> Any:
    lens = _int_array(lengths)
    if lens.size and int(lens.min()) < 0:
        raise ctx.fail("lengths must be non-negative")
    if int(lens.sum()) != total:
        raise ctx.fail(f"lengths sum to {int(lens.sum())} but there are {total} rows")
    return np.repeat(np.arange(lens.size), lens), lens


def _segment_sum(rows: Any, seg: Any, num: int, dtype: Any) -> Any:
    out = np.zeros((num, *rows.shape[1:]), dtype=dtype)
    if rows.shape[0]:
        np.add.at(out, seg, rows.astype(dtype, copy=False))
    return out


def _per_segment(values: Any, like: Any) -> Any:
    """A per-segment vector shaped to broadcast against rows ``like``."""
    return values.reshape((-1,) + (1,) * (like.ndim - 1))


def _lengths_reduce(ctx: OpContext, rows: Any, lengths: Any, mean: bool,
                    weights: Any | None = None) -> Any:
    seg, lens = _segment_ids(ctx, lengths, rows.shape[0])
    dtype = _out_dtype(rows)
    if weights is not None:
        w = np.asarray(weights).reshape(-1)
        if w.size != rows.shape[0]:
            raise ctx.fail(f"weights have {w.size} entries, expected {rows.shape[0]}")
        rows = rows.astype(dtype) * _per_segment(w.astype(dtype), rows)
    out = _segment_sum(rows, seg, lens.size, dtype)
    if mean:
        out /= _per_segment(np.maximum(lens, 1).astype(dtype), out)
    return out


def _expand_lengths(ctx: OpContext, dout: Any, lengths: Any, mean: bool) -> Any:
    lens = _int_array(lengths)
    values = np.repeat(dout, lens, axis=0)
    if mean:
        values = values / _per_segment(np.repeat(np.maximum(lens, 1), lens).astype(dout.dtype),
                                       values)
    return values.astype(dout.dtype, copy=False)


def _gathered(ctx: OpContext, data: Any, indices: Any) -> Any:
    return data[check_indices(ctx, indices, data.shape[0])]


def _lengths_shape(op: Any, shapes: list, types: list) -> list:
    """One row per segment: (len(LENGTHS),) + DATA.shape[1:]; float16 data gives float."""
    data, lengths = shapes[0], shapes[-1]
    if data is None or lengths is None or not lengths:
        return [None]
    dtype = FLOAT if types[0] in (None, FLOAT16) else types[0]
    return [((lengths[0], *data[1:]), dtype)]


@register_op("SparseLengthsSum", inputs=3, outputs=1, shape=_lengths_shape)
def sparse_lengths_sum(ctx: OpContext) -> Outputs:
    """[DATA, INDICES, LENGTHS] -> per-segment sums of DATA[INDICES]."""
    data, indices, lengths = ctx.inputs
    return (_lengths_reduce(ctx, _gathered(ctx, data, indices), lengths, mean=False),)


@register_op("SparseLengthsMean", inputs=3, outputs=1, shape=_lengths_shape)
def sparse_lengths_mean(ctx: OpContext) -> Outputs:
    """[DATA, INDICES, LENGTHS] -> per-segment means of DATA[INDICES] (0 if empty)."""
    data, indices, lengths = ctx.inputs
    return (_lengths_reduce(ctx, _gathered(ctx, data, indices), lengths, mean=True),)


@register_op("SparseLengthsWeightedSum", inputs=4, outputs=1, shape=_lengths_shape)
def sparse_lengths_weighted_sum(ctx: OpContext) -> Outputs:
    """[DATA, WEIGHTS, INDICES, LENGTHS] -> per-segment Σ WEIGHTS[i]·DATA[INDICES[i]]."""
    data, weights, indices, lengths = ctx.inputs
    rows = _gathered(ctx, data, indices)
    return (_lengths_reduce(ctx, rows, lengths, mean=False, weights=weights),)


@register_op("SparseLengthsPositionalWeightedSum", inputs=4, outputs=1,
             shape=_lengths_shape)
def sparse_lengths_positional_weighted_sum(ctx: OpContext) -> Outputs:
    """[DATA, WEIGHTS, INDICES, LENGTHS] -> per-segment sums of DATA[INDICES[i]] weighted by
    WEIGHTS[position of i within its segment]."""
    data, weights, indices, lengths = ctx.inputs
    lens = _int_array(lengths)
    if lens.size and int(lens.min()) < 0:
        raise ctx.fail("lengths must be non-negative")
    positions = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    w = np.asarray(weights).reshape(-1)
    if positions.size and int(positions.max()) >= w.size:
        raise ctx.fail(f"a segment of length {int(lens.max())} needs {int(lens.max())} "
                       f"positional weights; WEIGHTS has {w.size}")
    rows = _gathered(ctx, data, indices)
    return (_lengths_reduce(ctx, rows, lengths, mean=False, weights=w[positions]),)


register_gradient("SparseLengthsPositionalWeightedSum")(no_gradient)


def _sparse_values_grad(g: GradientBuilder, op_type: str, inputs: list[str],
                        indices_input: int) -> None:
    values = g.GI_V(0)
    g.add(op_type, inputs, [values])
    g.set_input_grad(0, GradientSlice(g.I(indices_input), values))


@register_gradient("SparseLengthsSum")
def _sparse_lengths_sum_grad(g: GradientBuilder) -> None:
    _sparse_values_grad(g, "SparseLengthsSumGradient", [g.GO(0), g.I(2)], 1)


@register_gradient("SparseLengthsMean")
def _sparse_lengths_mean_grad(g: GradientBuilder) -> None:
    _sparse_values_grad(g, "SparseLengthsMeanGradient", [g.GO(0), g.I(2)], 1)


@register_gradient("SparseLengthsWeightedSum")
def _sparse_lengths_weighted_sum_grad(g: GradientBuilder) -> None:
    if not g.arg("grad_on_weights", 0):
        _sparse_values_grad(g, "SparseLengthsWeightedSumGradient", [g.I(1), g.GO(0), g.I(3)], 2)
        return
    values = g.GI_V(0)
    g.add("SparseLengthsWeightedSumWithMainInputGradient",
          [g.I(1), g.GO(0), g.I(3), g.I(0), g.I(2)], [values, g.GI(1)])
    g.set_input_grad(0, GradientSlice(g.I(2), values))


@register_op("LengthsSum", inputs=2, outputs=1, shape=_lengths_shape)
def lengths_sum(ctx: OpContext) -> Outputs:
    """[DATA, LENGTHS] -> sums of consecutive row segments."""
    data, lengths = ctx.inputs
    return (_lengths_reduce(ctx, data, lengths, mean=False),)


@register_op("LengthsMean", inputs=2, outputs=1, shape=_lengths_shape)
def lengths_mean(ctx: OpContext) -> Outputs:
    """[DATA, LENGTHS] -> means of consecutive row segments (0 if empty)."""
    data, lengths = ctx.inputs
    return (_lengths_reduce(ctx, data, lengths, mean=True),)


@register_op("LengthsWeightedSum", inputs=3, outputs=1, shape=_lengths_shape)
def lengths_weighted_sum(ctx: OpContext) -> Outputs:
    """[DATA, WEIGHTS, LENGTHS] -> per-segment Σ WEIGHTS[i]·DATA[i]."""
    data, weights, lengths = ctx.inputs
    return (_lengths_reduce(ctx, data, lengths, mean=False, weights=weights),)


@register_gradient("LengthsSum")
def _lengths_sum_grad(g: GradientBuilder) -> None:
    g.add("LengthsSumGradient", [g.GO(0), g.I(1)], [g.GI(0)])


@register_gradient("LengthsMean")
def _lengths_mean_grad(g: GradientBuilder) -> None:
    g.add("LengthsMeanGradient", [g.GO(0), g.I(1)], [g.GI(0)])


@register_gradient("LengthsWeightedSum")
def _lengths_weighted_sum_grad(g: GradientBuilder) -> None:
    g.add("LengthsWeightedSumGradient", [g.I(1), g.GO(0), g.I(2)], [g.GI(0)])


def _register_expand(op_type: str, mean: bool) -> None:
    @register_op(op_type, inputs=2, outputs=1)
    def kernel(ctx: OpContext) -> Outputs:
        """[dOut, LENGTHS] -> each segment's gradient repeated over its rows."""
        dout, lengths = ctx.inputs
        return (_expand_lengths(ctx, dout, lengths, mean),)


for _type, _mean in (("SparseLengthsSumGradient", False), ("SparseLengthsMeanGradient", True),
                     ("LengthsSumGradient", False), ("LengthsMeanGradient", True)):
    _register_expand(_type, _mean)


def _register_indices_in_gradient(op_type: str, mean: bool) -> None:
    @register_op(op_type, inputs=3, outputs=1)
    def kernel(ctx: OpContext) -> Outputs:
        """[dOut, LENGTHS, INDICES] -> each segment's gradient repeated over its rows (the
        GPU kernels' form; INDICES only has to match the lengths' total)."""
        dout, lengths, indices = ctx.inputs
        values = _expand_lengths(ctx, dout, lengths, mean)
        if np.size(indices) != values.shape[0]:
            raise ctx.fail(f"INDICES has {np.size(indices)} entries but LENGTHS sum to "
                           f"{values.shape[0]}")
        return (values,)


_register_indices_in_gradient("SparseLengthsIndicesInGradientSumGradient", False)
_register_indices_in_gradient("SparseLengthsIndicesInGradientMeanGradient", True)


def _weighted_expand(ctx: OpContext) -> Outputs:
    weights, dout, lengths = ctx.inputs[:3]
    values = _expand_lengths(ctx, dout, lengths, mean=False)
    w = np.asarray(weights).reshape(-1).astype(values.dtype)
    if w.size != values.shape[0]:
        raise ctx.fail(f"weights have {w.size} entries but lengths sum to {values.shape[0]}")
    return (values * _per_segment(w, values),)


register_op("SparseLengthsWeightedSumGradient", inputs=3, outputs=1)(_weighted_expand)


@register_op("SparseLengthsWeightedSumWithMainInputGradient", inputs=5, outputs=2)
def sparse_lengths_weighted_sum_with_main_input_gradient(ctx: OpContext) -> Outputs:
    """[WEIGHTS, dOut, LENGTHS, DATA, INDICES] -> [DATA values gradient, dWEIGHTS]."""
    weights, dout, lengths, data, indices = ctx.inputs
    (values,) = _weighted_expand(ctx)
    block = int(np.prod(np.shape(data)[1:], dtype=np.int64))
    rows = _gathered(ctx, data, indices).reshape(values.shape[0], block)
    plain = _expand_lengths(ctx, dout, lengths, mean=False).reshape(rows.shape)
    dw = (rows * plain).sum(axis=1).astype(np.asarray(weights).dtype)
    return values, dw.reshape(np.shape(weights))
register_op("LengthsWeightedSumGradient", inputs=3, outputs=1)(_weighted_expand)


def _segment_count(ctx: OpContext, ids: Any, rows: int) -> Any:
    seg = _int_array(ids)
    if seg.size != rows:
        raise ctx.fail(f"segment ids have {seg.size} entries, expected one per row ({rows})")
    if seg.size and int(seg.min()) < 0:
        raise ctx.fail("segment ids must be non-negative")
    return seg


@register_op("UnsortedSegmentSum", inputs=2, outputs=1)
def unsorted_segment_sum(ctx: OpContext) -> Outputs:
    """[DATA, SEGMENT_IDS] -> per-segment sums (``num_segments``, default max id + 1)."""
    return (_unsorted_reduce(ctx, mean=False),)


@register_op("UnsortedSegmentMean", inputs=2, outputs=1)
def unsorted_segment_mean(ctx: OpContext) -> Outputs:
    """[DATA, SEGMENT_IDS] -> per-segment means (0 for empty segments)."""
    return (_unsorted_reduce(ctx, mean=True),)


@register_op("SortedSegmentSum", inputs=2, outputs=1)
def sorted_segment_sum(ctx: OpContext) -> Outputs:
    """[DATA, SEGMENT_IDS sorted] -> per-segment sums (last id + 1 segments)."""
    ids = _int_array(ctx.inputs[1])
    if ids.size > 1 and bool((np.diff(ids) < 0).any()):
        raise ctx.fail("SEGMENT_IDS must be sorted")
    return (_unsorted_reduce(ctx, mean=False),)


@register_op("SortedSegmentMean", inputs=2, outputs=1)
def sorted_segment_mean(ctx: OpContext) -> Outputs:
    """[DATA, SEGMENT_IDS sorted] -> per-segment means."""
    return (_unsorted_reduce(ctx, mean=True),)


def _unsorted_reduce(ctx: OpContext, mean: bool) -> Any:
    data, ids = ctx.inputs
    return _segment_reduce(ctx, data, ids, mean)


def _segment_reduce(ctx: OpContext, data: Any, ids: Any, mean: bool) -> Any:
    seg = _segment_count(ctx, ids, data.shape[0])
    num = ctx.int_arg("num_segments", -1)
    num = (int(seg.max()) + 1 if seg.size else 0) if num < 0 else num
    if seg.size and int(seg.max()) >= num:
        raise ctx.fail(f"segment id {int(seg.max())} >= num_segments {num}")
    dtype = _out_dtype(data)
    out = _segment_sum(data, seg, num, dtype)
    if mean:
        counts = np.bincount(seg, minlength=num)[:num]
        out /= _per_segment(np.maximum(counts, 1).astype(dtype), out)
    return out


def _segment_grad_kernel(mean: bool) -> Any:
    def kernel(ctx: OpContext) -> Outputs:
        """[dOut, SEGMENT_IDS] -> dOut[SEGMENT_IDS] (divided by the counts for means)."""
        dout, ids = ctx.inputs
        seg = _int_array(ids)
        values = dout[seg]
        if mean:
            counts = np.bincount(seg, minlength=dout.shape[0])
            values = values / _per_segment(np.maximum(counts[seg], 1).astype(dout.dtype),
                                           values)
        return (values.astype(dout.dtype, copy=False),)

    return kernel


def _register_segment_grad(forward: str, mean: bool) -> None:
    grad_type = forward + "Gradient"

    @register_gradient(forward)
    def maker(g: GradientBuilder) -> None:
        g.add(grad_type, [g.GO(0), g.I(1)], [g.GI(0)])

    register_op(grad_type, inputs=2, outputs=1)(_segment_grad_kernel(mean))


for _type, _mean in (("UnsortedSegmentSum", False), ("UnsortedSegmentMean", True),
                     ("SortedSegmentSum", False), ("SortedSegmentMean", True)):
    _register_segment_grad(_type, _mean)


def _register_sparse_segment(forward: str, mean: bool, sorted_ids: bool) -> None:
    """``Sparse<Sorted|Unsorted>Segment<Sum|Mean>``: [DATA, INDICES, SEGMENT_IDS] reduces
    DATA[INDICES]; the gradient is a GradientSlice on INDICES."""

    def kernel(ctx: OpContext) -> Outputs:
        data, indices, ids = ctx.inputs
        if sorted_ids:
            seg = _int_array(ids)
            if seg.size > 1 and bool((np.diff(seg) < 0).any()):
                raise ctx.fail("SEGMENT_IDS must be sorted")
        return (_segment_reduce(ctx, _gathered(ctx, data, indices), ids, mean),)

    kernel.__doc__ = f"[DATA, INDICES, SEGMENT_IDS] -> per-segment {'means' if mean else 'sums'}"
    register_op(forward, inputs=3, outputs=1)(kernel)
    register_op(forward + "Gradient", inputs=2, outputs=1)(_segment_grad_kernel(mean))

    @register_gradient(forward)
    def maker(g: GradientBuilder) -> None:
        _sparse_values_grad(g, forward + "Gradient", [g.GO(0), g.I(2)], 1)


for _sorted in (True, False):
    for _mean in (False, True):
        _register_sparse_segment(
            f"Sparse{'Sorted' if _sorted else 'Unsorted'}Segment{'Mean' if _mean else 'Sum'}",
            _mean, _sorted)


# --- SortedSegmentRange* -----------------------------------------------------------------------
def _range_segments(ctx: OpContext, data: Any, ids: Any) -> tuple[Any, int]:
    seg = _segment_count(ctx, ids, np.shape(data)[0])
    if seg.size > 1 and bool((np.diff(seg) < 0).any()):
        raise ctx.fail("SEGMENT_IDS must be sorted")
    return seg, int(seg[-1]) + 1 if seg.size else 0


def _range_reduce(kind: str, data: Any, seg: Any, count: int) -> Any:
    """Each segment's rows reduced to one (Sum, Mean, Max, LogSumExp, LogMeanExp)."""
    out = np.zeros((count, *data.shape[1:]), dtype=np.float64)
    counts = np.bincount(seg, minlength=count)
    if kind in ("Max", "LogSumExp", "LogMeanExp"):
        peak = np.full(out.shape, -np.inf)
        np.maximum.at(peak, seg, data)
        if kind == "Max":
            return peak
        np.add.at(out, seg, np.exp(data - peak[seg]))
        if kind == "LogMeanExp":
            out /= _per_segment(np.maximum(counts, 1), out)
        return peak + np.log(out)
    np.add.at(out, seg, data)
    return out / _per_segment(np.maximum(counts, 1), out) if kind == "Mean" else out


def _range_gradient(kind: str, dy: Any, data: Any, y: Any, seg: Any) -> Any:
    """d(segment value)/d(row), times the segment's gradient, per row."""
    counts = np.bincount(seg, minlength=dy.shape[0])[seg]
    grad = dy[seg]
    if kind == "Mean":
        return grad / _per_segment(counts, grad)
    if kind == "Max":
        return grad * (data == y[seg])
    if kind in ("LogSumExp", "LogMeanExp"):
        share = np.exp(data - y[seg])
        if kind == "LogMeanExp":
            share = share / _per_segment(counts, share)
        return grad * share
    return grad


def _register_range(kind: str) -> None:
    op_type = f"SortedSegmentRange{kind}"

    def kernel(ctx: OpContext) -> Outputs:
        data = np.asarray(host(ctx.inputs[0]))
        seg, count = _range_segments(ctx, data, ctx.inputs[1])
        return (_range_reduce(kind, data.astype(np.float64), seg, count).astype(data.dtype),)

    kernel.__doc__ = f"[DATA, sorted SEGMENT_IDS] -> each segment's rows reduced by {kind}."
    register_op(op_type, inputs=2, outputs=1)(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        dy, data, y, ids = (np.asarray(host(v)) for v in ctx.inputs)
        seg, _ = _range_segments(ctx, data, ids)
        # As Caffe2: dDATA is shaped [N, *dY.shape[1:]]; DATA and Y are read in dY's blocks.
        if dy.ndim and data.size == seg.size * int(np.prod(dy.shape[1:])) and \
                y.size == dy.size:
            data, y = data.reshape((seg.size, *dy.shape[1:])), y.reshape(dy.shape)
        grad = _range_gradient(kind, dy.astype(np.float64), data.astype(np.float64),
                               y.astype(np.float64), seg)
        return (grad.astype(dy.dtype),)

    grad_kernel.__doc__ = f"Gradient of {op_type}: [dY, DATA, Y, SEGMENT_IDS] -> dDATA."
    register_op(op_type + "Gradient", inputs=4, outputs=1)(grad_kernel)

    @register_gradient(op_type)
    def maker(g: GradientBuilder) -> None:
        g.add(op_type + "Gradient", [g.GO(0), g.I(0), g.O(0), g.I(1)], [g.GI(0)])


for _kind in ("Sum", "Mean", "Max", "LogSumExp", "LogMeanExp"):
    _register_range(_kind)


@register_op("LengthsToSegmentIds", inputs=1, outputs=1)
def lengths_to_segment_ids(ctx: OpContext) -> Outputs:
    """LENGTHS -> the segment id of every row (int32)."""
    lens = _int_array(ctx.inputs[0])
    if lens.size and int(lens.min()) < 0:
        raise ctx.fail("lengths must be non-negative")
    return (np.repeat(np.arange(lens.size, dtype=np.int32), lens),)


# --- dense conversions -----------------------------------------------------------------------
@register_op("SparseToDense", inputs=(2, 3), outputs=1)
def sparse_to_dense(ctx: OpContext) -> Outputs:
    """[INDICES, VALUES(, DATA_TO_INFER_DIM)] -> dense rows, VALUES summed at INDICES."""
    indices, values = ctx.inputs[0], ctx.inputs[1]
    idx = _int_array(indices)
    if len(ctx.inputs) > 2:
        rows = int(np.shape(ctx.inputs[2])[0])
    else:
        rows = int(idx.max()) + 1 if idx.size else 0
    check_indices(ctx, idx, rows)
    values = np.asarray(values)
    if values.shape[:1] != (idx.size,):
        raise ctx.fail(f"VALUES must have {idx.size} rows, got shape {values.shape}")
    out = np.zeros((rows, *values.shape[1:]), dtype=values.dtype)
    np.add.at(out, idx, values)
    return (out,)


@register_gradient("SparseToDense")
def _sparse_to_dense_grad(g: GradientBuilder) -> None:
    g.add("Gather", [g.GO(0), g.I(0)], [g.GI(1)])


@register_op("Unique", inputs=1, outputs=(1, 2))
def unique(ctx: OpContext) -> Outputs:
    """X (1-D) -> [sorted unique values(, remapping: X = unique[remapping])]."""
    x = np.asarray(ctx.inputs[0])
    if x.ndim != 1:
        raise ctx.fail(f"input must be 1-D, got shape {x.shape}")
    values, inverse = np.unique(x, return_inverse=True)
    values = values.astype(x.dtype)
    if ctx.num_outputs == 1:
        return (values,)
    return values, inverse.reshape(-1).astype(np.int32)


@register_op("OneHot", inputs=2, outputs=1)
def one_hot(ctx: OpContext) -> Outputs:
    """[indices (N), index_size] -> float N×index_size one-hot rows."""
    size = int(np.asarray(ctx.inputs[1]).reshape(-1)[0])
    idx = check_indices(ctx, ctx.inputs[0], size)
    ctx.check_output_size((idx.size, size), np.float32)
    out = np.zeros((idx.size, size), dtype=np.float32)
    out[np.arange(idx.size), idx] = 1
    return (out,)


@register_op("SegmentOneHot", inputs=3, outputs=1)
def segment_one_hot(ctx: OpContext) -> Outputs:
    """[lengths, indices, index_size] -> per segment, 1 at each of its indices."""
    lengths, indices, size = ctx.inputs
    size = int(np.asarray(size).reshape(-1)[0])
    idx = check_indices(ctx, indices, size)
    seg, lens = _segment_ids(ctx, lengths, idx.size)
    ctx.check_output_size((lens.size, size), np.float32)
    out = np.zeros((lens.size, size), dtype=np.float32)
    out[seg, idx] = 1
    return (out,)


@register_op("BatchOneHot", inputs=3, outputs=1)
def batch_one_hot(ctx: OpContext) -> Outputs:
    """[X (N×D), LENS (D), VALS (ΣLENS)] -> Y[i, off_j + k] = (X[i, j] == VALS[off_j + k])."""
    x, lens, vals = ctx.inputs
    lens = _int_array(lens)
    x2 = np.asarray(x).reshape(np.shape(x)[0], -1)
    if lens.size != x2.shape[1] or int(lens.sum()) != np.size(vals):
        raise ctx.fail(f"LENS must have {x2.shape[1]} entries summing to {np.size(vals)}")
    columns = np.repeat(np.arange(lens.size), lens)
    out = x2[:, columns] == np.asarray(vals).reshape(1, -1)
    return (out.astype(x2.dtype),)


# --- masks -----------------------------------------------------------------------------------
@register_op("BooleanMask", inputs=2, outputs=(1, 2))
def boolean_mask(ctx: OpContext) -> Outputs:
    """[data, mask (bool, first dim)] -> [data[mask](, masked_indices int64)]."""
    data, mask = ctx.inputs
    mask = np.asarray(mask).reshape(-1).astype(bool)
    if mask.size != np.shape(data)[0]:
        raise ctx.fail(f"mask has {mask.size} entries, data has {np.shape(data)[0]} rows")
    outs = [data[mask], np.flatnonzero(mask).astype(np.int64)]
    return outs[:ctx.num_outputs]


@register_gradient("BooleanMask")
def _boolean_mask_grad(g: GradientBuilder) -> None:
    g.add("BooleanMaskGradient", [g.I(1), g.GO(0)], [g.GI(0)])


@register_op("BooleanMaskGradient", inputs=2, outputs=1)
def boolean_mask_gradient(ctx: OpContext) -> Outputs:
    """[mask, dOut] -> dData: dOut at the kept rows, 0 elsewhere."""
    mask, dout = ctx.inputs
    mask = np.asarray(mask).reshape(-1).astype(bool)
    out = np.zeros((mask.size, *np.shape(dout)[1:]), dtype=dout.dtype)
    out[mask] = dout
    return (out,)


def _sequence_keep(ctx: OpContext, left: int, right: int) -> Any:
    """[left, right] boolean array of the entries SequenceMask keeps."""
    mode = ctx.str_arg("mode", "sequence")
    cols = np.arange(right)[None, :]
    rows = np.arange(left)[:, None]
    if mode == "sequence":
        lens = _int_array(ctx.inputs[1])
        if lens.size < left:  # Caffe2 reads one length per masked row ("Out of bound.")
            raise ctx.fail(f"Out of bound: sequence_lengths has {lens.size} entries, the "
                           f"masked view has {left} rows")
        return cols < lens[:left, None]
    if mode == "window":
        centers = _int_array(ctx.inputs[1])
        radius = ctx.int_arg("radius", 10)
        return np.abs(cols - centers[:, None]) <= radius
    triangles = {"upper": cols > rows, "lower": cols < rows,
                 "upperdiag": cols >= rows, "lowerdiag": cols <= rows}
    if mode not in triangles:
        raise ctx.fail(f"unknown mode {mode!r}; use sequence, window, upper, lower, "
                       "upperdiag or lowerdiag")
    return ~triangles[mode]


def _mask_axis(ctx: OpContext, name: str, default: int, ndim: int) -> int:
    value = ctx.int_arg(name, default)
    axis = value + ndim if value < 0 else value
    if not 0 <= axis < max(ndim, 1):
        raise ctx.fail(f"{name}={value} is out of range for a {ndim}-D input")
    return axis


def _mask_view(ctx: OpContext, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(blocks, rows, cols, repeat)``: the input seen as [blocks, rows, cols, repeat]; the
    mask is a [rows, cols] pattern applied to every block and repeated entry.  ``batch``
    makes dims 0..batch the blocks; ``repeat_from_axis`` (sequence mode) repeats the mask over
    the trailing dims from that axis."""
    size = lambda dims: int(np.prod(dims, dtype=np.int64))  # noqa: E731
    axis = _mask_axis(ctx, "axis", 1, len(shape))
    blocks, start = 1, 0
    if ctx.has_arg("batch"):
        batch = _mask_axis(ctx, "batch", 0, len(shape))
        if batch >= axis:
            raise ctx.fail(f"batch ({batch}) must come before axis ({axis})")
        blocks, start = size(shape[:batch + 1]), batch + 1
    rows, cols, repeat = size(shape[start:axis]), size(shape[axis:]), 1
    if ctx.has_arg("repeat_from_axis") and ctx.str_arg("mode", "sequence") == "sequence":
        if ctx.has_arg("batch"):
            raise ctx.fail("repeat_from_axis is only supported without the batch argument")
        repeat = size(shape[_mask_axis(ctx, "repeat_from_axis", -1, len(shape)):])
        cols = cols // repeat if repeat else 0
    return blocks, rows, cols, repeat


@register_op("SequenceMask", inputs=(1, 2), outputs=1)
def sequence_mask(ctx: OpContext) -> Outputs:
    """[input(, lengths or window centers)] -> input with masked entries set to fill_val.

    The input is viewed as [prod(dims[:axis]), prod(dims[axis:])] (with ``batch``: each of
    the prod(dims[:batch + 1]) blocks as [prod(dims[batch + 1:axis]), prod(dims[axis:])]);
    ``grad=1`` fills with 0.
    """
    x = np.asarray(ctx.inputs[0])
    blocks, rows, cols, repeat = _mask_view(ctx, x.shape)
    keep = _sequence_keep(ctx, rows, cols)
    fill = 0.0 if ctx.int_arg("grad", 0) else ctx.float_arg("fill_val", -np.inf)
    view = x.reshape(blocks, rows, cols, repeat)
    out = np.where(keep[None, :, :, None], view, np.asarray(fill, dtype=x.dtype))
    return (out.reshape(x.shape),)


@register_gradient("SequenceMask", copy_arguments=False)
def _sequence_mask_grad(g: GradientBuilder) -> None:
    inputs = [g.GO(0)] + list(g.op.input[1:])
    op = g.add("SequenceMask", inputs, [g.GI(0)])
    op.arg.extend(g.op.arg)
    op.arg.append(MakeArgument("grad", 1))


@register_op("BatchBucketOneHot", inputs=3, outputs=1)
def batch_bucket_one_hot(ctx: OpContext) -> Outputs:
    """[X (N×D), LENS (D), BOUNDARIES (ΣLENS)] -> one-hot buckets, LENS[j] + 1 per feature.

    Feature j's bucket is the number of its boundaries strictly below the value.
    """
    x, lens, bounds = ctx.inputs
    lens = _int_array(lens)
    x2 = np.asarray(x).reshape(np.shape(x)[0], -1)
    bounds = np.asarray(bounds).reshape(-1)
    if lens.size != x2.shape[1] or int(lens.sum()) != bounds.size:
        raise ctx.fail(f"LENS must have {x2.shape[1]} entries summing to {bounds.size}")
    out = np.zeros((x2.shape[0], int(lens.sum()) + lens.size), dtype=x2.dtype)
    starts = np.r_[0, np.cumsum(lens)]
    for j in range(lens.size):  # one vectorised search per feature column
        bucket = np.searchsorted(bounds[starts[j]:starts[j + 1]], x2[:, j], side="left")
        out[np.arange(x2.shape[0]), starts[j] + j + bucket] = 1
    return (out,)


# Caffe2's NO_GRADIENT (its NO_GRADIENT(BucketBatchOneHot) names no registered op, so
# BatchBucketOneHot stays without a gradient maker there too).
for _type in ("OneHot", "SegmentOneHot", "BatchOneHot"):
    register_gradient(_type)(no_gradient)


def _batch_positions(ctx: OpContext, lengths: Any, indices: Any, width: int) -> tuple:
    seg, lens = _segment_ids(ctx, lengths, np.size(indices))
    cols = _int_array(indices)
    if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= width):
        raise ctx.fail(f"indices must lie in [0, {width})")
    return seg, cols, lens.size


@register_op("BatchSparseToDense", inputs=(3, 4), outputs=1)
def batch_sparse_to_dense(ctx: OpContext) -> Outputs:
    """[LENGTHS, INDICES, VALUES(, DATA_TO_INFER_DIM)] -> N×dense_last_dim rows, VALUES placed
    at INDICES within each row and ``default_value`` elsewhere."""
    lengths, indices, values = ctx.inputs[:3]
    if len(ctx.inputs) > 3:
        width = int(np.shape(ctx.inputs[3])[1])
    else:
        width = ctx.int_arg("dense_last_dim", -1)
        if width < 0:
            raise ctx.fail("give 'dense_last_dim' or a DATA_TO_INFER_DIM input")
    seg, cols, rows = _batch_positions(ctx, lengths, indices, width)
    values = np.asarray(values).reshape(-1)
    out = np.full((rows, width), ctx.float_arg("default_value", 0.0), dtype=values.dtype)
    out[seg, cols] = values
    return (out,)


@register_gradient("BatchSparseToDense")
def _batch_sparse_to_dense_grad(g: GradientBuilder) -> None:
    g.add("BatchDenseToSparse", [g.I(0), g.I(1), g.GO(0)], [g.GI(2)])


@register_op("BatchDenseToSparse", inputs=3, outputs=1)
def batch_dense_to_sparse(ctx: OpContext) -> Outputs:
    """[LENGTHS, INDICES, DENSE] -> the DENSE values at INDICES of each row (inverse of
    BatchSparseToDense)."""
    lengths, indices, dense = ctx.inputs
    seg, cols, rows = _batch_positions(ctx, lengths, indices, dense.shape[1])
    if rows != dense.shape[0]:
        raise ctx.fail(f"LENGTHS has {rows} rows but DENSE has {dense.shape[0]}")
    return (dense[seg, cols],)


@register_gradient("BatchDenseToSparse")
def _batch_dense_to_sparse_grad(g: GradientBuilder) -> None:
    """Caffe2's: scatter the values' gradient back into DENSE's shape (zeros elsewhere)."""
    g.add("BatchSparseToDense", [g.I(0), g.I(1), g.GO(0), g.I(2)], [g.GI(2)])


# --- LengthsMax --------------------------------------------------------------------------------
@register_op("LengthsMax", inputs=2, outputs=1, shape=_lengths_shape)
def lengths_max(ctx: OpContext) -> Outputs:
    """[DATA, LENGTHS] -> element-wise max of consecutive row segments (0 for empty ones)."""
    data, lengths = ctx.inputs
    data = host(data)
    if data.ndim < 1:
        raise ctx.fail("DATA must have at least one dimension (segments run over rows)")
    _, lens = _segment_ids(ctx, lengths, data.shape[0])
    out = np.zeros((lens.size, *data.shape[1:]), dtype=data.dtype)
    nonempty = lens > 0
    if nonempty.any():
        starts = (np.cumsum(lens) - lens)[nonempty]
        out[nonempty] = np.maximum.reduceat(data, starts, axis=0)
    return (out,)


@register_gradient("LengthsMax")
def _lengths_max_grad(g: GradientBuilder) -> None:
    g.add("LengthsMaxWithMainInputAndForwardOutputGradient",
          [g.O(0), g.GO(0), g.I(1), g.I(0)], [g.GI(0)])


@register_op("LengthsMaxWithMainInputAndForwardOutputGradient", inputs=4, outputs=1)
def lengths_max_with_main_input_and_forward_output_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY, LENGTHS, DATA] -> dDATA: each row gets its segment's dY where it equals the
    segment max (every tied row does, as in Caffe2), 0 elsewhere."""
    out, dout, lengths, data = (host(v) for v in ctx.inputs)
    seg, lens = _segment_ids(ctx, lengths, data.shape[0])
    if out.shape != (lens.size, *data.shape[1:]) or dout.shape != out.shape:
        raise ctx.fail(f"Y {out.shape} and dY {dout.shape} must be {(lens.size, *data.shape[1:])}")
    hit = data == out[seg]
    return (np.where(hit, dout[seg], 0).astype(dout.dtype, copy=False),)
