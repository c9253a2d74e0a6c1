"""Byte layout of Caffe2's fused row-wise quantized tables, shared by the conversion ops
(:mod:`dpgraph.ops.quantize_rowwise`) and the lookups that read them
(:mod:`dpgraph.ops.quantized_lookup`).

A fused row is ``[data bytes | scale | bias]``, little-endian:

* 8-bit, float scale/bias (``Fused8BitRowwise``): one byte per value, then two float32
  (8 bytes);
* N-bit (``Fused4BitRowwise``, ``Fused2BitRowwise``, and 8-bit ``HalfScaleBias``): values
  packed ``8 // bits`` to a byte, element ``j`` in byte ``j // per_byte`` at bit
  ``(j % per_byte) * bits``, then two float16 (4 bytes).

All arithmetic is float32, as Caffe2's kernels do it; float16 rounding is numpy's (round to
nearest, ties to even: ``at::Half``'s conversion).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext

F32 = np.float32


def half(values: Any) -> np.ndarray:
    """``values`` rounded to float16 and back to float32 (Caffe2's ``at::Half`` round trip)."""
    return np.asarray(values, dtype=F32).astype(np.float16).astype(F32)


def typed_input(ctx: OpContext, index: int, dtype: Any, min_dims: int = 1) -> np.ndarray:
    """Input ``index`` on the host, checked to be of ``dtype`` with at least ``min_dims``
    dimensions."""
    value = host(ctx.inputs[index])
    if value.dtype != np.dtype(dtype):
        raise ctx.fail(f"input {index} ({ctx.input_name(index)}) must be a "
                       f"{np.dtype(dtype).name} tensor, got {value.dtype}; cast it with "
                       f".astype(np.{np.dtype(dtype).name}) first")
    if value.ndim < min_dims:
        raise ctx.fail(f"input {index} ({ctx.input_name(index)}) must have at least "
                       f"{min_dims} dimension(s), got shape {tuple(value.shape)}")
    return value


def as_rows(value: np.ndarray) -> np.ndarray:
    """``value`` as a matrix: all leading dimensions are rows, the last one columns."""
    if not value.ndim:
        return value.reshape(1, 1)
    return value.reshape(int(np.prod(value.shape[:-1], dtype=np.int64)), value.shape[-1])


def unrows(rows: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Matrix ``rows`` back to ``like``'s leading dimensions (its own last dimension)."""
    return rows.reshape(*like.shape[:-1], rows.shape[1])


def per_byte(bits: int) -> int:
    return 8 // bits


def packed_columns(columns: int, bits: int) -> int:
    """Bytes holding ``columns`` values of ``bits`` bits."""
    return (columns + per_byte(bits) - 1) // per_byte(bits)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [R, C] (each < 2**bits) -> packed bytes [R, ceil(C / per_byte)]."""
    if bits == 8:
        return q.astype(np.uint8, copy=False)
    per = per_byte(bits)
    rows, cols = q.shape
    padded = np.zeros((rows, packed_columns(cols, bits) * per), dtype=np.uint8)
    padded[:, :cols] = q
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    lanes = padded.reshape(rows, padded.shape[1] // per, per) << shifts
    return np.bitwise_or.reduce(lanes, axis=2).astype(np.uint8)


def unpack(data: np.ndarray, bits: int, columns: int) -> np.ndarray:
    """Packed bytes [R, P] -> uint8 codes [R, columns]."""
    if bits == 8:
        return data[:, :columns]
    per = per_byte(bits)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (data[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(data.shape[0], data.shape[1] * per)[:, :columns]


def fuse(data: np.ndarray, scale: np.ndarray, bias: np.ndarray, sb_dtype: Any) -> np.ndarray:
    """[data bytes | scale | bias] rows: scale and bias stored as ``sb_dtype``."""
    sb = np.stack([scale, bias], axis=1).astype(sb_dtype)
    sb_bytes = sb.view(np.uint8).reshape(data.shape[0], 2 * np.dtype(sb_dtype).itemsize)
    return np.concatenate([data, sb_bytes], axis=1)


def split(rows: np.ndarray, sb_dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fused rows [R, C] -> (data bytes [R, C - 2·size], scale [R], bias [R]) as float32."""
    width = 2 * np.dtype(sb_dtype).itemsize
    tail = np.ascontiguousarray(rows[:, rows.shape[1] - width:])
    sb = tail.view(sb_dtype).reshape(rows.shape[0], 2).astype(F32)
    return rows[:, :rows.shape[1] - width], sb[:, 0], sb[:, 1]


def fused_input(ctx: OpContext, index: int, sb_dtype: Any, dims: int | None = None,
                need_data: bool = True) -> np.ndarray:
    """Input ``index``: a uint8 fused table with room for the scale and bias at each row's
    end (exactly ``dims`` dimensions when given; ``need_data``: at least one data byte)."""
    value = typed_input(ctx, index, np.uint8)
    if dims is not None and value.ndim != dims:
        raise ctx.fail(f"input {index} ({ctx.input_name(index)}) must have {dims} "
                       f"dimension(s), got shape {tuple(value.shape)}")
    width = 2 * np.dtype(sb_dtype).itemsize
    if value.shape[-1] < width + int(need_data):
        raise ctx.fail(f"input {index} ({ctx.input_name(index)}) must have "
                       f"{'more than' if need_data else 'at least'} {width} "
                       f"columns (the data bytes, then a {np.dtype(sb_dtype).name} scale and "
                       f"bias), got shape {tuple(value.shape)}")
    return value
