"""Recommendation-system data ops: row copies, sample padding, key splits, n-grams,
partitions by key and weighted sampling.

* ``CopyRowsToTensor`` (in place) and its pass-through gradient;
* ``DataCouple``: outputs are its inputs (ties blobs into one data dependency);
* ``PadEmptySamples``: an empty sample gets one zero row in every feature;
* ``KeySplit``: positions of each key value;
* ``NGramFromCategorical``: mixed-radix code of several categorical columns;
* ``Partition`` / ``LengthsPartition`` / ``GatherByKey``: shard rows by ``key mod P``;
* ``WeightedSample``: one index per row, drawn with probability proportional to its weight.
* ``WeightedMultiSampling``: indices drawn from a 1-D CDF (``num_samples`` or a shape input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host, like_inputs, out_buffer
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

_MAX = 4096


def _array(ctx: OpContext, index: int) -> np.ndarray:
    return np.asarray(host(ctx.inputs[index]))


def _integers(ctx: OpContext, index: int, what: str) -> np.ndarray:
    value = _array(ctx, index)
    if value.dtype.kind not in "iu":
        raise ctx.fail(f"{what} {ctx.input_name(index)!r} must be int32 or int64, got "
                       f"{value.dtype}")
    return value


def _check_inplace(ctx: OpContext, pairs: int) -> None:
    for i in range(pairs):
        if ctx.op.input[i] != ctx.op.output[i]:
            raise ctx.fail(f"{ctx.op.type} works in place: output {i} must be input {i} "
                           f"({ctx.input_name(i)!r}), got {ctx.output_name(i)!r}")


# --- CopyRowsToTensor -------------------------------------------------------------------------
@register_op("CopyRowsToTensor", inputs=3, outputs=1, inplace=[(0, 0)], shape=like_inputs(0))
def copy_rows_to_tensor(ctx: OpContext) -> Outputs:
    """[X (2-D), indices, row] -> X with ``X[indices] = row`` (in place)."""
    _check_inplace(ctx, 1)
    x, row = _array(ctx, 0), _array(ctx, 2)
    indices = _integers(ctx, 1, "indices")
    if x.ndim != 2:
        raise ctx.fail(f"INPUT_TENSOR should be 2-d, got shape {x.shape}")
    if indices.ndim != 1:
        raise ctx.fail(f"INDICES should be 1-d, got shape {indices.shape}")
    if row.ndim != 1:
        raise ctx.fail(f"ROW should be 1-d, got shape {row.shape}")
    if row.shape[0] != x.shape[1]:
        raise ctx.fail(f"width of input tensor should match lengths of row: {x.shape[1]} vs "
                       f"{row.shape[0]}")
    if indices.size and (indices.min() < 0 or indices.max() >= x.shape[0]):
        raise ctx.fail(f"indices must lie in [0, {x.shape[0]}), got "
                       f"[{indices.min()}, {indices.max()}]")
    out = out_buffer(ctx, 0, 0)
    if out is not x:
        np.copyto(out, x)
    out[indices] = row.astype(x.dtype, copy=False)
    return (out,)


@register_op("CopyRowsToTensorGradient", inputs=1, outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def copy_rows_to_tensor_gradient(ctx: OpContext) -> Outputs:
    """dY -> dX = dY (Caffe2 passes the gradient through unchanged)."""
    value = _array(ctx, 0)
    return (value if ctx.op.input[0] == ctx.op.output[0] else value.copy(),)


@register_gradient("CopyRowsToTensor")
def _copy_rows_to_tensor_gradient(g: GradientBuilder) -> None:
    if g.go_is_sparse(0):
        g.add("CopyRowsToTensorGradient", [g.GO_I(0)], [g.GI_I(0)])
        g.add("CopyRowsToTensorGradient", [g.GO_V(0)], [g.GI_V(0)])
    else:
        g.add("CopyRowsToTensorGradient", [g.GO(0)], [g.GI(0)])


# --- DataCouple --------------------------------------------------------------------------------
@register_op("DataCouple", inputs=(0, None), outputs=(0, None),
             inplace=[(i, i) for i in range(_MAX)])
def data_couple(ctx: OpContext) -> Outputs:
    """[X_0, ..., X_n] -> [X_0, ..., X_k] unchanged, each output in place on its input."""
    if ctx.num_outputs > ctx.num_inputs:
        raise ctx.fail(f"takes at least as many inputs as outputs, got {ctx.num_inputs} "
                       f"inputs and {ctx.num_outputs} outputs")
    _check_inplace(ctx, ctx.num_outputs)
    return tuple(ctx.inputs[:ctx.num_outputs])


# --- PadEmptySamples --------------------------------------------------------------------------
@register_op("PadEmptySamples", inputs=(1, None), outputs=(1, None))
def pad_empty_samples(ctx: OpContext) -> Outputs:
    """[lengths, F_1, ...] -> [lengths', F_1', ...]: every sample of length 0 gets length 1
    and one zero row (b"" for strings) in each feature, at its place."""
    if ctx.num_outputs != ctx.num_inputs:
        raise ctx.fail(f"needs one output per input ({ctx.num_inputs}), got "
                       f"{ctx.num_outputs}")
    lengths = _integers(ctx, 0, "lengths")
    if lengths.ndim != 1:
        raise ctx.fail(f"LENGTH should be 1-D, got shape {lengths.shape}")
    lengths = lengths.astype(np.int64)
    if lengths.size and lengths.min() < 0:
        raise ctx.fail("lengths must be >= 0")
    empty = lengths == 0
    total = int(lengths.sum())
    # position of each source row in the padded output, and of each padding row
    out_lengths = np.where(empty, 1, lengths)
    starts = np.cumsum(out_lengths) - out_lengths
    pad_rows = starts[empty]
    src_rows = np.setdiff1d(np.arange(int(out_lengths.sum())), pad_rows, assume_unique=True)
    outs: list[Any] = [out_lengths.astype(np.int32)]
    for k in range(1, ctx.num_inputs):
        features = _array(ctx, k)
        if features.ndim < 1 or features.shape[0] != total:
            raise ctx.fail(f"FEATURE and LENGTH should be consistent: {ctx.input_name(k)!r} "
                           f"has shape {features.shape}, the lengths sum to {total}")
        fill = b"" if features.dtype == object else 0
        out = np.full((total + int(empty.sum()),) + features.shape[1:], fill, features.dtype)
        out[src_rows] = features
        outs.append(out)
    return outs


# --- KeySplit ---------------------------------------------------------------------------------
@register_op("KeySplit", inputs=1, outputs=(1, None))
def key_split(ctx: OpContext) -> Outputs:
    """keys in [0, categorical_limit) -> output k: the positions (int32) holding key k."""
    limit = ctx.int_arg("categorical_limit", 0)
    if limit <= 0:
        raise ctx.fail(f"argument 'categorical_limit' must be > 0, got {limit}")
    if ctx.num_outputs != limit:
        raise ctx.fail(f"needs one output per category ({limit}), got {ctx.num_outputs}")
    keys = _integers(ctx, 0, "keys").reshape(-1)
    if keys.size and (keys.min() < 0 or keys.max() >= limit):
        raise ctx.fail(f"keys must lie in [0, {limit}), got [{keys.min()}, {keys.max()}]")
    order = np.argsort(keys, kind="stable").astype(np.int32)
    counts = np.bincount(keys, minlength=limit)
    return np.split(order, np.cumsum(counts)[:-1])


# --- NGramFromCategorical ---------------------------------------------------------------------
def _ngram_tables(ctx: OpContext) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per column: (column id, sorted category values, their code ``m * base``)."""
    col_ids = ctx.ints_arg("col_ids")
    limits = ctx.ints_arg("categorical_limits")
    vals = ctx.ints_arg("vals")
    if not col_ids:
        raise ctx.fail("argument 'col_ids' must name at least one column")
    if len(limits) != len(col_ids):
        raise ctx.fail(f"'categorical_limits' needs one entry per column ({len(col_ids)}), "
                       f"got {len(limits)}")
    if any(limit <= 0 for limit in limits):
        raise ctx.fail(f"'categorical_limits' must be > 0, got {limits}")
    if sum(limits) != len(vals):
        raise ctx.fail(f"'vals' must hold sum(categorical_limits) = {sum(limits)} values, "
                       f"got {len(vals)}")
    if min(col_ids) < 0:
        raise ctx.fail(f"'col_ids' must be >= 0, got {col_ids}")
    tables, base, offset = [], 1, 0
    for column, limit in zip(col_ids, limits):
        codes = {v: m * base for m, v in enumerate(vals[offset:offset + limit])}  # last wins
        keys = np.array(sorted(codes), dtype=np.int64)
        tables.append((column, keys, np.array([codes[k] for k in keys], dtype=np.int64)))
        base *= limit
        offset += limit
    return tables


@register_op("NGramFromCategorical", inputs=1, outputs=1)
def ngram_from_categorical(ctx: OpContext) -> Outputs:
    """floats [N, D] -> int64 [N]: sum over columns k of ``code_k(round(x[:, col_ids[k]]))``,
    where the m-th value of column k codes ``m * prod(categorical_limits[:k])`` and an
    unknown value codes 0."""
    tables = _ngram_tables(ctx)
    floats = _array(ctx, 0)
    if floats.ndim < 1:
        raise ctx.fail("floats must have at least one dimension")
    flat = floats.reshape(floats.shape[0], -1)
    if flat.shape[1] <= max(t[0] for t in tables):
        raise ctx.fail(f"floats have {flat.shape[1]} columns, col_ids need "
                       f"{max(t[0] for t in tables) + 1}")
    out = np.zeros(flat.shape[0], np.int64)
    for column, keys, codes in tables:
        x = flat[:, column].astype(np.float64)
        rounded = (np.sign(x) * np.floor(np.abs(x) + 0.5)).astype(np.int64)  # C round()
        pos = np.minimum(np.searchsorted(keys, rounded), keys.size - 1)
        out += np.where(keys[pos] == rounded, codes[pos], 0)
    return (out,)


# --- Partition / LengthsPartition / GatherByKey -----------------------------------------------
def _shards(ctx: OpContext, index: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    keys = _array(ctx, index)
    if keys.dtype not in (np.int32, np.int64):
        raise ctx.fail(f"the keys {ctx.input_name(index)!r} must be int32 or int64, got "
                       f"{keys.dtype}")
    return keys, (keys.reshape(-1) % parts).astype(np.int64)


def _partition(ctx: OpContext, first: int) -> list[Any]:
    """Shard inputs ``first..`` by ``input[first] mod P``; outputs in Caffe2's order
    ``X_0_part_0, X_1_part_0, ..., X_n_part_P-1`` (slots of inputs before ``first`` are
    left as None)."""
    n = ctx.num_inputs
    if ctx.num_outputs % n:
        raise ctx.fail(f"Output number must be a multiple of input number ({n}), got "
                       f"{ctx.num_outputs}")
    parts = ctx.num_outputs // n
    keys, shards = _shards(ctx, first, parts)
    order = np.argsort(shards, kind="stable")
    bounds = np.cumsum(np.bincount(shards, minlength=parts))[:-1]
    outs: list[Any] = [None] * ctx.num_outputs
    for i in range(first, n):
        value = _array(ctx, i)
        if value.shape[:keys.ndim] != keys.shape:
            raise ctx.fail(f"Prefix of extra input's shape must match main input's shape, "
                           f"input: {i} ({ctx.input_name(i)!r} {value.shape} vs keys "
                           f"{keys.shape})")
        rows = value.reshape((keys.size,) + value.shape[keys.ndim:])
        if i == first and ctx.int_arg("pack_first_input", 0):
            rows = (rows - shards.astype(rows.dtype)) // parts
        for p, chunk in enumerate(np.split(rows[order], bounds)):
            outs[p * n + i] = chunk
    return outs


@register_op("Partition", inputs=(1, None), outputs=(1, None))
def partition(ctx: OpContext) -> Outputs:
    """[keys, X_1, ...] -> per partition p, the rows whose key mod P is p (in order);
    ``pack_first_input=1`` writes keys as ``key div P``."""
    return _partition(ctx, 0)


@register_op("LengthsPartition", inputs=(2, None), outputs=(1, None))
def lengths_partition(ctx: OpContext) -> Outputs:
    """[lengths, keys (1-D), X_1, ...] -> as Partition on keys and X, plus per partition the
    number of each segment's keys that went there."""
    n = ctx.num_inputs
    if ctx.num_outputs % n:
        raise ctx.fail(f"Output number must be a multiple of input number ({n}), got "
                       f"{ctx.num_outputs}")
    parts = ctx.num_outputs // n
    if _array(ctx, 1).ndim != 1:
        raise ctx.fail("Only 1-D tensors supported as a partitioning tensor for sharding")
    lengths = _integers(ctx, 0, "lengths").reshape(-1).astype(np.int64)
    _, shards = _shards(ctx, 1, parts)
    if lengths.size and lengths.min() < 0 or int(lengths.sum()) != shards.size:
        raise ctx.fail(f"Total length is not matching to the number of elements: lengths "
                       f"sum to {int(lengths.sum())}, keys hold {shards.size}")
    if parts == 1:
        return [_array(ctx, i).copy() for i in range(n)]
    outs = _partition(ctx, 1)
    segment = np.repeat(np.arange(lengths.size), lengths)
    counts = np.zeros((parts, lengths.size), np.int32)
    np.add.at(counts, (shards, segment), 1)
    for p in range(parts):
        outs[p * n] = counts[p]
    return outs


@register_op("GatherByKey", inputs=(2, None), outputs=1)
def gather_by_key(ctx: OpContext) -> Outputs:
    """[keys (1-D), part_0, ..., part_P-1] -> the rows back in key order: the inverse of
    Partition."""
    parts = ctx.num_inputs - 1
    keys, shards = _shards(ctx, 0, parts)
    if keys.ndim != 1:
        raise ctx.fail(f"Only 1D keys tensor supported currently, got shape {keys.shape}")
    values = [_array(ctx, i + 1) for i in range(parts)]
    first = values[0]
    if first.ndim < 1:
        raise ctx.fail("the sharded values must have at least one dimension")
    counts = np.bincount(shards, minlength=parts)
    for p, value in enumerate(values):
        if value.dtype != first.dtype or value.shape[1:] != first.shape[1:]:
            raise ctx.fail(f"every shard must have {first.dtype} rows of shape "
                           f"{first.shape[1:]}; {ctx.input_name(p + 1)!r} is {value.dtype} "
                           f"{value.shape}")
        if value.shape[0] != counts[p]:
            raise ctx.fail(f"shard {p} ({ctx.input_name(p + 1)!r}) has {value.shape[0]} rows "
                           f"but {counts[p]} keys map to it")
    out = np.empty((keys.size,) + first.shape[1:], first.dtype)
    for p, value in enumerate(values):
        out[shards == p] = value
    return (out,)


@register_gradient("GatherByKey")
def _gather_by_key_gradient(g: GradientBuilder) -> None:
    pack = g.arg("pack_first_input", 0)
    count = len(g.op.input)
    if g.go_is_sparse(0):
        outs = [name for i in range(1, count)
                for name in ("_" + g.GI_I(i) + "_keys", g.GI_I(i), g.GI_V(i))]
        g.add("Partition", [g.I(0), g.GO_I(0), g.GO_V(0)], outs, pack_first_input=pack)
    else:
        outs = [name for i in range(1, count) for name in ("_" + g.GI(i) + "_keys", g.GI(i))]
        g.add("Partition", [g.I(0), g.GO(0)], outs, pack_first_input=pack)


# --- WeightedSample ---------------------------------------------------------------------------
@register_op("WeightedMultiSampling", inputs=(1, 2), outputs=1)
def weighted_multi_sampling(ctx: OpContext) -> Outputs:
    """[cdf (1-D), shape?] -> int32 indices: ``num_samples`` draws (or one per element of the
    shape input, in its shape) of ``lower_bound(cdf, U[0, cdf[-1]))``."""
    cdf = _array(ctx, 0)
    if cdf.ndim != 1:
        raise ctx.fail(f"the input should be a 1-D CDF vector, got shape {cdf.shape}")
    if ctx.num_inputs == 2:
        if ctx.has_arg("num_samples"):
            raise ctx.fail("the shape is given by the input blob; do not pass the argument "
                           "'num_samples' as well")
        shape = tuple(np.shape(ctx.inputs[1]))
    else:
        count = ctx.int_arg("num_samples", 0)
        if count < 0:
            raise ctx.fail(f"'num_samples' must be >= 0, got {count}")
        shape = (count,)
    if cdf.size == 0:
        return (np.zeros(0, np.int32),)
    cdf = cdf.astype(np.float32, copy=False)
    draws = ctx.rng.random(int(np.prod(shape)), dtype=np.float32) * cdf[-1]
    index = np.searchsorted(cdf, draws, side="left")
    if index.size and index.max() >= cdf.size:
        raise ctx.fail(f"cannot find {draws[index.argmax()]} in the input CDF")
    return (index.astype(np.int32).reshape(shape),)


@register_op("WeightedSample", inputs=(1, 2), outputs=(1, 2))
def weighted_sample(ctx: OpContext) -> Outputs:
    """[weights [B, D], values [B, D]?] -> [index (int32 [B, 1]), value (float [B, 1])?]:
    per row, index j drawn with probability weights[j] / sum(weights)."""
    if ctx.num_inputs != ctx.num_outputs:
        raise ctx.fail("The number of tensors of the input and the output must be the same.")
    weights = _array(ctx, 0)
    if weights.ndim != 2:
        raise ctx.fail(f"the sampling weights must be 2-D [batch, weights], got shape "
                       f"{weights.shape}")
    batch, width = weights.shape
    if batch == 0 or width == 0:
        return [np.zeros(0, np.int32), np.zeros(0, np.float32)][:ctx.num_outputs]
    weights = weights.astype(np.float32, copy=False)
    if not np.all(weights >= 0):
        raise ctx.fail("All weights must be non-negative numbers.")
    cum = np.cumsum(weights, axis=1, dtype=np.float32)
    draw = (ctx.rng.random(batch, dtype=np.float32) * cum[:, -1]).astype(np.float32)
    cum[:, -1] += np.float32(0.01)  # Caffe2's slack against rounding
    index = (cum < draw[:, None]).sum(axis=1)  # lower_bound
    outs: list[Any] = [index.astype(np.int32).reshape(batch, 1)]
    if ctx.num_inputs == 2:
        values = _array(ctx, 1)
        if values.shape != weights.shape:
            raise ctx.fail(f"The sampling weights tensor and the sampling values tensor must "
                           f"have the same dimensions: {weights.shape} vs {values.shape}")
        picked = values[np.arange(batch), index].astype(np.float32)
        outs.append(picked.reshape(batch, 1))
    return outs


# --- Caffe2's NO_GRADIENT ---------------------------------------------------------------------
def _no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _type in ("NGramFromCategorical", "Partition", "LengthsPartition", "WeightedMultiSampling"):
    register_gradient(_type)(_no_gradient)
