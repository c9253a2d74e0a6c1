"""Dataset ops over whole records: packing, trimming, random-order reading, and the
collectors (last-N window, reservoir of tensors).

Columns follow the layout of :mod:`dpgraph.ops.dataset` (``<prefix>:lengths`` columns
define nested domains, walked with :class:`~dpgraph.ops.dataset.TreeIterator`).

Ops: PackRecords, UnPackRecords, TrimDataset, ComputeOffset, SortAndShuffle,
ReadRandomBatch, LastNWindowCollector, CreateTensorVector, TensorVectorSize,
ConcatTensorVector, CollectTensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import ShapeResult, to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.dataset import TreeIterator, _advance, _cursor, _fields_arg, _limits_and_lengths
from dpgraph.ops.fill import no_gradient
from dpgraph.proto import caffe2_pb2


def _columns(ctx: OpContext, values: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(to_host(v)) for v in values]


def _record_offsets(ctx: OpContext, it: TreeIterator, data: list[np.ndarray],
                    limits: list[int] | None = None) -> list[list[int]]:
    """The domain offsets at the start of every top-level record, plus the end offsets
    (``num_records + 1`` rows of ``it.num_offsets`` values)."""
    own_limits, lengths = _limits_and_lengths(ctx, it, data)
    limits = own_limits if limits is None else limits
    offsets = [0] * it.num_offsets
    rows = [list(offsets)]
    for _ in range(limits[0]):
        _, offsets = _advance(ctx, it, lengths, offsets, limits, 1)
        rows.append(list(offsets))
    return rows


def _slice(value: np.ndarray, start: int, stop: int) -> np.ndarray:
    return value[start:stop].copy()


# --- PackRecords / UnPackRecords -----------------------------------------------------------
@register_op("PackRecords", inputs=(1, None), outputs=1)
def pack_records(ctx: OpContext) -> Outputs:
    """Columns -> a 1-D object tensor with one entry (a tuple of that record's column
    slices) per top-level record, or, with ``pack_to_single_shared_ptr``, one entry holding
    copies of the whole columns."""
    it = TreeIterator(_fields_arg(ctx))
    data = _columns(ctx, ctx.inputs)
    if len(data) != len(it.fields):
        raise ctx.fail(f"{len(it.fields)} fields but {len(data)} inputs")
    if ctx.int_arg("pack_to_single_shared_ptr", 0):
        packed = np.empty(1, dtype=object)
        packed[0] = tuple(v.copy() for v in data)
        return (packed,)
    rows = _record_offsets(ctx, it, data)
    packed = np.empty(len(rows) - 1, dtype=object)
    for r in range(len(rows) - 1):
        packed[r] = tuple(_slice(v, rows[r][it.offset_id(i)], rows[r + 1][it.offset_id(i)])
                          for i, v in enumerate(data))
    return (packed,)


@register_op("UnPackRecords", inputs=(1, None), outputs=(1, None))
def unpack_records(ctx: OpContext) -> Outputs:
    """A PackRecords tensor -> its columns (record slices concatenated); extra inputs are
    prototype columns giving the shapes and types when there is no record."""
    packed = ctx.inputs[0]
    records = list(np.asarray(packed, dtype=object).reshape(-1)) if packed is not None else []
    prototypes = _columns(ctx, ctx.inputs[1:])
    n = ctx.num_outputs
    if not records and not prototypes:
        raise ctx.fail("Unpacking empty record without shape will leave output blobs in "
                       "undefined state; pass prototype columns as extra inputs.")
    if prototypes and len(prototypes) != n:
        raise ctx.fail(f"{len(prototypes)} prototype inputs for {n} outputs")
    for r, record in enumerate(records):
        if not isinstance(record, tuple) or len(record) != n:
            raise ctx.fail(f"record {r} is not a packed record of {n} columns")
    outputs = []
    for j in range(n):
        parts = [np.asarray(record[j]) for record in records]
        if not parts:
            proto = prototypes[j]
            outputs.append(np.zeros((0, *proto.shape[1:]), proto.dtype))
            continue
        outputs.append(np.concatenate(parts, axis=0))
    return tuple(outputs)


# --- TrimDataset -------------------------------------------------------------------------------
@register_op("TrimDataset", inputs=(1, None), outputs=(1, None), inplace="any")
def trim_dataset(ctx: OpContext) -> Outputs:
    """Keep the first ``(records // multiple_of) * multiple_of`` top-level records of the
    dataset (outputs are the inputs, in place)."""
    it = TreeIterator(_fields_arg(ctx))
    data = _columns(ctx, ctx.inputs)
    multiple_of = ctx.int_arg("multiple_of", 0)
    if multiple_of <= 0:
        raise ctx.fail(f"multiple_of must be positive, got {multiple_of}")
    if len(data) != len(it.fields) or ctx.num_outputs != len(data):
        raise ctx.fail(f"{len(it.fields)} fields, {len(data)} inputs, {ctx.num_outputs} "
                       "outputs: they must all agree")
    rows = _record_offsets(ctx, it, data)
    kept = ((len(rows) - 1) // multiple_of) * multiple_of
    end = rows[kept]
    return tuple(v[:end[it.offset_id(i)]].copy() for i, v in enumerate(data))


# --- random-order reading ------------------------------------------------------------------
@register_op("ComputeOffset", inputs=(2, None), outputs=1)
def compute_offset(ctx: OpContext) -> Outputs:
    """``[cursor, *columns]`` -> int64 ``[records + 1, domains]``: the offsets of every
    domain at the start of each record (last row: the ends); the cursor is reset."""
    cursor = _cursor(ctx)
    data = _columns(ctx, ctx.inputs[1:])
    it = cursor.it
    if len(data) != len(it.fields):
        raise ctx.fail(f"the cursor has {len(it.fields)} fields, got {len(data)} columns")
    limits = [np.iinfo(np.int64).max] * it.num_offsets
    for i, value in enumerate(data):
        k = it.offset_id(i)
        limits[k] = min(limits[k], int(value.shape[0]) if value.ndim else 1)
    rows = _record_offsets(ctx, it, data, limits)
    with cursor.lock:
        cursor.offsets = [0] * it.num_offsets
    return (np.array(rows, dtype=np.int64).reshape(len(rows), it.num_offsets),)


class _MinStdRand0:
    """C++ ``std::default_random_engine`` as libstdc++ defines it (minstd_rand0, seed 1):
    Caffe2's SortAndShuffle shuffles with a freshly constructed one, so its order is fixed."""

    MODULUS = 2147483647
    MIN, MAX = 1, 2147483646

    def __init__(self) -> None:
        self.state = 1

    def __call__(self) -> int:
        self.state = (16807 * self.state) % self.MODULUS
        return self.state

    def uniform(self, low: int, high: int) -> int:
        """libstdc++ ``uniform_int_distribution(low, high)`` (down-scaling rejection)."""
        span = high - low
        urng_range = self.MAX - self.MIN
        if span == urng_range:
            return self() - self.MIN + low
        scaling = urng_range // (span + 1)
        past = (span + 1) * scaling
        value = self() - self.MIN
        while value >= past:
            value = self() - self.MIN
        return value // scaling + low


def _std_shuffle(items: list[int]) -> None:
    """libstdc++'s ``std::shuffle(first, last, std::default_random_engine())`` (GCC >= 9,
    which draws two swap positions per number when the range allows)."""
    n = len(items)
    if n <= 1:
        return
    g = _MinStdRand0()
    urng_range = g.MAX - g.MIN
    if urng_range // n >= n:
        i = 1
        if n % 2 == 0:
            j = g.uniform(0, 1)
            items[i], items[j] = items[j], items[i]
            i += 1
        while i != n:
            swap_range = i + 1
            x = g.uniform(0, swap_range * (swap_range + 1) - 1)
            first, second = x // (swap_range + 1), x % (swap_range + 1)
            items[i], items[first] = items[first], items[i]
            items[i + 1], items[second] = items[second], items[i + 1]
            i += 2
        return
    for i in range(1, n):
        j = g.uniform(0, i)
        items[i], items[j] = items[j], items[i]


@register_op("SortAndShuffle", inputs=(2, None), outputs=1)
def sort_and_shuffle(ctx: OpContext) -> Outputs:
    """``[cursor, *columns]`` -> an int64 reading order: records sorted by the root-level
    column ``sort_by_field_idx`` (-1: no sort), shuffled within chunks of
    ``batch_size * shuffle_size``, then batches shuffled (C++'s fixed default engine, as
    Caffe2)."""
    cursor = _cursor(ctx)
    data = _columns(ctx, ctx.inputs[1:])
    sort_idx = ctx.int_arg("sort_by_field_idx", -1)
    batch_size = ctx.int_arg("batch_size", 1)
    shuffle_size = ctx.int_arg("shuffle_size", 1)
    if not -1 <= sort_idx < len(cursor.it.fields):
        raise ctx.fail(f"sort_by_field_idx {sort_idx} is out of range")
    if batch_size <= 0 or shuffle_size <= 0:
        raise ctx.fail("batch_size and shuffle_size must be positive")
    size = int(data[sort_idx if sort_idx != -1 else 0].shape[0])
    if batch_size * shuffle_size > size:
        shuffle_size = size // batch_size
    order = list(range(size))
    if sort_idx != -1:
        if cursor.it.length_field_of[sort_idx] != -1:
            raise ctx.fail("Sort by field must be a root level field")
        keys = data[sort_idx].reshape(-1).astype(np.int64)
        order.sort(key=lambda i: keys[i])
    chunk = batch_size * shuffle_size
    if chunk > 1:
        offset = 0
        while offset + chunk < size:
            part = order[offset:offset + chunk]
            _std_shuffle(part)
            order[offset:offset + chunk] = part
            offset += chunk
    num_batch = size // batch_size
    batches = list(range(num_batch))
    _std_shuffle(batches)
    result = [order[b * batch_size + k] for b in batches for k in range(batch_size)]
    result += order[num_batch * batch_size:]
    return (np.array(result, dtype=np.int64),)


@register_op("ReadRandomBatch", inputs=(4, None), outputs=(1, None))
def read_random_batch(ctx: OpContext) -> Outputs:
    """``[cursor, indices, offsets, *columns]`` -> the next ``batch_size`` records in
    ``indices`` order (offsets from ComputeOffset); empty once past the end, unless
    ``loop_over`` starts again; ``enforce_batch_size`` drops a short last batch."""
    cursor = _cursor(ctx)
    indices = np.asarray(to_host(ctx.inputs[1])).reshape(-1).astype(np.int64)
    offsets = np.asarray(to_host(ctx.inputs[2]))
    data = _columns(ctx, ctx.inputs[3:])
    it = cursor.it
    if len(data) != len(it.fields) or ctx.num_outputs != len(data):
        raise ctx.fail(f"the cursor has {len(it.fields)} fields, got {len(data)} columns and "
                       f"{ctx.num_outputs} outputs")
    batch_size = ctx.int_arg("batch_size", 1)
    with cursor.lock:
        cursor.offsets = cursor.offsets[:1] or [0]
        start = cursor.offsets[0]
        if ctx.int_arg("enforce_batch_size", 0) and start + batch_size > indices.size:
            start = indices.size
        if ctx.int_arg("loop_over", 0) and start >= indices.size:
            cursor.offsets[0] = start = 0
        cursor.offsets[0] += batch_size
    picked = indices[start:min(start + batch_size, indices.size)]
    if picked.size and (picked.max() + 1 >= offsets.shape[0] or picked.min() < 0):
        raise ctx.fail("Out of bound when trying to get elem from offsetsmat")
    outputs = []
    for i, value in enumerate(data):
        k = it.offset_id(i)
        parts = [value[offsets[r, k]:offsets[r + 1, k]] for r in picked]
        outputs.append(np.concatenate(parts, axis=0) if parts
                       else np.zeros((0, *value.shape[1:]), value.dtype))
    return tuple(outputs)


# --- collectors --------------------------------------------------------------------------------
def _last_n_shape(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
                  in_types: Sequence[Any]) -> ShapeResult:
    num = next((a.i for a in op.arg if a.name == "num_to_collect"), 0)
    result: ShapeResult = [None] * len(op.output)
    if len(in_shapes) > 2 and in_shapes[2] is not None:
        result[0] = ((int(num), *tuple(in_shapes[2])[1:]), in_types[2])
    if len(op.output) > 1:
        result[1] = ((), caffe2_pb2.TensorProto.INT32)
    if len(op.output) > 2:
        result[2] = ((1,), caffe2_pb2.TensorProto.INT64)
    return result


@register_op("LastNWindowCollector", inputs=(3, 4), outputs=(2, 3), inplace="any",
             side_effects=True, shape=_last_n_shape, empty_inputs=(0,),
             mutex_input=3)
def last_n_window_collector(ctx: OpContext) -> Outputs:
    """``[buffer, next, data(, mutex)]`` -> ``[buffer, next(, num_visited)]`` in place:
    a ring buffer of the last ``num_to_collect`` rows of ``data``; ``next`` is where the
    next row goes."""
    num = ctx.int_arg("num_to_collect", 0)
    if num <= 0:
        raise ctx.fail(f"num_to_collect must be positive, got {num}")
    lock = getattr(ctx.inputs[3], "lock", None) if ctx.num_inputs > 3 else None
    if lock is None:
        return _collect_last_n(ctx, num)
    with lock:
        return _collect_last_n(ctx, num)


def _collect_last_n(ctx: OpContext, num: int) -> Outputs:
    buffer, nxt, data = ctx.inputs[0], ctx.inputs[1], np.asarray(to_host(ctx.inputs[2]))
    if data.ndim < 1:
        raise ctx.fail("data must have at least one dimension")
    initialized = buffer is not None and np.asarray(buffer).size > 0
    out = np.asarray(to_host(buffer)) if initialized else data[:0].copy()
    if initialized and (out.ndim != data.ndim or out.shape[1:] != data.shape[1:]):
        raise ctx.fail(f"buffer shape {list(out.shape)} does not fit data shape "
                       f"{list(data.shape)}")
    position = int(np.asarray(to_host(nxt)).reshape(-1)[0]) if nxt is not None and np.size(
        nxt) else 0
    extra: list[Any] = []
    if ctx.num_outputs > 2:
        visited = ctx.prev_output(2)
        count = int(np.asarray(visited).reshape(-1)[0]) if initialized and visited is not None \
            else 0
        extra.append(np.array([count + data.shape[0]], dtype=np.int64))
    entries = data.shape[0]
    if entries == 0:
        return (out if initialized else data.copy(), np.array(position, np.int32), *extra)
    if not 0 <= position < num:
        raise ctx.fail(f"next ({position}) must be in [0, {num})")
    if entries > num:
        return (data[entries - num:].copy(), np.array(0, np.int32), *extra)
    size = min(num, out.shape[0] + entries)
    if size > out.shape[0]:
        grown = np.zeros((size, *data.shape[1:]), dtype=data.dtype)
        grown[:out.shape[0]] = out
        out = grown
    else:
        out = out.copy()
    first = min(entries + position, num) - position
    out[position:position + first] = data[:first]
    out[:entries - first] = data[first:]
    return (out, np.array((position + entries) % num, np.int32), *extra)


class TensorVector(list):  # type: ignore[type-arg]
    """Caffe2's ``std::unique_ptr<std::vector<Tensor>>`` blob: a list of arrays."""


@register_op("CreateTensorVector", inputs=0, outputs=1)
def create_tensor_vector(ctx: OpContext) -> Outputs:
    """An empty TensorVector."""
    return (TensorVector(),)


def _vector(ctx: OpContext, index: int) -> TensorVector:
    return ctx.object_input(index, TensorVector, "TensorVector", "CreateTensorVector")


@register_op("TensorVectorSize", inputs=1, outputs=1)
def tensor_vector_size(ctx: OpContext) -> Outputs:
    """The number of tensors in a TensorVector (int32 scalar)."""
    return (np.array(len(_vector(ctx, 0)), dtype=np.int32),)


@register_op("ConcatTensorVector", inputs=1, outputs=1)
def concat_tensor_vector(ctx: OpContext) -> Outputs:
    """The TensorVector's tensors concatenated along the first dimension."""
    tensors = [np.asarray(t) for t in _vector(ctx, 0)]
    if not tensors:
        return (np.zeros((0,), np.float32),)
    if any(t.shape[1:] != tensors[0].shape[1:] for t in tensors):
        raise ctx.fail("tensors of the vector differ in their inner dimensions: "
                       f"{sorted({t.shape for t in tensors})}")
    return (np.concatenate(tensors, axis=0),)


#: Per-instance key (in the op's own argument dict) of CollectTensor's visit count.
_VISITED = "\0collect_tensor_visited"


@register_op("CollectTensor", inputs=(2, None), outputs=(1, None), inplace="any",
             side_effects=True)
def collect_tensor(ctx: OpContext) -> Outputs:
    """``[*vectors, *tensors]`` -> ``vectors`` (in place): reservoir sampling of
    ``num_to_collect`` tensors per vector, the same positions for every vector; the visit
    count belongs to the op instance (as Caffe2's)."""
    n = ctx.num_outputs
    if ctx.num_inputs != 2 * n:
        raise ctx.fail(f"expects {2 * n} inputs (vectors then tensors), got {ctx.num_inputs}")
    num = ctx.int_arg("num_to_collect", -1)
    if num <= 0:
        raise ctx.fail(f"num_to_collect must be positive, got {num}")
    visited = int(ctx.args.get(_VISITED, 0))
    position = visited if visited < num else int(ctx.rng.integers(0, visited + 1))
    vectors = [_vector(ctx, i) for i in range(n)]
    for i, vector in enumerate(vectors):
        if visited >= num and len(vector) != num:
            raise ctx.fail(f"vector {ctx.input_name(i)} has {len(vector)} tensors, expected "
                           f"{num}")
        if position >= num:
            continue
        tensor = np.array(to_host(ctx.inputs[n + i]))
        if position >= len(vector):
            vector.append(tensor)
        else:
            vector[position] = tensor
    ctx.args[_VISITED] = visited + 1
    return tuple(vectors)


for _type in ("PackRecords", "UnPackRecords", "TrimDataset", "ComputeOffset",
              "SortAndShuffle", "ReadRandomBatch", "LastNWindowCollector",
              "CreateTensorVector", "TensorVectorSize", "ConcatTensorVector", "CollectTensor"):
    register_gradient(_type)(no_gradient)
