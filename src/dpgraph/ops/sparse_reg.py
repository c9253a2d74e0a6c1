"""Sparse feature dropout and in-place row regularizers (Caffe2's
sparse_dropout_with_replacement_op, sparse_itemwise_dropout_with_replacement_op,
sparse_lp_regularizer_op and sparse_normalize_op).

* ``SparseDropoutWithReplacement`` [X (int64 ids), Lengths] -> [Y, OutputLengths]: each
  example (a Lengths segment) is dropped with probability ``ratio`` and replaced by the single
  id ``replacement_value`` (its length becomes 1).
* ``SparseItemwiseDropoutWithReplacement``: each id is replaced independently; lengths keep.
* ``SparseLpRegularizer`` [param, indices(, grad)] -> param, in place: the indexed rows are
  shrunk by ``(1 - reg_lambda)`` (``p=2``) or soft-thresholded by ``reg_lambda`` (``p=1``).
* ``SparseNormalize`` / ``Float16SparseNormalize`` [param, indices(, grad)] -> param, in
  place: the indexed rows are rescaled to L2 norm ``norm`` (with ``use_max_norm``, default
  on, only rows whose norm exceeds it).

Rows named twice are processed twice, one after the other, as Caffe2's loop does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import host, like_inputs
from dpgraph.ops._sparse_rows import check_indices, occurrence_layers, writable
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.index import ENFORCE_INPLACE
from dpgraph.proto import caffe2_pb2

_EPS = np.float32(1e-12)


# --- dropout with replacement ------------------------------------------------------------------
def _dropout_inputs(ctx: OpContext) -> tuple[np.ndarray, np.ndarray, float, int]:
    x, lengths = host(ctx.inputs[0]), host(ctx.inputs[1])
    if x.ndim != 1 or lengths.ndim != 1:
        raise ctx.fail(f"X and Lengths must be 1-D, got shapes {x.shape} and {lengths.shape}")
    if x.dtype.kind not in "iu" or lengths.dtype.kind not in "iu":
        raise ctx.fail(f"X must hold int64 ids and Lengths int32, got {x.dtype} and "
                       f"{lengths.dtype}")
    if int(lengths.sum()) != x.size:
        raise ctx.fail(f"Lengths sum to {int(lengths.sum())} but X has {x.size} ids")
    ratio = ctx.float_arg("ratio", 0.0)
    if not 0.0 <= ratio <= 1.0:
        raise ctx.fail(f"ratio must be a probability in [0, 1], got {ratio}")
    return (x.astype(np.int64), lengths.astype(np.int32), ratio,
            ctx.int_arg("replacement_value", 0))


def _dropout_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    lengths = shapes[1]
    return [None, None if lengths is None else (tuple(lengths), caffe2_pb2.TensorProto.INT32)]


@register_op("SparseDropoutWithReplacement", inputs=2, outputs=2, shape=_dropout_shape)
def sparse_dropout_with_replacement(ctx: OpContext) -> Outputs:
    """Drop whole examples: a dropped segment becomes ``[replacement_value]``."""
    x, lengths, ratio, replacement = _dropout_inputs(ctx)
    keep = ctx.rng.random(lengths.size) < 1.0 - ratio
    out_lengths = np.where(keep, lengths, 1).astype(np.int32)
    starts = np.cumsum(lengths) - lengths
    pieces = [x[s:s + n] if k else np.array([replacement], np.int64)
              for s, n, k in zip(starts, lengths, keep)]
    y = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    return y.astype(np.int64, copy=False), out_lengths


@register_op("SparseItemwiseDropoutWithReplacement", inputs=2, outputs=2,
             shape=_dropout_shape)
def sparse_itemwise_dropout_with_replacement(ctx: OpContext) -> Outputs:
    """Drop single ids: each becomes ``replacement_value`` with probability ``ratio``."""
    x, lengths, ratio, replacement = _dropout_inputs(ctx)
    keep = ctx.rng.random(x.size) < 1.0 - ratio
    return np.where(keep, x, np.int64(replacement)), lengths.copy()


for _type in ("SparseDropoutWithReplacement", "SparseItemwiseDropoutWithReplacement"):
    register_gradient(_type)(no_gradient)


# --- in-place row regularizers -----------------------------------------------------------------
def _rows_setup(ctx: OpContext, dtype: Any) -> tuple[Any, np.ndarray, list[np.ndarray]]:
    """(writable param, flat indices, duplicate-free layers of index positions)."""
    param = ctx.inputs[0]
    if param.dtype != dtype:
        raise ctx.fail(f"param must be {np.dtype(dtype).name}, got {param.dtype}")
    if param.ndim < 1:
        raise ctx.fail("param must have a leading row dimension, got a scalar")
    idx = check_indices(ctx, ctx.inputs[1], param.shape[0])
    return writable(ctx, param, 0, 0), idx, occurrence_layers(idx)


@register_op("SparseLpRegularizer", inputs=(2, 3), outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def sparse_lp_regularizer(ctx: OpContext) -> Outputs:
    """Shrink the indexed rows: ×(1 - λ) for p=2, soft threshold by λ for p=1."""
    p, lam = ctx.float_arg("p", 2.0), np.float32(ctx.float_arg("reg_lambda", 1e-5))
    if p not in (1.0, 2.0):
        raise ctx.fail(f"p must be 1.0 or 2.0 (L1 or L2 regularization), got {p}")
    if not 0.0 < lam < 1.0:
        raise ctx.fail(f"reg_lambda must lie in (0, 1), got {lam}")
    out, idx, layers = _rows_setup(ctx, np.float32)
    for layer in layers:
        rows = out[idx[layer]]
        if p == 2.0:
            rows = rows * (np.float32(1.0) - lam)
        else:
            rows = np.where(rows < -lam, rows + lam, np.where(rows > lam, rows - lam, 0))
        out[idx[layer]] = rows.astype(np.float32, copy=False)
    return (out,)


def _normalize(ctx: OpContext, dtype: Any) -> Outputs:
    norm = np.float32(ctx.float_arg("norm", 1.0))
    if norm < 0:
        raise ctx.fail(f"norm must be >= 0, got {norm}")
    use_max = bool(ctx.int_arg("use_max_norm", 1))
    out, idx, layers = _rows_setup(ctx, dtype)
    for layer in layers:
        rows = out[idx[layer]]
        flat = rows.reshape(rows.shape[0], -1).astype(np.float32)
        norms = np.sqrt((flat * flat).sum(axis=1))
        scale = (norm / (norms + _EPS)).astype(np.float32)
        if use_max:
            scale = np.where(norms <= norm, np.float32(1.0), scale)
        scale = scale.reshape((-1,) + (1,) * (rows.ndim - 1))
        out[idx[layer]] = (rows * scale.astype(dtype)).astype(dtype, copy=False)
    return (out,)


@register_op("SparseNormalize", inputs=(2, 3), outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def sparse_normalize(ctx: OpContext) -> Outputs:
    """Rescale the indexed float rows to L2 norm ``norm`` (``use_max_norm``: cap only)."""
    return _normalize(ctx, np.float32)


@register_op("Float16SparseNormalize", inputs=(2, 3), outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def float16_sparse_normalize(ctx: OpContext) -> Outputs:
    """SparseNormalize for float16 params (norms in float32)."""
    return _normalize(ctx, np.float16)


for _type in ("SparseLpRegularizer", "SparseNormalize", "Float16SparseNormalize"):
    OPERATORS.lookup(_type).extra[ENFORCE_INPLACE] = ((0, 0),)
for _type in ("SparseNormalize", "Float16SparseNormalize"):
    register_gradient(_type)(no_gradient)
