"""Variable-length sequence operators: paddings, packing, ragged gathers and id-list merges.

Ragged data follows Caffe2's convention: a ``DATA`` blob whose first dimension concatenates
segments and a 1-D ``LENGTHS`` blob with each segment's row count.  The kernels turn lengths
into index arrays once and then move whole rows with vectorised numpy indexing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, INT32, host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


# --- helpers ---------------------------------------------------------------------------------
def _lengths(ctx: OpContext, value: Any, what: str = "lengths") -> np.ndarray:
    """A 1-D int64 copy of a lengths blob; every entry must be >= 0."""
    lens = host(value).reshape(-1).astype(np.int64)
    if lens.size and int(lens.min()) < 0:
        raise ctx.fail(f"{what} must be non-negative, got {lens.tolist()}")
    return lens


def _check_total(ctx: OpContext, lens: np.ndarray, rows: int, what: str = "data") -> None:
    if int(lens.sum()) != rows:
        raise ctx.fail(f"lengths sum to {int(lens.sum())} but {what} has {rows} rows; make "
                       "LENGTHS describe every row of the data")


def _offsets(lens: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: where each segment starts."""
    return np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64) if lens.size else lens


def _segment_positions(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row of the concatenated data: (segment id, position inside the segment)."""
    seg = np.repeat(np.arange(lens.size), lens)
    pos = np.arange(seg.size) - np.repeat(_offsets(lens), lens)
    return seg, pos


def _ranges_index(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every (start, length) pair."""
    _, pos = _segment_positions(lens)
    return np.repeat(starts.astype(np.int64), lens) + pos


# --- AddPadding / RemovePadding / GatherPadding ----------------------------------------------
def _pad_widths(ctx: OpContext) -> tuple[int, int]:
    start = ctx.int_arg("padding_width", 1)
    end = ctx.int_arg("end_padding_width", -1)
    end = start if end < 0 else end
    if start < 0:
        raise ctx.fail(f"padding_width must be >= 0, got {start}")
    return start, end


def _padded_layout(lens: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """Row indices, in the padded tensor, of the data rows, start pads and end pads."""
    seg, _ = _segment_positions(lens)
    data_rows = np.arange(seg.size) + seg * (start + end) + start
    out_starts = _offsets(lens + start + end)
    start_rows = (out_starts[:, None] + np.arange(start)).reshape(-1)
    end_rows = (out_starts[:, None] + start + lens[:, None] + np.arange(end)).reshape(-1)
    return data_rows, start_rows, end_rows


def _optional_lengths(ctx: OpContext, rows: int) -> tuple[np.ndarray, Any]:
    """LENGTHS (input 1) when given, else one segment covering every row."""
    if ctx.num_inputs > 1:
        return _lengths(ctx, ctx.inputs[1]), host(ctx.inputs[1]).dtype
    return np.array([rows], np.int64), np.int32


@register_op("AddPadding", inputs=(1, 4), outputs=(1, 2))
def add_padding(ctx: OpContext) -> Outputs:
    """[data, lengths?, start_padding?, end_padding?] -> [padded(, padded_lengths)].

    Every segment gets ``padding_width`` copies of ``start_padding`` in front and
    ``end_padding_width`` (default: ``padding_width``) copies of ``end_padding`` (default:
    ``start_padding``) behind; paddings default to zeros.
    """
    data = host(ctx.inputs[0])
    start, end = _pad_widths(ctx)
    lens, lens_dtype = _optional_lengths(ctx, data.shape[0] if data.ndim else 1)
    if start == 0 and end == 0:
        outs = [data.copy(), host(ctx.inputs[1]).copy() if ctx.num_inputs > 1 else
                lens.astype(lens_dtype)]
        return outs[:ctx.num_outputs]
    _check_total(ctx, lens, data.shape[0])
    block = data.shape[1:]
    pad_start = (host(ctx.inputs[2]) if ctx.num_inputs > 2 else np.zeros(block, data.dtype))
    pad_end = host(ctx.inputs[3]) if ctx.num_inputs > 3 else pad_start
    out = np.empty((data.shape[0] + lens.size * (start + end), *block), data.dtype)
    data_rows, start_rows, end_rows = _padded_layout(lens, start, end)
    out[data_rows] = data
    out[start_rows] = np.broadcast_to(pad_start, block)
    out[end_rows] = np.broadcast_to(pad_end, block)
    outs = [out, (lens + start + end).astype(lens_dtype)]
    return outs[:ctx.num_outputs]


@register_gradient("AddPadding")
def _add_padding_grad(g: GradientBuilder) -> None:
    g_inputs = [g.GO(0)]
    if len(g.op.input) > 1:
        g_inputs.append(g.O(1))
    g.add("RemovePadding", g_inputs, [g.GI(0)])
    if len(g.op.input) >= 3:
        padding_grads = [g.GI(2)] + ([g.GI(3)] if len(g.op.input) == 4 else [])
        g.add("GatherPadding", g_inputs, padding_grads)


@register_op("RemovePadding", inputs=(1, 2), outputs=(1, 2))
def remove_padding(ctx: OpContext) -> Outputs:
    """[padded, padded_lengths?] -> [data(, lengths)]: drop each segment's padding rows."""
    data = host(ctx.inputs[0])
    start, end = _pad_widths(ctx)
    lens, lens_dtype = _optional_lengths(ctx, data.shape[0] if data.ndim else 1)
    if start == 0 and end == 0:
        outs = [data.copy(), host(ctx.inputs[1]).copy() if ctx.num_inputs > 1 else
                lens.astype(lens_dtype)]
        return outs[:ctx.num_outputs]
    _check_total(ctx, lens, data.shape[0])
    inner = lens - start - end
    if inner.size and int(inner.min()) < 0:
        raise ctx.fail(f"a segment is shorter than its padding ({start} + {end} rows)")
    data_rows, _, _ = _padded_layout(inner, start, end)
    outs = [data[data_rows], inner.astype(lens_dtype)]
    return outs[:ctx.num_outputs]


@register_gradient("RemovePadding")
def _remove_padding_grad(g: GradientBuilder) -> None:
    g_inputs = [g.GO(0)]
    if len(g.op.input) > 1:
        g_inputs.append(g.O(1))
    g.add("AddPadding", g_inputs, [g.GI(0)])


@register_op("GatherPadding", inputs=(1, 2), outputs=(1, 2))
def gather_padding(ctx: OpContext) -> Outputs:
    """[padded, padded_lengths?] -> [start_padding_sum(, end_padding_sum)].

    Sums the padding rows over all segments; with one output the end padding is added to it.
    """
    data = host(ctx.inputs[0])
    start, end = _pad_widths(ctx)
    if start == 0 and end == 0:
        return [np.zeros((), np.int64) for _ in range(ctx.num_outputs)]
    lens, _ = _optional_lengths(ctx, data.shape[0])
    _check_total(ctx, lens, data.shape[0])
    inner = lens - start - end
    if inner.size and int(inner.min()) < 0:
        raise ctx.fail(f"a segment is shorter than its padding ({start} + {end} rows)")
    _, start_rows, end_rows = _padded_layout(inner, start, end)
    head = data[start_rows].sum(axis=0, dtype=data.dtype)
    tail = data[end_rows].sum(axis=0, dtype=data.dtype)
    if ctx.num_outputs == 1:
        return (head + tail,)
    return head, tail


# --- PackSegments / UnpackSegments -----------------------------------------------------------
def _presence_mask(lens: np.ndarray, width: int) -> np.ndarray:
    """[N, width] bool: True at the first ``lens[i]`` positions of row i."""
    return np.arange(width)[None, :] < lens[:, None]


def _pack(lens: np.ndarray, data: np.ndarray, width: int, fill: float) -> tuple[np.ndarray,
                                                                                np.ndarray]:
    mask = _presence_mask(lens, width)
    out = np.full((lens.size, width, *data.shape[1:]), fill, dtype=data.dtype)
    out[mask] = data
    return out, mask


@register_op("PackSegments", inputs=2, outputs=(1, 2))
def pack_segments(ctx: OpContext) -> Outputs:
    """[lengths, data] -> [packed (N × max_length × ...)(, presence_mask)].

    Pads with 0 (or -inf with ``pad_minf``); ``max_length`` fixes the padded width.
    """
    lens = _lengths(ctx, ctx.inputs[0])
    data = host(ctx.inputs[1])
    if data.ndim < 1:
        raise ctx.fail("data must be at least 1-D")
    _check_total(ctx, lens, data.shape[0])
    width = int(lens.max()) if lens.size else 0
    max_length = ctx.int_arg("max_length", -1)
    if max_length != -1:  # fixed width: longer segments keep their first max_length rows
        if max_length < 0:
            raise ctx.fail(f"max_length must be >= 0 (or -1 for the longest segment), got "
                           f"{max_length}")
        data = data[_kept_rows(lens, max_length)]
        lens, width = np.minimum(lens, max_length), max_length
    fill = -np.inf if ctx.int_arg("pad_minf", 0) else 0
    out, mask = _pack(lens, data, width, fill)
    return [out, mask][:ctx.num_outputs]


def _kept_rows(lens: np.ndarray, max_length: int) -> np.ndarray:
    """Bool per data row: within the first ``max_length`` rows of its segment."""
    starts = np.repeat(np.cumsum(lens) - lens, lens)
    return (np.arange(int(lens.sum())) - starts) < max_length


@register_gradient("PackSegments")
def _pack_segments_grad(g: GradientBuilder) -> None:
    g.add("UnpackSegments", [g.I(0), g.GO(0)], [g.GI(1)])


@register_op("UnpackSegments", inputs=2, outputs=1)
def unpack_segments(ctx: OpContext) -> Outputs:
    """[lengths, packed (N × T × ...)] -> the first lengths[i] rows of each packed[i]."""
    lens = _lengths(ctx, ctx.inputs[0])
    data = host(ctx.inputs[1])
    if data.ndim < 2 or data.shape[0] != lens.size:
        raise ctx.fail(f"packed data {data.shape} must be N × T × ... with N = {lens.size}")
    if ctx.int_arg("max_length", -1) >= 0:  # segments were cut to max_length when packed
        lens = np.minimum(lens, ctx.int_arg("max_length", -1))
    if lens.size and int(lens.max()) > data.shape[1]:
        raise ctx.fail(f"a length exceeds the packed width {data.shape[1]}")
    return (data[_presence_mask(lens, data.shape[1])],)


@register_gradient("UnpackSegments")
def _unpack_segments_grad(g: GradientBuilder) -> None:
    g.add("PackSegments", [g.I(0), g.GO(0)], [g.GI(1)])


# --- PackRNNSequence / UnpackRNNSequence / ReversePackedSegs ---------------------------------
@register_op("PackRNNSequence", inputs=2, outputs=1)
def pack_rnn_sequence(ctx: OpContext) -> Outputs:
    """[values (sum(lengths) × ...), lengths] -> time-major (max_length × N × ...), 0-padded."""
    data = host(ctx.inputs[0])
    lens = _lengths(ctx, ctx.inputs[1])
    _check_total(ctx, lens, data.shape[0])
    width = int(lens.max()) if lens.size else 0
    packed, _ = _pack(lens, data, width, 0)
    return (np.ascontiguousarray(np.swapaxes(packed, 0, 1)),)


@register_gradient("PackRNNSequence")
def _pack_rnn_grad(g: GradientBuilder) -> None:
    g.add("UnpackRNNSequence", [g.GO(0), g.I(1)], [g.GI(0)])


@register_op("UnpackRNNSequence", inputs=2, outputs=1)
def unpack_rnn_sequence(ctx: OpContext) -> Outputs:
    """[values (T × N × ...), lengths] -> the valid steps, batch entry by batch entry."""
    data = host(ctx.inputs[0])
    lens = _lengths(ctx, ctx.inputs[1])
    if data.ndim < 2 or data.shape[1] != lens.size:
        raise ctx.fail(f"values {data.shape} must be T × N × ... with N = {lens.size}")
    if lens.size and int(lens.max()) > data.shape[0]:
        raise ctx.fail(f"a length exceeds the {data.shape[0]} time steps")
    batch_major = np.swapaxes(data, 0, 1)
    return (batch_major[_presence_mask(lens, data.shape[0])],)


@register_gradient("UnpackRNNSequence")
def _unpack_rnn_grad(g: GradientBuilder) -> None:
    g.add("PackRNNSequence", [g.GO(0), g.I(1)], [g.GI(0)])


@register_op("ReversePackedSegs", inputs=2, outputs=1, shape=same_as_input(0))
def reverse_packed_segs(ctx: OpContext) -> Outputs:
    """[data (T × N × ...), lengths (N)] -> each column's first lengths[n] steps reversed."""
    data = host(ctx.inputs[0])
    lens = _lengths(ctx, ctx.inputs[1])
    if data.ndim < 2 or data.shape[1] != lens.size:
        raise ctx.fail(f"data {data.shape} must be T × N × ... with N = {lens.size}")
    if lens.size and int(lens.max()) > data.shape[0]:
        raise ctx.fail(f"a length exceeds the {data.shape[0]} time steps")
    steps = np.arange(data.shape[0])[:, None]
    source = np.where(steps < lens[None, :], lens[None, :] - 1 - steps, steps)
    return (data[source, np.arange(lens.size)[None, :]],)


@register_gradient("ReversePackedSegs")
def _reverse_packed_grad(g: GradientBuilder) -> None:
    g.add("ReversePackedSegs", [g.GO(0), g.I(1)], [g.GI(0)])


# --- LengthsPad / LengthsSplit / LengthsGather -----------------------------------------------
@register_op("LengthsPad", inputs=2, outputs=1)
def lengths_pad(ctx: OpContext) -> Outputs:
    """[data, lengths] -> every segment padded with ``padding_value`` to ``target_length``."""
    data = host(ctx.inputs[0])
    lens = _lengths(ctx, ctx.inputs[1])
    target = ctx.int_arg("target_length", -1)
    if target < 0:
        raise ctx.fail("argument target_length must be set (>= 0)")
    _check_total(ctx, lens, data.shape[0])
    if lens.size and int(lens.max()) > target:
        raise ctx.fail(f"a segment has {int(lens.max())} rows, more than target_length "
                       f"{target}")
    packed, _ = _pack(lens, data, target, ctx.float_arg("padding_value", -1.0))
    return (packed.reshape(lens.size * target, *data.shape[1:]),)


@register_op("LengthsSplit", inputs=(1, 2), outputs=1)
def lengths_split(ctx: OpContext) -> Outputs:
    """[lengths, n_split?] -> each length split into ``n_split`` near-equal parts."""
    lens = _lengths(ctx, ctx.inputs[0])
    if ctx.num_inputs > 1:
        n_split = int(host(ctx.inputs[1]).reshape(-1)[0])
    else:
        n_split = ctx.int_arg("n_split", 1)
    if n_split <= 0:
        raise ctx.fail(f"n_split must be > 0, got {n_split}")
    parts = lens[:, None] // n_split + (np.arange(n_split)[None, :] < lens[:, None] % n_split)
    return (parts.reshape(-1).astype(np.int32),)


@register_op("LengthsGather", inputs=3, outputs=1)
def lengths_gather(ctx: OpContext) -> Outputs:
    """[items, lengths, indices] -> concatenation of the segments picked by ``indices``."""
    items = host(ctx.inputs[0])
    lens = _lengths(ctx, ctx.inputs[1])
    _check_total(ctx, lens, items.shape[0], "items")
    idx = host(ctx.inputs[2]).reshape(-1).astype(np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= lens.size):
        raise ctx.fail(f"indices must lie in [0, {lens.size})")
    rows = _ranges_index(_offsets(lens)[idx], lens[idx])
    return (items[rows],)


# --- LengthsTopK -----------------------------------------------------------------------------
def _lengths_top_k_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[1] is None:
        return [None, None]
    k = int(arguments_dict(op.arg).get("k", -1))
    rows = (shapes[1][0] if shapes[1] else 1, k)
    return [(rows, types[0] or FLOAT), (rows, INT32)]


@register_op("LengthsTopK", inputs=2, outputs=2, shape=_lengths_top_k_shape)
def lengths_top_k(ctx: OpContext) -> Outputs:
    """[X, lengths] -> [values (N × k), indices (N × k)]: each segment's k largest.

    Segments shorter than ``k`` are padded with value 0 and index -1.
    """
    x = host(ctx.inputs[0]).reshape(-1)
    lens = _lengths(ctx, ctx.inputs[1])
    k = ctx.int_arg("k", -1)
    if k <= 0:
        raise ctx.fail(f"argument k must be > 0, got {k}")
    _check_total(ctx, lens, x.size, "X")
    width = max(int(lens.max()) if lens.size else 0, k)
    packed, mask = _pack(lens, x, width, 0)
    rows = np.repeat(np.arange(lens.size), width)
    cols = np.tile(np.arange(width), lens.size)
    order = np.lexsort((cols, -packed.reshape(-1), ~mask.reshape(-1), rows))
    order = order.reshape(lens.size, width)[:, :k] - (np.arange(lens.size) * width)[:, None]
    valid = np.take_along_axis(mask, order, axis=1)
    values = np.where(valid, np.take_along_axis(packed, order, axis=1), 0).astype(x.dtype)
    return values, np.where(valid, order, -1).astype(np.int32)


@register_gradient("LengthsTopK")
def _lengths_top_k_grad(g: GradientBuilder) -> None:
    g.add("LengthsTopKGradient", [g.I(1), g.O(1), g.GO(0)], [g.GI(0)])


@register_op("LengthsTopKGradient", inputs=3, outputs=1)
def lengths_top_k_gradient(ctx: OpContext) -> Outputs:
    """[lengths, indices, dValues] -> dX: dValues scattered back to the picked entries."""
    lens = _lengths(ctx, ctx.inputs[0])
    idx = host(ctx.inputs[1]).astype(np.int64)
    dvalues = host(ctx.inputs[2])
    dx = np.zeros(int(lens.sum()), dtype=dvalues.dtype)
    valid = idx >= 0
    rows = (_offsets(lens)[:, None] + idx)[valid]
    np.add.at(dx, rows, dvalues[valid])
    return (dx,)


# --- GatherRanges / GatherRangesToDense ------------------------------------------------------
def _ranges(ctx: OpContext, value: Any, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths), each of shape ranges.shape[:-1], validated against ``size``."""
    ranges = host(value).astype(np.int64)
    if ranges.ndim < 2 or ranges.shape[-1] != 2:
        raise ctx.fail(f"ranges must have shape (..., 2), got {ranges.shape}")
    starts, lens = ranges[..., 0], ranges[..., 1]
    if lens.size and (int(lens.min()) < 0 or int(starts.min()) < 0
                      or int((starts + lens).max()) > size):
        raise ctx.fail(f"a range falls outside the {size} data entries")
    return starts, lens


@register_op("GatherRanges", inputs=2, outputs=2)
def gather_ranges(ctx: OpContext) -> Outputs:
    """[data (1-D), ranges (N × D × 2: start, length)] -> [gathered, int32 lengths per
    example]."""
    data = host(ctx.inputs[0])
    if data.ndim != 1:
        raise ctx.fail(f"data must be 1-D, got shape {data.shape}")
    starts, lens = _ranges(ctx, ctx.inputs[1], data.size)
    rows = _ranges_index(starts.reshape(-1), lens.reshape(-1))
    return data[rows], lens.reshape(lens.shape[0], -1).sum(axis=1).astype(np.int32)


#: Per-instance key (in the op's own argument dict) of GatherRangesToDense's lifetime counters.
_RANGE_COUNTS = "\0gather_ranges_counts"


class _RangeCounts:
    """Ranges seen, and empty / mismatched ranges per output, over an op instance's life."""

    def __init__(self, outputs: int) -> None:
        self.total = 0
        self.empty = np.zeros(outputs, np.int64)
        self.mismatched = np.zeros(outputs, np.int64)
        self.bad_lengths: list[set[int]] = [set() for _ in range(outputs)]


@register_op("GatherRangesToDense", inputs=(2, 3), outputs=(1, None))
def gather_ranges_to_dense(ctx: OpContext) -> Outputs:
    """[data, ranges (B × J × 2), key?] -> J dense outputs (B × lengths[j]).

    Empty ranges and ranges whose length is not ``lengths[j]`` give zero rows; with ``key``
    each range's values are ordered by key. Over the op's life, more than
    ``max(seen, min_observation) * max_mismatched_ratio`` mismatched (or ``max_empty_ratio``
    empty) ranges of one output is an error, as in Caffe2.
    """
    data = host(ctx.inputs[0])
    starts, lens = _ranges(ctx, ctx.inputs[1], data.size)
    widths = ctx.ints_arg("lengths")
    if starts.ndim != 2 or len(widths) != starts.shape[1] or ctx.num_outputs != len(widths):
        raise ctx.fail(f"ranges {starts.shape + (2,)} need one 'lengths' entry and one output "
                       "per range column")
    if not widths or min(widths) <= 0:
        raise ctx.fail(f"'lengths' must be positive, one per output; got {widths}")
    flat_starts, flat_lens = starts.reshape(-1), lens.reshape(-1)
    gathered = _ranges_index(flat_starts, flat_lens)
    if ctx.num_inputs > 2:
        key = host(ctx.inputs[2]).reshape(-1)
        segment = np.repeat(np.arange(flat_lens.size), flat_lens)
        gathered = gathered[np.lexsort((key[gathered], segment))]
    range_offsets = _offsets(flat_lens).reshape(lens.shape)
    outs = []
    for j, width in enumerate(widths):
        out = np.zeros((starts.shape[0], width), data.dtype)
        full = lens[:, j] == width
        idx = range_offsets[full, j][:, None] + np.arange(width)[None, :]
        out[full] = data[gathered[idx]]
        outs.append(out)
    _check_range_ratios(ctx, lens, widths)
    return outs


def _check_range_ratios(ctx: OpContext, lens: np.ndarray, widths: list[int]) -> None:
    counts = ctx.args.get(_RANGE_COUNTS)
    if counts is None:
        counts = ctx.args[_RANGE_COUNTS] = _RangeCounts(len(widths))
    min_observation = ctx.int_arg("min_observation", 10000)
    if min_observation <= 0:
        raise ctx.fail(f"'min_observation' must be at least 1, got {min_observation}")
    counts.total += lens.shape[0]
    for j, width in enumerate(widths):
        col = lens[:, j]
        bad = (col != 0) & (col != width)
        counts.empty[j] += int((col == 0).sum())
        counts.mismatched[j] += int(bad.sum())
        counts.bad_lengths[j].update(int(v) for v in np.unique(col[bad]))
    allowed = max(counts.total, min_observation)
    limits = (("range length mismatch", counts.mismatched,
               ctx.float_arg("max_mismatched_ratio", 0.01)),
              ("empty ranges", counts.empty, ctx.float_arg("max_empty_ratio", 1.0)))
    for label, seen, ratio in limits:
        if ratio >= 1.0:
            continue
        for j in np.flatnonzero(seen > allowed * ratio):
            detail = (f"; the incorrect lengths include {sorted(counts.bad_lengths[j])}"
                      if label.startswith("range") else "")
            raise ctx.fail(f"ratio of {label} for feature at index {j} is "
                           f"{seen[j] / counts.total:.4g} ({seen[j]}/{counts.total}), which "
                           f"exceeds {ratio}{detail}")


# --- MergeIdLists / RemoveDataBlocks / BooleanUnmask -----------------------------------------
@register_op("MergeIdLists", inputs=(2, None), outputs=2)
def merge_id_lists(ctx: OpContext) -> Outputs:
    """[lengths_0, values_0, lengths_1, values_1, ...] -> [merged_lengths, merged_values].

    Every example's ids from all lists, deduplicated and sorted.
    """
    if ctx.num_inputs % 2:
        raise ctx.fail("inputs must come in (lengths, values) pairs")
    pairs = [(_lengths(ctx, ctx.inputs[i]), host(ctx.inputs[i + 1]).reshape(-1))
             for i in range(0, ctx.num_inputs, 2)]
    batch = pairs[0][0].size
    if any(lens.size != batch for lens, _ in pairs):
        raise ctx.fail("every lengths input must have the same number of examples")
    for lens, values in pairs:
        _check_total(ctx, lens, values.size, "values")
    rows = np.concatenate([np.repeat(np.arange(batch), lens) for lens, _ in pairs])
    values = np.concatenate([v for _, v in pairs])
    order = np.lexsort((values, rows))
    rows, values = rows[order], values[order]
    keep = np.ones(rows.size, bool)
    keep[1:] = (rows[1:] != rows[:-1]) | (values[1:] != values[:-1])
    merged_lengths = np.bincount(rows[keep], minlength=batch).astype(np.int32)
    return merged_lengths, values[keep]


@register_op("RemoveDataBlocks", inputs=2, outputs=1)
def remove_data_blocks(ctx: OpContext) -> Outputs:
    """[data, indices] -> data without the rows at ``indices`` (duplicates allowed)."""
    data = host(ctx.inputs[0])
    indices = host(ctx.inputs[1]).reshape(-1)
    if indices.size and indices.dtype.kind not in "iu":
        raise ctx.fail(f"indices must be integers, got {indices.dtype}")
    idx = np.unique(indices.astype(np.int64))
    if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= data.shape[0]):
        raise ctx.fail(f"indices must lie in [0, {data.shape[0]})")
    return (np.delete(data, idx, axis=0),)


@register_op("BooleanUnmask", inputs=(2, None), outputs=1)
def boolean_unmask(ctx: OpContext) -> Outputs:
    """[mask_0, values_0, mask_1, values_1, ...] -> output with output[mask_i] = values_i.

    The masks must together cover every position exactly once.
    """
    if ctx.num_inputs % 2:
        raise ctx.fail("inputs must come in (mask, values) pairs")
    masks = [host(ctx.inputs[i]).reshape(-1).astype(bool) for i in range(0, ctx.num_inputs, 2)]
    values = [host(ctx.inputs[i]).reshape(-1) for i in range(1, ctx.num_inputs, 2)]
    size = masks[0].size
    if any(m.size != size for m in masks):
        raise ctx.fail("all masks must have the same size")
    cover = np.sum(masks, axis=0)
    if np.any(cover != 1):
        raise ctx.fail("every position must be set by exactly one mask")
    out = np.empty(size, dtype=values[0].dtype)
    for mask, vals in zip(masks, values):
        if int(mask.sum()) != vals.size:
            raise ctx.fail(f"a mask selects {int(mask.sum())} entries for {vals.size} values")
        out[mask] = vals
    return (out,)
