"""Caffe2's stochastic row-wise quantization (TernGrad-style; no gradients):
``FloatToFusedRandRowwiseQuantized`` and ``FusedRandRowwiseQuantizedToFloat``.

Each output row is ``[bitwidth u8][tail u8][min f32][max f32][data]``, ``bitwidth`` in
{1, 2, 4, 8} (argument ``bitwidth``, default 8), ``tail`` the number of unused buckets in
the last byte.  A row of ``C`` values is cut into ``8 // bitwidth`` segments of
``ceil(C · bitwidth / 8)`` values; value ``i`` of segment ``s`` sits in data byte ``i`` at
bit ``s · bitwidth``.  With ``gap = (max - min) / (2**bitwidth - 1)`` and
``t = (x - min) · float(1 / (gap + 1e-8))``, the code is ``floor(t + u)`` for a uniform
``u`` in [0, 1) (``random``, the default; seeded by the device option's ``random_seed``) or
``round_half_even(t)``, clipped to ``[0, 2**bitwidth - 1]``.  Decoding gives
``q · float(gap + 1e-8) + min``; the bit width and tail are read from the first row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import ShapeResult
from dpgraph.ops._rowwise_format import F32, typed_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

UINT8: int = caffe2_pb2.TensorProto.UINT8
HEADER = 10
_EPSILON = 1e-8


def _bitwidth(ctx: OpContext, value: int) -> int:
    if value not in (1, 2, 4, 8):
        raise ctx.fail(f"Unsupported bitwidth {value}: use 1, 2, 4 or 8")
    return value


def _segment(columns: int, bits: int) -> int:
    per = 8 // bits
    return (columns + per - 1) // per


def _encode_shape(op: Any, shapes: list, types: list) -> ShapeResult:
    if shapes[0] is None or len(shapes[0]) != 2:
        return [None]
    bits = next((a.i for a in op.arg if a.name == "bitwidth"), 8) or 8
    return [((shapes[0][0], HEADER + _segment(int(shapes[0][1]), bits)), UINT8)]


def _codes(ctx: OpContext, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int
           ) -> np.ndarray:
    qmax = F32((1 << bits) - 1)
    gap = ((hi - lo) / qmax).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverse = (1.0 / (gap.astype(np.float64) + _EPSILON)).astype(F32)
        times = ((x - lo[:, None]) * inverse[:, None]).astype(F32)
        if ctx.int_arg("random", 1):
            noise = ctx.rng.random(x.shape, dtype=np.float32)
            codes = np.clip(np.floor(times + noise), F32(0), qmax)
        else:
            codes = np.rint(np.clip(times, F32(0), qmax))
    return np.nan_to_num(codes, nan=0.0).astype(np.uint8)


@register_op("FloatToFusedRandRowwiseQuantized", inputs=1, outputs=1, shape=_encode_shape)
def float_to_fused_rand_rowwise_quantized(ctx: OpContext) -> Outputs:
    """X float32 [R, C] -> uint8 [R, 10 + ceil(C · bitwidth / 8)]."""
    x = typed_input(ctx, 0, np.float32)
    if x.ndim != 2:
        raise ctx.fail(f"Expect input to be a matrix, got shape {tuple(x.shape)}; reshape "
                       "the input tensor to a matrix")
    bits = _bitwidth(ctx, ctx.int_arg("bitwidth", 8))
    per, seg = 8 // bits, _segment(x.shape[1], bits)
    lo = np.fmin.reduce(x, axis=1, initial=np.inf).astype(F32)
    hi = np.fmax.reduce(x, axis=1, initial=-np.inf).astype(F32)
    padded = np.zeros((x.shape[0], per * seg), dtype=np.uint8)
    padded[:, :x.shape[1]] = _codes(ctx, x, lo, hi, bits)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)[None, :, None]
    data = np.bitwise_or.reduce(padded.reshape(x.shape[0], per, seg) << shifts, axis=1)
    out = np.empty((x.shape[0], HEADER + seg), dtype=np.uint8)
    out[:, 0], out[:, 1] = bits, (per - x.shape[1] % per) % per
    out[:, 2:HEADER] = np.stack([lo, hi], axis=1).view(np.uint8)
    out[:, HEADER:] = data
    return (out,)


@register_op("FusedRandRowwiseQuantizedToFloat", inputs=1, outputs=1)
def fused_rand_rowwise_quantized_to_float(ctx: OpContext) -> Outputs:
    """uint8 [R, 10 + S] -> float32 [R, S · 8 / bitwidth - tail]."""
    table = typed_input(ctx, 0, np.uint8)
    if table.ndim != 2 or table.shape[1] < HEADER or table.size < 4:
        raise ctx.fail(f"Expect input to be a matrix of at least {HEADER} columns (the "
                       f"header), got shape {tuple(table.shape)}")
    bits = _bitwidth(ctx, int(table[0, 0]))
    per, seg = 8 // bits, table.shape[1] - HEADER
    columns = seg * per - int(table[0, 1])
    if columns < 0:
        raise ctx.fail(f"tail {int(table[0, 1])} exceeds the {seg * per} buckets of a row")
    bounds = np.ascontiguousarray(table[:, 2:HEADER]).view(F32)
    lo, hi = bounds[:, 0], bounds[:, 1]
    gap = (((hi - lo) / F32((1 << bits) - 1)).astype(np.float64) + _EPSILON).astype(F32)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)[None, :, None]
    codes = (table[:, None, HEADER:] >> shifts) & np.uint8((1 << bits) - 1)
    codes = codes.reshape(table.shape[0], per * seg)[:, :columns]
    return ((codes.astype(F32) * gap[:, None] + lo[:, None]).astype(F32),)


def _no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _type in OPERATORS.types():
    _schema = OPERATORS.get(_type)
    if _schema is not None and _schema.kernel.__module__ == __name__:
        register_gradient(_type)(_no_gradient)
