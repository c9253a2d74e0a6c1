"""Dataset ops: in-memory datasets of schema columns read through tree cursors.

Column names follow ``dpgraph.schema``: a ``<prefix>:lengths`` column holds, per entry of
its parent domain, the number of entries of the nested domain the ``<prefix>:...`` columns
live in.  A cursor (``CreateTreeCursor``) keeps one offset per domain; ``ReadNextBatch``
reads ``batch_size`` top-level entries with everything nested in them and advances it.

Ops: CreateTreeCursor, ResetCursor, ReadNextBatch, CheckDatasetConsistency, AtomicAppend,
IsEmpty.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient

LENGTH_FIELD = "lengths"


class TreeIterator:
    """The domain structure of a dataset's columns.

    ``length_field_of[i]`` is the index (into ``length_fields``) of the lengths column
    whose domain column ``i`` belongs to, or -1 for the top-level domain.
    """

    def __init__(self, fields: list[str]) -> None:
        self.fields = list(fields)
        parts = [f.split(":") for f in self.fields]
        self.length_fields = [i for i, p in enumerate(parts) if p and p[-1] == LENGTH_FIELD]
        self.length_field_of: list[int] = []
        for i, name_parts in enumerate(parts):
            best, best_level = -1, 1
            for j, lf in enumerate(self.length_fields):
                if lf == i:
                    continue
                prefix = parts[lf][:-1]
                if name_parts[:len(prefix)] == prefix and len(parts[lf]) > best_level:
                    best, best_level = j, len(parts[lf])
            self.length_field_of.append(best)

    @property
    def num_offsets(self) -> int:
        return len(self.length_fields) + 1

    def offset_id(self, field: int) -> int:
        return self.length_field_of[field] + 1


class TreeCursor:
    """A TreeIterator and one offset per domain (thread-safe)."""

    def __init__(self, fields: list[str]) -> None:
        self.it = TreeIterator(fields)
        self.offsets: list[int] = []
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TreeCursor(fields={self.it.fields}, offsets={self.offsets})"


def _fields_arg(ctx: OpContext) -> list[str]:
    return [f.decode() if isinstance(f, bytes) else str(f) for f in ctx.arg("fields", []) or []]


@register_op("CreateTreeCursor", inputs=0, outputs=1)
def create_tree_cursor(ctx: OpContext) -> Outputs:
    """A cursor over the columns named by the ``fields`` argument."""
    return (TreeCursor(_fields_arg(ctx)),)


def _cursor(ctx: OpContext) -> TreeCursor:
    return ctx.object_input(0, TreeCursor, "cursor", "CreateTreeCursor")


@register_op("ResetCursor", inputs=1, outputs=0)
def reset_cursor(ctx: OpContext) -> Outputs:
    """Move the cursor back to the start of the dataset."""
    cursor = _cursor(ctx)
    with cursor.lock:
        cursor.offsets = []
    return ()


def _limits_and_lengths(ctx: OpContext, it: TreeIterator, data: list[np.ndarray]
                        ) -> tuple[list[int], list[np.ndarray]]:
    limits = [0] * it.num_offsets
    for i, value in enumerate(data):
        limits[it.offset_id(i)] = int(value.shape[0]) if value.ndim else 1
    lengths = [np.asarray(data[f]).reshape(-1).astype(np.int64) for f in it.length_fields]
    return limits, lengths


def _advance(ctx: OpContext, it: TreeIterator, lengths: list[np.ndarray],
             offsets: list[int], limits: list[int], num: int) -> tuple[list[int], list[int]]:
    """``(sizes, new offsets)`` after reading ``num`` top-level entries."""
    sizes = [0] * it.num_offsets
    new = list(offsets)
    if limits[0] < offsets[0]:
        raise ctx.fail("Tried to advance past end of cursor.")
    sizes[0] = min(limits[0] - offsets[0], num)
    new[0] = offsets[0] + sizes[0]
    for j in range(1, it.num_offsets):
        parent = it.offset_id(it.length_fields[j - 1])
        start = offsets[parent]
        total = int(lengths[j - 1][start:start + sizes[parent]].sum())
        if offsets[j] + total > limits[j]:
            raise ctx.fail(f"Inconsistent field length: tried to advance past the end of "
                           f"field {it.fields[it.length_fields[j - 1]]}")
        sizes[j] = total
        new[j] = offsets[j] + total
    return sizes, new


@register_op("ReadNextBatch", inputs=(1, None), outputs=(0, None))
def read_next_batch(ctx: OpContext) -> Outputs:
    """Inputs ``[cursor, *columns]`` -> the next ``batch_size`` (default 1) top-level
    entries of every column; empty columns once the data is exhausted (or, with
    ``enforce_batch_size``, when fewer than ``batch_size`` entries are left)."""
    cursor = _cursor(ctx)
    data = [np.asarray(to_host(v)) for v in ctx.inputs[1:]]
    it = cursor.it
    if len(data) != len(it.fields) or ctx.num_outputs != len(it.fields):
        raise ctx.fail(f"the cursor has {len(it.fields)} fields, got {len(data)} inputs and "
                       f"{ctx.num_outputs} outputs")
    batch_size = ctx.int_arg("batch_size", 1)
    limits, lengths = _limits_and_lengths(ctx, it, data)
    with cursor.lock:
        if not cursor.offsets:
            cursor.offsets = [0] * it.num_offsets
        offsets = list(cursor.offsets)
        if ctx.int_arg("enforce_batch_size", 0) and offsets[0] + batch_size > limits[0]:
            sizes = [0] * it.num_offsets
        else:
            sizes, cursor.offsets = _advance(ctx, it, lengths, offsets, limits, batch_size)
    outputs = []
    for i, value in enumerate(data):
        k = it.offset_id(i)
        outputs.append(value[offsets[k]:offsets[k] + sizes[k]].copy())
    return tuple(outputs)


@register_op("CheckDatasetConsistency", inputs=(1, None), outputs=0)
def check_dataset_consistency(ctx: OpContext) -> Outputs:
    """Check that every lengths column sums to the size of the domain it defines and that
    the columns of one domain have the same number of entries."""
    it = TreeIterator(_fields_arg(ctx))
    data = [np.asarray(to_host(v)) for v in ctx.inputs]
    if len(data) != len(it.fields):
        raise ctx.fail(f"{len(it.fields)} fields but {len(data)} inputs")
    sizes: dict[int, int] = {}
    for i, value in enumerate(data):
        k = it.offset_id(i)
        n = int(value.shape[0]) if value.ndim else 1
        if sizes.setdefault(k, n) != n:
            raise ctx.fail(f"field {it.fields[i]} has {n} entries, other fields of its "
                           f"domain have {sizes[k]}")
    for j, lf in enumerate(it.length_fields):
        total = int(data[lf].astype(np.int64).sum())
        if j + 1 in sizes and sizes[j + 1] != total:
            raise ctx.fail(f"lengths field {it.fields[lf]} sums to {total}, but its domain "
                           f"has {sizes[j + 1]} entries")
    return ()


@register_op("AtomicAppend", inputs=(3, None), outputs=(1, None), inplace="any",
             side_effects=True, mutex_input=0)
def atomic_append(ctx: OpContext) -> Outputs:
    """Inputs ``[mutex, *a, *b]``, outputs ``a`` (in place): append each ``b`` to its
    ``a`` along the first dimension, under the mutex."""
    n = ctx.num_outputs
    if ctx.num_inputs != 1 + 2 * n:
        raise ctx.fail(f"expects 1 + 2 * {n} inputs, got {ctx.num_inputs}")
    lock = getattr(ctx.inputs[0], "lock", None)
    with lock if lock is not None else threading.Lock():
        outputs = []
        for i in range(n):
            # the value stored now (the runtime holds the mutex from reading the inputs
            # to storing the outputs; this also covers kernels run without a runtime)
            current = ctx.prev_output(i) if ctx.workspace is not None else None
            a = np.asarray(to_host(current if current is not None else ctx.inputs[1 + i]))
            b = np.asarray(to_host(ctx.inputs[1 + n + i]))
            if b.ndim < 1:
                raise ctx.fail(f"appended input {ctx.input_name(1 + n + i)} must have at "
                               "least one dimension")
            if a.size == 0 and (a.ndim == 0 or a.shape[0] == 0):
                outputs.append(b.copy())
                continue
            if ctx.input_name(1 + i) != ctx.output_name(i):
                raise ctx.fail("Appended-to arguments must be in-place.")
            if a.ndim != b.ndim or a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                raise ctx.fail(f"cannot append {b.dtype}{list(b.shape)} to "
                               f"{a.dtype}{list(a.shape)} ({ctx.output_name(i)})")
            outputs.append(np.concatenate([a, b], axis=0))
    return tuple(outputs)


@register_op("IsEmpty", inputs=1, outputs=1)
def is_empty(ctx: OpContext) -> Outputs:
    """A bool scalar: whether the input has no elements."""
    value: Any = ctx.inputs[0]
    return (np.array(np.asarray(to_host(value)).size == 0),)


@register_op("HasElements", inputs=(1, None), outputs=1)
def has_elements(ctx: OpContext) -> Outputs:
    """A bool scalar: whether any input has elements."""
    return (np.array(any(np.asarray(to_host(v)).size for v in ctx.inputs)),)


for _type in ("CreateTreeCursor", "ResetCursor", "ReadNextBatch", "CheckDatasetConsistency",
              "AtomicAppend", "IsEmpty", "HasElements"):
    register_gradient(_type)(no_gradient)


# whole-record ops (PackRecords, TrimDataset, random reads, collectors) and the Timer ops
# (time-limited readers) register with this family
from dpgraph.ops import dataset_records, timer  # noqa: E402,F401
