"""Feature-map merging: many single- or multi-feature tensors into one multi-feature tensor.

A *single* feature is one blob (scalar), ``lengths``/``values`` (list) or
``lengths``/``keys``/``values`` (map), plus a bool ``presence`` per example.  A *multi*
feature is ``lengths`` (features per example), int64 ``keys`` (feature ids) and the values at
the key level (scalar) or ``values.lengths`` plus the nested values (list/map).

Every Merge* op writes, for each example in turn, the contribution of input 1, then of
input 2, ...: the output is the concatenation of the inputs' elements reordered by
(example, input), which :func:`_interleave` computes once as a stable permutation.  The
gradient ops apply the inverse permutation to the values' gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


# --- input checks ----------------------------------------------------------------------------
def _group_count(ctx: OpContext, group: int, extra: int = 0) -> int:
    """The number of features when the op takes ``group`` blobs per feature (+ ``extra``)."""
    body = ctx.num_inputs - extra
    if body < group or body % group:
        raise ctx.fail(f"{ctx.op.type} takes {group} blobs per feature"
                       f"{' plus the gradient' if extra else ''}; got {ctx.num_inputs} inputs")
    return body // group


def _lengths(ctx: OpContext, index: int, size: int | None = None) -> np.ndarray:
    value = np.asarray(host(ctx.inputs[index]))
    if value.dtype.kind not in "iu":
        raise ctx.fail(f"{ctx.input_name(index)!r} holds lengths and must be int32, got "
                       f"{value.dtype}")
    value = value.reshape(-1).astype(np.int64)
    if value.size and value.min() < 0:
        raise ctx.fail(f"{ctx.input_name(index)!r} holds a negative length")
    if size is not None and value.size != size:
        raise ctx.fail(f"{ctx.input_name(index)!r} must hold one length per example "
                       f"({size}), got {value.size}")
    return value


def _presence(ctx: OpContext, index: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    value = np.asarray(host(ctx.inputs[index]))
    if value.dtype != np.bool_:
        raise ctx.fail(f"{ctx.input_name(index)!r} is a presence mask and must be bool, got "
                       f"{value.dtype}")
    if shape is not None and value.shape != shape and value.size != int(np.prod(shape)):
        raise ctx.fail(f"{ctx.input_name(index)!r} must have shape {shape}, got {value.shape}")
    return value


def _values(ctx: OpContext, index: int, needed: int) -> np.ndarray:
    """The first ``needed`` values of input ``index`` (1-D), or a ShapeError if it is short."""
    value = np.asarray(host(ctx.inputs[index])).reshape(-1)
    if value.size < needed:
        raise ctx.fail(f"{ctx.input_name(index)!r} holds {value.size} values but its lengths "
                       f"ask for {needed}")
    return value[:needed]


def _feature_ids(ctx: OpContext, count: int) -> np.ndarray:
    ids = np.asarray(ctx.ints_arg("feature_ids"), dtype=np.int64)
    if ids.size != count:
        raise ctx.fail(f"argument 'feature_ids' must hold one id per feature ({count}), got "
                       f"{ids.size}")
    return ids


def _segment_sums(lengths: np.ndarray, inner: np.ndarray, ctx: OpContext, name: str
                  ) -> np.ndarray:
    """Per example, the sum of ``inner`` over that example's ``lengths`` entries."""
    if inner.size != int(lengths.sum()):
        raise ctx.fail(f"{name!r} must hold one value length per key ({int(lengths.sum())}), "
                       f"got {inner.size}")
    example = np.repeat(np.arange(lengths.size), lengths)
    return np.bincount(example, weights=inner, minlength=lengths.size).astype(np.int64)


# --- the reordering ----------------------------------------------------------------------------
def _interleave(counts: Sequence[np.ndarray]) -> np.ndarray:
    """The permutation taking the inputs' concatenated elements (input 0's first, each input
    in example order; ``counts[i][e]`` elements of input i belong to example e) to
    example-major, input-minor order."""
    num_inputs = len(counts)
    keys = [np.repeat(np.arange(c.size, dtype=np.int64) * num_inputs + i, c)
            for i, c in enumerate(counts)]
    if not keys:
        return np.zeros(0, np.int64)
    return np.argsort(np.concatenate(keys), kind="stable")


def _merge(ctx: OpContext, parts: Sequence[np.ndarray], order: np.ndarray) -> np.ndarray:
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        raise ctx.fail("every feature's values must have one dtype, got "
                       f"{sorted(map(str, dtypes))}")
    return np.concatenate(parts)[order] if parts else np.zeros(0)


def _scatter(ctx: OpContext, grad: Any, order: np.ndarray, sizes: Sequence[int],
             ) -> list[np.ndarray]:
    """The inverse of :func:`_merge`: ``grad`` (merged order) split back per input."""
    grad = np.asarray(host(grad)).reshape(-1)
    if grad.size != order.size:
        raise ctx.fail(f"the values' gradient {ctx.input_name(ctx.num_inputs - 1)!r} holds "
                       f"{grad.size} values, the lengths describe {order.size}")
    flat = np.empty_like(grad)
    flat[order] = grad
    return np.split(flat, np.cumsum(sizes)[:-1]) if sizes else []


def _int32(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.int32)


def _num_examples(ctx: OpContext, index: int) -> int:
    return int(np.asarray(host(ctx.inputs[index])).size)


# --- forward ops -------------------------------------------------------------------------
@register_op("MergeDenseFeatureTensors", inputs=2, outputs=3)
def merge_dense_feature_tensors(ctx: OpContext) -> Outputs:
    """X [N, F], presence [N, F] -> lengths [N], keys, values: the present entries row by
    row, keyed by ``feature_ids[column]``."""
    x = np.asarray(host(ctx.inputs[0]))
    if x.ndim != 2:
        raise ctx.fail(f"{ctx.input_name(0)!r} must be 2-D [examples, features], got "
                       f"shape {x.shape}")
    presence = _presence(ctx, 1, x.shape).reshape(x.shape)
    ids = _feature_ids(ctx, x.shape[1])
    rows, cols = np.nonzero(presence)
    return _int32(presence.sum(axis=1)), ids[cols], x[rows, cols]


@register_op("MergeSingleScalarFeatureTensors", inputs=(2, None), outputs=3)
def merge_single_scalar_feature_tensors(ctx: OpContext) -> Outputs:
    """(X_i, presence_i)* -> lengths, keys, values."""
    count = _group_count(ctx, 2)
    ids = _feature_ids(ctx, count)
    n = _num_examples(ctx, 0)
    masks = [_presence(ctx, 2 * i + 1, (n,)).reshape(-1) for i in range(count)]
    values = [np.asarray(host(ctx.inputs[2 * i])).reshape(-1)[:n][m]
              for i, m in enumerate(masks)]
    counts = [m.astype(np.int64) for m in masks]
    order = _interleave(counts)
    keys = np.concatenate([np.full(int(m.sum()), ids[i]) for i, m in enumerate(masks)])
    return _int32(sum(counts)), keys[order].astype(np.int64), _merge(ctx, values, order)


@register_op("MergeSingleListFeatureTensors", inputs=(3, None), outputs=4)
def merge_single_list_feature_tensors(ctx: OpContext) -> Outputs:
    """(lengths_i, values_i, presence_i)* -> lengths, keys, values.lengths, values.values."""
    lengths, keys, values_lengths, (values,) = _single_nested(ctx, 3, 1)
    return lengths, keys, values_lengths, values


@register_op("MergeSingleMapFeatureTensors", inputs=(4, None), outputs=5)
def merge_single_map_feature_tensors(ctx: OpContext) -> Outputs:
    """(lengths_i, keys_i, values_i, presence_i)* -> lengths, keys, values.lengths,
    values.keys, values.values."""
    lengths, keys, values_lengths, (inner_keys, values) = _single_nested(ctx, 4, 2)
    return lengths, keys, values_lengths, inner_keys, values


def _single_nested(ctx: OpContext, group: int, nested: int) -> tuple[Any, ...]:
    """Merge single list (``nested=1``) or map (``nested=2``) features."""
    count = _group_count(ctx, group)
    ids = _feature_ids(ctx, count)
    n = _num_examples(ctx, 0)
    masks = [_presence(ctx, group * i + group - 1, (n,)).reshape(-1) for i in range(count)]
    lens = [_lengths(ctx, group * i, n) for i in range(count)]
    outer = _interleave([m.astype(np.int64) for m in masks])
    inner_counts = [ln * m for ln, m in zip(lens, masks)]
    inner = _interleave(inner_counts)
    keys = np.concatenate([np.full(int(m.sum()), ids[i], np.int64) for i, m in enumerate(masks)])
    values_lengths = np.concatenate([ln[m] for ln, m in zip(lens, masks)])
    merged = [_merge(ctx, [_values(ctx, group * i + 1 + k, int(c.sum()))
                           for i, c in enumerate(inner_counts)], inner)
              for k in range(nested)]
    return (_int32(sum(m.astype(np.int64) for m in masks)), keys[outer],
            _int32(values_lengths[outer]), merged)


@register_op("MergeMultiScalarFeatureTensors", inputs=(3, None), outputs=3)
def merge_multi_scalar_feature_tensors(ctx: OpContext) -> Outputs:
    """(lengths_i, keys_i, values_i)* -> lengths, keys, values."""
    count = _group_count(ctx, 3)
    n = _num_examples(ctx, 0)
    lens = [_lengths(ctx, 3 * i, n) for i in range(count)]
    order = _interleave(lens)
    keys = [_values(ctx, 3 * i + 1, int(ln.sum())).astype(np.int64) for i, ln in enumerate(lens)]
    values = [_values(ctx, 3 * i + 2, int(ln.sum())) for i, ln in enumerate(lens)]
    return _int32(sum(lens)), np.concatenate(keys)[order], _merge(ctx, values, order)


@register_op("MergeMultiListFeatureTensors", inputs=(4, None), outputs=4)
def merge_multi_list_feature_tensors(ctx: OpContext) -> Outputs:
    """(lengths_i, keys_i, values.lengths_i, values.values_i)* -> the same four, merged."""
    lengths, keys, values_lengths, (values,) = _multi_nested(ctx, 4, 1)
    return lengths, keys, values_lengths, values


@register_op("MergeMultiMapFeatureTensors", inputs=(5, None), outputs=5)
def merge_multi_map_feature_tensors(ctx: OpContext) -> Outputs:
    """(lengths_i, keys_i, values.lengths_i, values.keys_i, values.values_i)* -> the same
    five, merged."""
    lengths, keys, values_lengths, (inner_keys, values) = _multi_nested(ctx, 5, 2)
    return lengths, keys, values_lengths, inner_keys, values


def _multi_nested(ctx: OpContext, group: int, nested: int) -> tuple[Any, ...]:
    """Merge multi list (``nested=1``) or map (``nested=2``) features."""
    count = _group_count(ctx, group)
    n = _num_examples(ctx, 0)
    lens = [_lengths(ctx, group * i, n) for i in range(count)]
    outer = _interleave(lens)
    keys = [_values(ctx, group * i + 1, int(ln.sum())).astype(np.int64)
            for i, ln in enumerate(lens)]
    inner_lens = [_lengths(ctx, group * i + 2) for i in range(count)]
    inner_counts = [_segment_sums(ln, il, ctx, ctx.input_name(group * i + 2))
                    for i, (ln, il) in enumerate(zip(lens, inner_lens))]
    inner = _interleave(inner_counts)
    merged = [_merge(ctx, [_values(ctx, group * i + 3 + k, int(c.sum()))
                           for i, c in enumerate(inner_counts)], inner)
              for k in range(nested)]
    return (_int32(sum(lens)), np.concatenate(keys)[outer],
            _int32(np.concatenate(inner_lens)[outer]), merged)


# --- gradient ops ------------------------------------------------------------------------
def _grad_outputs(ctx: OpContext, group: int) -> int:
    count = _group_count(ctx, group, extra=1)
    if ctx.num_outputs != count:
        raise ctx.fail(f"{ctx.op.type} needs one output per feature ({count}), got "
                       f"{ctx.num_outputs}")
    return count


@register_op("MergeSingleScalarFeatureTensorsGradient", inputs=(2, None), outputs=(1, None))
def merge_single_scalar_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """presence_i*, values_grad -> X_i_grad (shaped like presence_i; absent entries get the
    dtype's default: 0, False or b"")."""
    count = _grad_outputs(ctx, 1)
    masks = [_presence(ctx, i) for i in range(count)]
    n = masks[0].size
    flat = [m.reshape(-1) for m in masks]
    if any(m.size != n for m in flat):
        raise ctx.fail("every presence input must hold one flag per example")
    parts = _scatter(ctx, ctx.inputs[-1], _interleave([m.astype(np.int64) for m in flat]),
                     [int(m.sum()) for m in flat])
    outs = []
    for mask, part in zip(masks, parts):
        out = np.full(mask.shape, b"" if part.dtype == object else 0, dtype=part.dtype)
        out[mask] = part
        outs.append(out)
    return outs


@register_op("MergeSingleListFeatureTensorsGradient", inputs=(3, None), outputs=(1, None))
def merge_single_list_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """(lengths_i, presence_i)*, values.values_grad -> values_i_grad."""
    return _single_nested_gradient(ctx)


@register_op("MergeSingleMapFeatureTensorsGradient", inputs=(3, None), outputs=(1, None))
def merge_single_map_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """(lengths_i, presence_i)*, values.values_grad -> values_i_grad."""
    return _single_nested_gradient(ctx)


def _single_nested_gradient(ctx: OpContext) -> list[np.ndarray]:
    count = _grad_outputs(ctx, 2)
    n = _num_examples(ctx, 0)
    counts = [_lengths(ctx, 2 * i, n) * _presence(ctx, 2 * i + 1, (n,)).reshape(-1)
              for i in range(count)]
    return _scatter(ctx, ctx.inputs[-1], _interleave(counts), [int(c.sum()) for c in counts])


@register_op("MergeMultiScalarFeatureTensorsGradient", inputs=(2, None), outputs=(1, None))
def merge_multi_scalar_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """lengths_i*, values_grad -> values_i_grad."""
    count = _grad_outputs(ctx, 1)
    n = _num_examples(ctx, 0)
    lens = [_lengths(ctx, i, n) for i in range(count)]
    return _scatter(ctx, ctx.inputs[-1], _interleave(lens), [int(c.sum()) for c in lens])


@register_op("MergeMultiListFeatureTensorsGradient", inputs=(3, None), outputs=(1, None))
def merge_multi_list_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """(lengths_i, values.lengths_i)*, values.values_grad -> values.values_i_grad."""
    return _multi_nested_gradient(ctx)


@register_op("MergeMultiMapFeatureTensorsGradient", inputs=(3, None), outputs=(1, None))
def merge_multi_map_feature_tensors_gradient(ctx: OpContext) -> Outputs:
    """(lengths_i, values.lengths_i)*, values.values_grad -> values.values_i_grad."""
    return _multi_nested_gradient(ctx)


def _multi_nested_gradient(ctx: OpContext) -> list[np.ndarray]:
    count = _grad_outputs(ctx, 2)
    n = _num_examples(ctx, 0)
    counts = [_segment_sums(_lengths(ctx, 2 * i, n), _lengths(ctx, 2 * i + 1), ctx,
                            ctx.input_name(2 * i + 1)) for i in range(count)]
    return _scatter(ctx, ctx.inputs[-1], _interleave(counts), [int(c.sum()) for c in counts])


# --- gradient makers ---------------------------------------------------------------------
def _maker(grad_type: str, group: int, read: Sequence[int], grad_of: int, go: int) -> None:
    """Register the gradient of Merge*: ``grad_type`` reads blobs ``read`` of each feature
    and ``GO(go)``, and writes the gradient of each feature's blob ``grad_of``."""
    forward = grad_type[: -len("Gradient")]

    @register_gradient(forward)
    def _gradient(g: GradientBuilder) -> None:
        count = len(g.op.input) // group
        inputs = [g.I(group * i + r) for i in range(count) for r in read]
        outputs = [g.GI(group * i + grad_of) for i in range(count)]
        g.add(grad_type, inputs + [g.GO(go)], outputs)


_maker("MergeSingleScalarFeatureTensorsGradient", 2, (1,), 0, 2)
_maker("MergeSingleListFeatureTensorsGradient", 3, (0, 2), 1, 3)
_maker("MergeSingleMapFeatureTensorsGradient", 4, (0, 3), 2, 4)
_maker("MergeMultiScalarFeatureTensorsGradient", 3, (0,), 2, 2)
_maker("MergeMultiListFeatureTensorsGradient", 4, (0, 2), 3, 3)
_maker("MergeMultiMapFeatureTensorsGradient", 5, (0, 2), 4, 4)
