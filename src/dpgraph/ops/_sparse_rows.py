"""Helpers for ops that update or read rows of a table by index (sparse optimizers,
ScatterAssign, Gather, ...): index and row checks, in-place output buffers, and the split of
repeated indices into layers that reproduces Caffe2's one-row-after-the-other updates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext


def occurrence_layers(indices: Any) -> list[Any]:
    """Split positions of ``indices`` into layers without repeats, preserving order.

    Layer k holds, for every distinct index, its k-th occurrence; applying the layers in turn
    reproduces Caffe2's one-row-after-the-other semantics with vectorised updates.
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.size == 0:
        return []
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.r_[0, np.flatnonzero(sorted_idx[1:] != sorted_idx[:-1]) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, idx.size]))
    rank = np.empty(idx.size, dtype=np.int64)
    rank[order] = np.arange(idx.size) - group_start
    if rank.max() == 0:
        return [np.arange(idx.size)]
    return [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]


def integer_indices(ctx: OpContext, indices: Any, what: str = "indices") -> Any:
    """``indices`` on the host as an int64 array; a clear error unless they are integers
    (Caffe2 accepts int32/int64 index tensors only)."""
    idx = host(indices)
    if idx.dtype.kind not in "iu":
        raise ctx.fail(f"{what} must be an int32 or int64 tensor, got {idx.dtype}; cast them "
                       f"with .astype(np.int64) before feeding them")
    return idx.astype(np.int64)


def check_indices(ctx: OpContext, indices: Any, rows: int, what: str = "indices") -> Any:
    """``indices`` as a flat int64 array, each in [0, rows)."""
    idx = integer_indices(ctx, indices, what).reshape(-1)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= rows):
        raise ctx.fail(f"{what} must lie in [0, {rows}), got [{int(idx.min())}, "
                       f"{int(idx.max())}]")
    return idx


def writable(ctx: OpContext, value: Any, input_index: int, output_index: int) -> Any:
    """``value`` itself when the op writes it in place, else a copy to update."""
    if ctx.input_name(input_index) == ctx.output_name(output_index):
        return value
    return value.copy()


def check_rows(ctx: OpContext, table: Any, idx: Any, rows: Any, what: str = "grad") -> Any:
    """``rows`` reshaped to ``(len(idx),) + table.shape[1:]``, or a clear error."""
    block = tuple(table.shape[1:])
    expected = idx.size * int(np.prod(block, dtype=np.int64))
    if np.size(rows) != expected:
        raise ctx.fail(f"{what} has shape {np.shape(rows)}, expected {idx.size} rows of "
                       f"shape {block}")
    return np.asarray(rows).reshape((idx.size, *block))
