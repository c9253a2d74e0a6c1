"""Caffe2's row-wise quantization conversions (no gradients, as in Caffe2).

Fused tables (byte layout in :mod:`dpgraph.ops._rowwise_format`); every leading dimension is
a row, the last one the columns, unless noted:

* ``FloatToFused8BitRowwiseQuantized`` / ``HalfFloatToFused8BitRowwiseQuantized``: per row
  ``scale = range / 255``, ``bias = min`` (float32), codes
  ``lrint((x - min) · 255 / (range + 1e-8))``; ``Fused8BitRowwiseQuantizedToFloat`` /
  ``...ToHalfFloat`` give ``q · scale + bias``.
* ``...HalfScaleBias`` variants and ``FloatToFused{4,2}BitRowwiseQuantized`` /
  ``HalfToFused{4,2}BitRowwiseQuantized``: ``bias = fp16(min)``,
  ``scale = fp16((max - bias) / (2**bits - 1))`` (1 when the range is 0, the scale rounds
  to 0, or its inverse overflows), codes ``clip(lrint((x - bias) / scale), 0, 2**bits - 1)``
  packed ``8 // bits`` to a byte; ``engine="GREEDY"`` picks the range by Caffe2's greedy
  L2 search (:mod:`dpgraph.ops._rowwise_greedy`).  ``Fused8BitRowwiseQuantizedHalfScaleBias
  ToHalfFloat`` returns float32, as Caffe2's does.
* ``FloatToFused{4,2}BitFakeRowwiseQuantized`` / ``HalfToFused{4,2}BitFakeRowwiseQuantized``
  (2-D input): the N-bit codes, one per byte, with float32 scale and bias: an 8-bit fused
  table the ``...Fused8BitRowwise`` lookups read.

Unfused: ``FloatToRowwiseQuantized8Bits`` -> ``[codes, scale_bias]`` (rows are the first
dimension; ``scale = range / 255``, codes rounded half away from zero; a row whose range is
below 1e-10 gets scale 1 and codes 0) and ``Rowwise8BitQuantizedToFloat``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import FLOAT, FLOAT16, ShapeResult, host
from dpgraph.ops._rowwise_format import (
    F32,
    as_rows,
    fuse,
    fused_input,
    half,
    pack,
    packed_columns,
    per_byte,
    split,
    typed_input,
    unpack,
    unrows,
)
from dpgraph.ops._rowwise_greedy import greedy_range
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

UINT8: int = caffe2_pb2.TensorProto.UINT8
_SOURCES = {"Float": (np.float32, "FloatTo"), "Half": (np.float16, "HalfTo"),
            "HalfFloat": (np.float16, "HalfFloatTo")}


# --- the quantizers ------------------------------------------------------------------------
def _codes(values: np.ndarray, qmax: float) -> np.ndarray:
    """Round to nearest even (``lrintf``), clip to ``[0, qmax]``; NaN gives 0."""
    with np.errstate(invalid="ignore"):
        codes = np.clip(np.rint(values), F32(0), F32(qmax))
    return np.nan_to_num(codes, nan=0.0).astype(np.uint8)


def quantize_8bit_float_sb(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 rows -> (codes, scale, bias) of the float-scale 8-bit format."""
    lo, hi = x.min(axis=1), x.max(axis=1)
    span = (hi - lo).astype(F32)
    scale = (span / F32(255)).astype(F32)
    inverse = (F32(255) / (span + F32(1e-8))).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        return _codes((x - lo[:, None]) * inverse[:, None], 255), scale, lo


def nbit_scale(lo: np.ndarray, hi: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, inverse) for the float16-scale formats, with Caffe2's fallbacks to 1."""
    span = (hi - lo).astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.where(span == 0, F32(1), half(span / F32((1 << bits) - 1))).astype(F32)
        scale[scale == 0] = 1
        inverse = (F32(1) / scale).astype(F32)
    bad = np.isinf(inverse)
    scale[bad], inverse[bad] = 1, 1
    return scale, inverse


def quantize_nbit(x: np.ndarray, bits: int, greedy: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 rows -> (codes, scale, bias) with float16-exact scale and bias."""
    lo, hi = greedy_range(x, bits) if greedy else (x.min(axis=1), x.max(axis=1))
    lo = half(lo)
    scale, inverse = nbit_scale(lo, hi, bits)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = _codes((x - lo[:, None]) * inverse[:, None], (1 << bits) - 1)
    return codes, scale, lo


def dequantize(codes: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``codes · scale + bias`` per row, float32."""
    return (codes.astype(F32) * scale[:, None] + bias[:, None]).astype(F32)


# --- shapes --------------------------------------------------------------------------------
def _last_dim_shape(columns: Callable[[int], int], dtype: int) -> Callable[..., ShapeResult]:
    def infer(op: Any, shapes: list, types: list) -> ShapeResult:
        if shapes[0] is None or not shapes[0]:
            return [None]
        return [((*shapes[0][:-1], columns(int(shapes[0][-1]))), dtype)]

    return infer


def _input_rows(ctx: OpContext, dtype: Any, bits: int) -> np.ndarray:
    x = typed_input(ctx, 0, dtype)
    if x.shape[-1] == 0 and as_rows(x).shape[0] > 0:
        raise ctx.fail(f"input {ctx.input_name(0)} has rows but no columns: nothing to take "
                       "a row minimum and maximum of")
    if bits < 8 and x.shape[-1] % per_byte(bits):
        raise ctx.fail(f"the number of columns ({x.shape[-1]}) must be a multiple of "
                       f"{per_byte(bits)} for {bits}-bit quantization")
    return x


# --- fused 8-bit, float scale and bias -----------------------------------------------------
def _register_8bit(source: str) -> None:
    dtype, prefix = _SOURCES[source]

    @register_op(f"{prefix}Fused8BitRowwiseQuantized", inputs=1, outputs=1,
                 shape=_last_dim_shape(lambda c: c + 8, UINT8))
    def kernel(ctx: OpContext) -> Outputs:
        """X [..., C] -> uint8 [..., C + 8]: codes, float32 scale, float32 bias."""
        x = _input_rows(ctx, dtype, 8)
        codes, scale, bias = quantize_8bit_float_sb(as_rows(x).astype(F32))
        return (unrows(fuse(codes, scale, bias, np.float32), x),)


def _register_8bit_half_sb(source: str) -> None:
    dtype, prefix = _SOURCES[source]

    @register_op(f"{prefix}Fused8BitRowwiseQuantizedHalfScaleBias", inputs=1, outputs=1,
                 shape=_last_dim_shape(lambda c: c + 4, UINT8))
    def kernel(ctx: OpContext) -> Outputs:
        """X [..., C] -> uint8 [..., C + 4]: codes, float16 scale, float16 bias."""
        x = _input_rows(ctx, dtype, 8)
        codes, scale, bias = quantize_nbit(as_rows(x).astype(F32), 8, greedy=False)
        return (unrows(fuse(codes, scale, bias, np.float16), x),)


def _register_dequantize(op_type: str, bits: int, sb_dtype: Any, out_dtype: Any) -> None:
    width, per = 2 * np.dtype(sb_dtype).itemsize, per_byte(bits)
    out_code = FLOAT16 if out_dtype == np.float16 else FLOAT

    @register_op(op_type, inputs=1, outputs=1,
                 shape=_last_dim_shape(lambda c: (c - width) * per, out_code))
    def kernel(ctx: OpContext) -> Outputs:
        """Fused uint8 table -> the dequantized values."""
        table = fused_input(ctx, 0, sb_dtype, need_data=False)
        data, scale, bias = split(as_rows(table), sb_dtype)
        values = dequantize(unpack(data, bits, data.shape[1] * per), scale, bias)
        return (unrows(values.astype(out_dtype), table),)


# --- fused N-bit ---------------------------------------------------------------------------
def _greedy(ctx: OpContext) -> bool:
    return (ctx.op.engine or "").upper() == "GREEDY"


def _register_nbit(source: str, bits: int) -> None:
    dtype, prefix = _SOURCES[source]

    @register_op(f"{prefix}Fused{bits}BitRowwiseQuantized", inputs=1, outputs=1,
                 shape=_last_dim_shape(lambda c: packed_columns(c, bits) + 4, UINT8))
    def kernel(ctx: OpContext) -> Outputs:
        """X [..., C] -> uint8 [..., C·bits/8 + 4]: packed codes, float16 scale and bias
        (``engine="GREEDY"``: the greedy range)."""
        x = _input_rows(ctx, dtype, bits)
        codes, scale, bias = quantize_nbit(as_rows(x).astype(F32), bits, _greedy(ctx))
        return (unrows(fuse(pack(codes, bits), scale, bias, np.float16), x),)


def _register_fake(source: str, bits: int) -> None:
    dtype, prefix = _SOURCES[source]

    @register_op(f"{prefix}Fused{bits}BitFakeRowwiseQuantized", inputs=1, outputs=1,
                 shape=_last_dim_shape(lambda c: c + 8, UINT8))
    def kernel(ctx: OpContext) -> Outputs:
        """X [R, C] -> uint8 [R, C + 8]: the N-bit codes one per byte, float32 scale and
        bias (readable by the Fused8BitRowwise ops)."""
        x = typed_input(ctx, 0, dtype)
        if x.ndim != 2:
            raise ctx.fail(f"input {ctx.input_name(0)} must be a matrix, got shape "
                           f"{tuple(x.shape)}")
        codes, scale, bias = quantize_nbit(x.astype(F32), bits, _greedy(ctx))
        return (fuse(codes, scale, bias, np.float32),)


# --- unfused 8-bit -------------------------------------------------------------------------
def _round_half_away(values: np.ndarray) -> np.ndarray:
    whole = np.trunc(values)
    return whole + np.sign(values) * (np.abs(values - whole) >= 0.5)


def _rowwise_8bits_shape(op: Any, shapes: list, types: list) -> ShapeResult:
    if shapes[0] is None or not shapes[0]:
        return [None, None]
    return [(tuple(shapes[0]), UINT8), ((shapes[0][0], 2), FLOAT)]


@register_op("FloatToRowwiseQuantized8Bits", inputs=1, outputs=2, shape=_rowwise_8bits_shape)
def float_to_rowwise_quantized_8bits(ctx: OpContext) -> Outputs:
    """X [N, ...] -> (uint8 codes like X, scale_bias [N, 2] float32)."""
    x = typed_input(ctx, 0, np.float32)
    rows = x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))
    lo = rows.min(axis=1) if rows.size else np.zeros(rows.shape[0], F32)
    hi = rows.max(axis=1) if rows.size else lo
    flat = (hi - lo).astype(F32) < F32(1e-10)
    scale = np.where(flat, F32(1), (hi - lo) / F32(255)).astype(F32)
    inverse = (F32(1) / scale).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = _round_half_away((rows - lo[:, None]) * inverse[:, None])
        codes = np.nan_to_num(np.clip(codes, 0, 255), nan=0.0).astype(np.uint8)
    codes[flat] = 0
    return codes.reshape(x.shape), np.stack([scale, lo], axis=1).astype(F32)


@register_op("Rowwise8BitQuantizedToFloat", inputs=2, outputs=1,
             shape=lambda op, shapes, types: [
                 None if shapes[0] is None else (tuple(shapes[0]), FLOAT)])
def rowwise_8bit_quantized_to_float(ctx: OpContext) -> Outputs:
    """[codes [N, ...] uint8, scale_bias [N, 2]] -> float32 ``codes · scale + bias``."""
    codes = typed_input(ctx, 0, np.uint8)
    sb = check_scale_bias(ctx, 1, codes.shape[0])
    rows = codes.reshape(codes.shape[0], int(np.prod(codes.shape[1:], dtype=np.int64)))
    return (dequantize(rows, sb[:, 0], sb[:, 1]).reshape(codes.shape),)


def check_scale_bias(ctx: OpContext, index: int, rows: int) -> np.ndarray:
    """Input ``index``: a float32 [rows, 2] matrix of (scale, bias) pairs."""
    sb = host(ctx.inputs[index])
    if sb.ndim != 2 or sb.shape != (rows, 2):
        raise ctx.fail(f"scale_bias ({ctx.input_name(index)}) must be a [{rows}, 2] matrix "
                       f"(one scale and bias per data row), got shape {tuple(sb.shape)}")
    if sb.dtype != np.float32:
        raise ctx.fail(f"scale_bias ({ctx.input_name(index)}) must be float32, got {sb.dtype}")
    return sb


for _source in ("Float", "HalfFloat"):
    _register_8bit(_source)
    _register_8bit_half_sb(_source)
for _bits in (4, 2):
    for _source in ("Float", "Half"):
        _register_nbit(_source, _bits)
        _register_fake(_source, _bits)
    _register_dequantize(f"Fused{_bits}BitRowwiseQuantizedToFloat", _bits, np.float16,
                         np.float32)
    _register_dequantize(f"Fused{_bits}BitRowwiseQuantizedToHalf", _bits, np.float16,
                         np.float16)
_register_dequantize("Fused8BitRowwiseQuantizedToFloat", 8, np.float32, np.float32)
_register_dequantize("Fused8BitRowwiseQuantizedToHalfFloat", 8, np.float32, np.float16)
_register_dequantize("Fused8BitRowwiseQuantizedHalfScaleBiasToFloat", 8, np.float16,
                     np.float32)
# Caffe2 declares this one's output float32 (its kernel is the ...ToFloat one).
_register_dequantize("Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat", 8, np.float16,
                     np.float32)


def _no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _type in OPERATORS.types():
    _schema = OPERATORS.get(_type)
    if _schema is not None and _schema.kernel.__module__ == __name__:
        register_gradient(_type)(_no_gradient)
