"""``SparseToDenseMask``: sparse (id, value) features to dense columns picked by a mask.

``[INDICES, VALUES, DEFAULT(, LENGTHS)]`` with ``mask=[id_0, id_1, ...]``: output column
``j`` of a row holds the value whose index is ``mask[j]`` (the last one when a row repeats
an id), ``DEFAULT`` elsewhere.  Without LENGTHS all entries form one row and the row
dimension is dropped.  Ids not in the mask are ignored; negative ids are skipped with a
warning, and, as in Caffe2, the operator instance counts the rows it skipped over all its
runs and fails once that count reaches ``max_skipped_indices`` (default 50).
``return_presence_mask=True`` adds a bool output marking the columns that were filled.
The gradient op routes each column's gradient back to the entry that filled it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

log = logging.getLogger("dpgraph.ops")

#: Per-instance state kept in the instance's own args dict (no argument name can clash).
_MASK = "\0mask_lookup"
_SKIPPED_ROWS = "\0skipped_rows"


class _MaskLookup:
    """Maps feature ids to their mask column (-1 when absent), vectorised."""

    def __init__(self, ctx: OpContext) -> None:
        mask = [int(i) for i in ctx.ints_arg("mask")]
        if not mask:
            raise ArgumentError(ctx.describe(
                "SparseToDenseMask needs a non-empty 'mask' argument: the ids to keep, "
                "one output column each."))
        negative = [i for i in mask if i < 0]
        if negative:
            raise ArgumentError(ctx.describe(
                f"mask ids must be >= 0; got {negative[0]}. Remove it from 'mask'."))
        if len(set(mask)) != len(mask):
            twice = next(i for i in mask if mask.count(i) > 1)
            raise ArgumentError(ctx.describe(
                f"mask id {twice} appears twice; each id may name one column only."))
        self.width = len(mask)
        ids = np.asarray(mask, dtype=np.int64)
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]

    def columns(self, ids: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self._sorted, ids)
        found = pos < self.width
        found[found] = self._sorted[pos[found]] == ids[found]
        return np.where(found, self._order[np.minimum(pos, self.width - 1)], -1)


def _lookup(ctx: OpContext) -> _MaskLookup:
    lookup = ctx.args.get(_MASK)
    if lookup is None:
        lookup = ctx.args[_MASK] = _MaskLookup(ctx)
    return lookup


def _rows(ctx: OpContext, n: int, lengths_index: int) -> np.ndarray:
    """The row of every entry: from LENGTHS when given, else all in row 0."""
    if len(ctx.inputs) <= lengths_index:
        return np.zeros(n, dtype=np.int64)
    lengths = host(ctx.inputs[lengths_index]).reshape(-1).astype(np.int64)
    if lengths.size and int(lengths.min()) < 0:
        raise ctx.fail(f"LENGTHS must be non-negative, got {lengths.tolist()}")
    if int(lengths.sum()) != n:
        raise ctx.fail(f"LENGTHS sum to {int(lengths.sum())} but INDICES has {n} entries; "
                       f"they must match.")
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)


def _winners(rows: np.ndarray, columns: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(entry, cell)`` for each filled cell: the last entry naming it."""
    valid = np.flatnonzero(columns >= 0)[::-1]
    cells = rows[valid] * width + columns[valid]
    cells, first = np.unique(cells, return_index=True)
    return valid[first], cells


def _count_skipped_rows(ctx: OpContext, indices: np.ndarray, rows: np.ndarray) -> None:
    bad = indices < 0
    if not bad.any():
        return
    skipped_rows = np.unique(rows[bad]).size
    log.warning("%s: skipping %d invalid (negative) sparse indices",
                ctx.describe("SparseToDenseMask"), int(bad.sum()))
    total = ctx.args.get(_SKIPPED_ROWS, 0) + skipped_rows
    ctx.args[_SKIPPED_ROWS] = total
    limit = ctx.int_arg("max_skipped_indices", 50)
    if total >= limit:
        raise ctx.fail(
            f"Too many rows with invalid sparse indices skipped: {total} over this "
            f"operator's runs (max_skipped_indices={limit}). Fix the negative ids in "
            f"INDICES or raise max_skipped_indices.")


@register_op("SparseToDenseMask", inputs=(3, 4), outputs=(1, 2))
def sparse_to_dense_mask(ctx: OpContext) -> Outputs:
    """[INDICES, VALUES, DEFAULT(, LENGTHS)] -> [dense(, presence_mask)]; args mask,
    max_skipped_indices (50), return_presence_mask (False)."""
    lookup = _lookup(ctx)
    indices = host(ctx.inputs[0]).reshape(-1).astype(np.int64)
    values, default = np.asarray(host(ctx.inputs[1])), np.asarray(host(ctx.inputs[2]))
    if values.shape[:1] != (indices.size,):
        raise ctx.fail(f"VALUES must have one row per index ({indices.size}), got shape "
                       f"{values.shape}")
    block = values.shape[1:]
    if default.size != int(np.prod(block, dtype=np.int64)):
        raise ctx.fail(f"DEFAULT must hold one value block of shape {block}, got shape "
                       f"{default.shape}")
    rows = _rows(ctx, indices.size, 3)
    _count_skipped_rows(ctx, indices, rows)
    n_rows = int(host(ctx.inputs[3]).size) if len(ctx.inputs) > 3 else 1
    dense = np.empty((n_rows * lookup.width, *block), dtype=values.dtype)
    dense[...] = default.reshape(block)
    entries, cells = _winners(rows, lookup.columns(indices), lookup.width)
    dense[cells] = values[entries]
    lead = (n_rows, lookup.width) if len(ctx.inputs) > 3 else (lookup.width,)
    outputs: list[Any] = [dense.reshape(*lead, *block)]
    if ctx.num_outputs > 1:
        if not ctx.int_arg("return_presence_mask", 0):
            raise ArgumentError(ctx.describe(
                "a second output (the presence mask) needs return_presence_mask=True."))
        presence = np.zeros(n_rows * lookup.width, dtype=bool)
        presence[cells] = True
        outputs.append(presence.reshape(lead))
    return tuple(outputs)


@register_op("SparseToDenseMaskGradient", inputs=(2, 3), outputs=1)
def sparse_to_dense_mask_gradient(ctx: OpContext) -> Outputs:
    """[INDICES, dOUTPUT(, LENGTHS)] -> dVALUES: each cell's gradient goes to the entry
    that filled it, zeros elsewhere."""
    lookup = _lookup(ctx)
    indices = host(ctx.inputs[0]).reshape(-1).astype(np.int64)
    grad = np.asarray(host(ctx.inputs[1]))
    rows = _rows(ctx, indices.size, 2)
    n_rows = int(host(ctx.inputs[2]).size) if len(ctx.inputs) > 2 else 1
    flat = grad.reshape(n_rows * lookup.width, -1)
    block = grad.shape[2:] if len(ctx.inputs) > 2 else grad.shape[1:]
    d_values = np.zeros((indices.size, flat.shape[1]), dtype=grad.dtype)
    entries, cells = _winners(rows, lookup.columns(indices), lookup.width)
    d_values[entries] = flat[cells]
    return (d_values.reshape(indices.size, *block),)


@register_gradient("SparseToDenseMask")
def _sparse_to_dense_mask_grad(g: GradientBuilder) -> None:
    inputs = [g.I(0), g.GO(0)] + ([g.I(3)] if len(g.op.input) > 3 else [])
    g.add("SparseToDenseMaskGradient", inputs, [g.GI(1)])
