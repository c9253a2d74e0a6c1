"""Embedding lookups over row-wise quantized tables (Caffe2's lengths reducers on 8-bit and
N-bit data; no gradients, as in Caffe2).

* ``SparseLengths{Sum,WeightedSum,Mean}Fused8BitRowwise`` and ``...Fused{4,2}BitRowwise``:
  ``[DATA, (WEIGHTS,) INDICES, LENGTHS]`` over a fused table
  (:mod:`dpgraph.ops._rowwise_format`) -> float32 [len(LENGTHS), block].
* ``SparseLengths{Sum,WeightedSum,Mean}{8,4,2}BitRowwiseSparse``: the same with a last input
  ``COMPRESSED_INDICES_MAPPING`` from full row ids to rows of a pruned table (-1: pruned,
  the row adds nothing but still counts for the mean); the mapping ``[0]`` means "not
  pruned".  The 8-bit table has float32 scale/bias, the N-bit ones float16.
* ``SparseLengths{Sum,WeightedSum,Mean,WeightedMean}8BitsRowwise``:
  ``[DATA, (WEIGHTS,) INDICES, LENGTHS, scale_bias]`` over unfused uint8 rows.
* ``SparseLengthsSumSparseLookup``: ``[INDICES, LENGTHS, MAPPING(, WEIGHTS)]`` -> the
  indices, lengths (and weights) with pruned rows dropped and ids remapped.
* ``GatherFused8BitRowwise``: ``[DATA, INDICES]`` -> the dequantized rows.

Every reducer accumulates as Caffe2's (fbgemm's) kernels do, in float32 and in index order
within each segment: with ``s = w · scale`` and ``b = w · bias``,
``acc = fma(s, q, acc + b)``; a mean multiplies by ``1 / length`` (empty segments give 0).
So an N-bit table and its "fake" 8-bit twin give bitwise equal sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import FLOAT, ShapeResult, host
from dpgraph.ops._rowwise_format import F32, fused_input, per_byte, split, typed_input, unpack
from dpgraph.ops._sparse_rows import integer_indices
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.quantize_rowwise import check_scale_bias

Codes = Callable[[np.ndarray], np.ndarray]


# --- checks --------------------------------------------------------------------------------
def _vector(ctx: OpContext, index: int, what: str) -> np.ndarray:
    value = integer_indices(ctx, ctx.inputs[index], what)
    if value.ndim != 1:
        raise ctx.fail(f"{what} ({ctx.input_name(index)}) must be a vector, got shape "
                       f"{tuple(value.shape)}")
    return value


def _lengths(ctx: OpContext, index: int, total: int) -> np.ndarray:
    lens = _vector(ctx, index, "LENGTHS")
    if lens.size and int(lens.min()) < 0:
        raise ctx.fail(f"LENGTHS ({ctx.input_name(index)}) must be non-negative")
    if int(lens.sum()) != total:
        raise ctx.fail(f"Your input seems to be incorrect: the sum of lengths values "
                       f"({int(lens.sum())}) should be the size of the indices tensor "
                       f"({total}), but it appears not")
    return lens


def _in_range(ctx: OpContext, idx: np.ndarray, size: int, what: str = "Index") -> None:
    bad = np.flatnonzero((idx < 0) | (idx >= size))
    if bad.size:
        raise ctx.fail(f"{what} {int(bad[0])} is out of bounds: {int(idx[bad[0]])}, range 0 "
                       f"to {size}")


def _weights(ctx: OpContext, index: int, count: int) -> np.ndarray:
    w = host(ctx.inputs[index])
    if w.ndim != 1 or w.size != count:
        raise ctx.fail(f"WEIGHTS ({ctx.input_name(index)}) must be a vector with one weight "
                       f"per index ({count}), got shape {tuple(w.shape)}")
    return w.astype(F32, copy=False)


# --- the accumulation ----------------------------------------------------------------------
def _fma_step(acc: np.ndarray, scale: np.ndarray, codes: np.ndarray, bias: np.ndarray
              ) -> None:
    """``acc = fma(scale, codes, acc + bias)`` in place, float32 rounding at each step (the
    product of a float32 and an 8-bit code is exact in float64, so one cast rounds once)."""
    np.add(acc, bias[:, None], out=acc)
    product = codes.astype(np.float64)
    product *= scale.astype(np.float64)[:, None]
    product += acc
    acc[...] = product


def embedding_sum(codes: Codes, scale: np.ndarray, bias: np.ndarray, rows: np.ndarray,
                  lens: np.ndarray, block: int, weights: np.ndarray | None = None,
                  mean: bool = False, keep: np.ndarray | None = None) -> np.ndarray:
    """Per segment, ``Σ w · (scale[r] · codes(r) + bias[r])`` over its ``rows`` in order
    (positions with ``keep`` False add nothing); float32 [len(lens), block].

    Step ``k`` adds the k-th row of every segment at least ``k + 1`` long; segments are
    visited longest first, so those are a prefix of the accumulator."""
    order = np.argsort(-lens, kind="stable")
    longest_first = lens[order]
    starts = (np.cumsum(lens) - lens)[order]
    ascending = longest_first[::-1]
    acc = np.zeros((lens.size, block), dtype=F32)
    for k in range(int(longest_first[0]) if lens.size else 0):
        count = lens.size - int(np.searchsorted(ascending, k, side="right"))
        pos = starts[:count] + k
        target: Any = slice(0, count)
        if keep is not None and not keep[pos].all():
            target = np.flatnonzero(keep[pos])
            pos = pos[target]
        r = rows[pos]
        w = F32(1) if weights is None else weights[pos]
        part = acc[target]
        _fma_step(part, (w * scale[r]).astype(F32), codes(r), (w * bias[r]).astype(F32))
        if not isinstance(target, slice):
            acc[target] = part
    if mean:
        full = np.flatnonzero(longest_first)
        acc[full] *= (F32(1) / longest_first[full].astype(F32))[:, None]
    out = np.empty_like(acc)
    out[order] = acc
    return out


def _lengths_shape(columns: Callable[[int], int]) -> Callable[..., ShapeResult]:
    def infer(op: Any, shapes: list, types: list) -> ShapeResult:
        data = shapes[0]
        lengths = shapes[3 if "Weighted" in op.type else 2]
        if data is None or lengths is None or len(data) < 2 or not lengths:
            return [None]
        return [((lengths[0], columns(int(data[1]))), FLOAT)]

    return infer


def _fused_table(ctx: OpContext, sb_dtype: Any, bits: int, lookups: int
                 ) -> tuple[Codes, np.ndarray, np.ndarray, int]:
    """(codes of rows, scale, bias, block) of the 2-D fused table input 0; packed codes are
    unpacked once up front when the table has no more rows than there are ``lookups``."""
    table = fused_input(ctx, 0, sb_dtype, dims=2)
    data, scale, bias = split(table, sb_dtype)
    block = data.shape[1] * per_byte(bits)
    if bits == 8:
        return (lambda r: data[r]), scale, bias, block
    if table.shape[0] <= lookups:
        codes = unpack(data, bits, block)
        return (lambda r: codes[r]), scale, bias, block
    return (lambda r: unpack(data[r], bits, block)), scale, bias, block


def _inputs(ctx: OpContext, weighted: bool) -> tuple[np.ndarray, np.ndarray, Any]:
    """(indices, lengths, weights or None) of a ``[DATA, (WEIGHTS,) INDICES, LENGTHS]`` op."""
    idx = _vector(ctx, 1 + weighted, "INDICES")
    lens = _lengths(ctx, 2 + weighted, idx.size)
    return idx, lens, _weights(ctx, 1, idx.size) if weighted else None


def _variants(name: str) -> list[tuple[str, bool, bool]]:
    """(op type, weighted, mean) for ``SparseLengths{Sum,WeightedSum,Mean}<name>``."""
    return [(f"SparseLengths{kind}{name}", kind == "WeightedSum", kind == "Mean")
            for kind in ("Sum", "WeightedSum", "Mean")]


# --- fused tables --------------------------------------------------------------------------
def _register_fused(name: str, bits: int, sb_dtype: Any) -> None:
    width = 2 * np.dtype(sb_dtype).itemsize
    for op_type, weighted, mean in _variants(name):
        @register_op(op_type, inputs=3 + weighted, outputs=1,
                     shape=_lengths_shape(lambda c: (c - width) * per_byte(bits)))
        def kernel(ctx: OpContext, weighted: bool = weighted, mean: bool = mean) -> Outputs:
            """Segment sums (weighted, or means) of dequantized fused-table rows."""
            idx, lens, w = _inputs(ctx, weighted)
            codes, scale, bias, block = _fused_table(ctx, sb_dtype, bits, idx.size)
            _in_range(ctx, idx, scale.size)
            return (embedding_sum(codes, scale, bias, idx, lens, block, w, mean),)


def _register_rowwise_sparse(bits: int) -> None:
    sb_dtype = np.float32 if bits == 8 else np.float16
    width = 2 * np.dtype(sb_dtype).itemsize
    for op_type, weighted, mean in _variants(f"{bits}BitRowwiseSparse"):
        @register_op(op_type, inputs=4 + weighted, outputs=1,
                     shape=_lengths_shape(lambda c: (c - width) * per_byte(bits)))
        def kernel(ctx: OpContext, weighted: bool = weighted, mean: bool = mean) -> Outputs:
            """Segment sums over a pruned fused table, ids mapped by the last input."""
            idx, lens, w = _inputs(ctx, weighted)
            codes, scale, bias, block = _fused_table(ctx, sb_dtype, bits, idx.size)
            mapping = _vector(ctx, 3 + weighted, "COMPRESSED_INDICES_MAPPING")
            if mapping.size == 1 and mapping[0] == 0:  # Caffe2: not pruned
                _in_range(ctx, idx, scale.size)
                return (embedding_sum(codes, scale, bias, idx, lens, block, w, mean),)
            _in_range(ctx, idx, mapping.size)
            rows = mapping[idx]
            keep = rows != -1
            _in_range(ctx, rows[keep], scale.size, "Kept compressed index")
            return (embedding_sum(codes, scale, bias, rows, lens, block, w, mean, keep),)


def _register_8bits_rowwise() -> None:
    for kind, weighted, mean in (("Sum", False, False), ("WeightedSum", True, False),
                                 ("Mean", False, True), ("WeightedMean", True, True)):
        @register_op(f"SparseLengths{kind}8BitsRowwise", inputs=4 + weighted, outputs=1,
                     shape=_unfused_shape)
        def kernel(ctx: OpContext, weighted: bool = weighted, mean: bool = mean) -> Outputs:
            """Segment sums (weighted, means) of unfused uint8 rows · scale + bias."""
            data = typed_input(ctx, 0, np.uint8)
            sb = check_scale_bias(ctx, 3 + weighted, data.shape[0])
            idx, lens, w = _inputs(ctx, weighted)
            _in_range(ctx, idx, data.shape[0])
            rows = data.reshape(data.shape[0], int(np.prod(data.shape[1:], dtype=np.int64)))
            out = embedding_sum(lambda r: rows[r], sb[:, 0].astype(F32), sb[:, 1].astype(F32),
                                idx, lens, rows.shape[1], w, mean)
            return (out.reshape(lens.size, *data.shape[1:]),)


def _unfused_shape(op: Any, shapes: list, types: list) -> ShapeResult:
    data, lengths = shapes[0], shapes[3 if "Weighted" in op.type else 2]
    if data is None or lengths is None or not data or not lengths:
        return [None]
    return [((lengths[0], *data[1:]), FLOAT)]


# --- gather and the lookup rewrite ---------------------------------------------------------
@register_op("GatherFused8BitRowwise", inputs=2, outputs=1,
             shape=lambda op, shapes, types: [
                 None if shapes[0] is None or shapes[1] is None or len(shapes[0]) != 2
                 else ((shapes[1][0], shapes[0][1] - 8), FLOAT)])
def gather_fused_8bit_rowwise(ctx: OpContext) -> Outputs:
    """[DATA uint8 [N, C + 8], INDICES [K]] -> float32 [K, C]: the rows dequantized."""
    idx = _vector(ctx, 1, "INDICES")
    codes, scale, bias, block = _fused_table(ctx, np.float32, 8, idx.size)
    bad = np.flatnonzero((idx < 0) | (idx >= scale.size))
    if bad.size:
        raise ctx.fail(f"INDICES element is out of DATA bounds, id={int(idx[bad[0]])} "
                       f"data_dim={scale.size}")
    return ((codes(idx).astype(F32) * scale[idx, None] + bias[idx, None]).astype(F32),)


@register_op("SparseLengthsSumSparseLookup", inputs=(3, 4), outputs=(2, 3))
def sparse_lengths_sum_sparse_lookup(ctx: OpContext) -> Outputs:
    """[INDICES, LENGTHS, MAPPING(, WEIGHTS)] -> [indices, lengths(, weights)] with pruned
    (-1) rows dropped and the others remapped."""
    raw = host(ctx.inputs[0])
    idx = _vector(ctx, 0, "INDICES")
    lens = _lengths(ctx, 1, idx.size)
    mapping = _vector(ctx, 2, "COMPRESSED_INDICES_MAPPING")
    _in_range(ctx, idx, mapping.size)
    mapped = mapping[idx]
    keep = mapped != -1
    seg = np.repeat(np.arange(lens.size), lens)
    new_lens = np.bincount(seg[keep], minlength=lens.size).astype(np.int32)
    outputs: list[Any] = [mapped[keep].astype(raw.dtype), new_lens]
    if ctx.num_inputs > 3:
        outputs.append(_weights(ctx, 3, idx.size)[keep])
    return outputs[:ctx.num_outputs]


_register_fused("Fused8BitRowwise", 8, np.float32)
_register_fused("Fused4BitRowwise", 4, np.float16)
_register_fused("Fused2BitRowwise", 2, np.float16)
for _bits in (8, 4, 2):
    _register_rowwise_sparse(_bits)
_register_8bits_rowwise()


def _no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _type in OPERATORS.types():
    _schema = OPERATORS.get(_type)
    if _schema is not None and _schema.kernel.__module__ == __name__ and \
            _type != "GatherFused8BitRowwise":  # Caffe2 declares no NO_GRADIENT for it
        register_gradient(_type)(_no_gradient)
