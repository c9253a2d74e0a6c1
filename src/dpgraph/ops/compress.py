"""Compressed gradients and gradient accumulation: dpgraph's own ops (not Caffe2's).

Emitted by ``Parallelize(..., gradient_dtype=..., accumulate_steps=...)``::

    GradientCompress([cpu_0/fc_w_grad(, cpu_0/fc_w_grad_float16_error)],
                     [cpu_0/fc_w_grad_float16(, cpu_0/fc_w_grad_float16_error)], dtype="float16")
    Sum / Copy / NCCLAllreduce / Allreduce on */fc_w_grad_float16
    GradientDecompress([cpu_0/fc_w_grad_float16], [cpu_0/fc_w_grad], dtype="float16")

    GradientAccumulationStep([grad_accumulation_iter],
                             [grad_accumulation_iter, grad_accumulation_sync], steps=4)

Number formats:

* ``float16``: IEEE binary16, numpy's ``astype(float16)`` (round to nearest, ties to even;
  overflow to +-inf).  The compressed blob *is* float16, so the collective moves and sums
  half the bytes.
* ``bfloat16``: the upper 16 bits of the float32, rounded to nearest with ties to even
  (NaN stays NaN).  numpy has no bfloat16, so the value is *stored as float32 with the low 16
  bits zeroed*: numerically exact bfloat16, but the collective moves float32 words.  The
  reduction result is rounded to bfloat16 again when decompressed (a bfloat16 all-reduce's
  output).

Error feedback (a second input/output): ``X' = X + E``; ``Y = q(X')``;
``E = X' - float32(Y)``.  An empty ``E`` (size 0, as the init net makes it) means no
carried error yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs

#: gradient_dtype names accepted by the ops (and by Parallelize).
DTYPES = ("float16", "bfloat16")


def round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 (nearest, ties to even), as float32 whose low
    16 bits are zero; NaN stays (a quiet) NaN, +-inf stay infinite."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits >> 16) & 1  # ties go to the even upper half
    rounded += 0x7FFF
    rounded += bits  # no finite value or infinity wraps (only NaN patterns, replaced below)
    rounded &= 0xFFFF0000
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = (bits[nan] | 0x00400000) & 0xFFFF0000
    return rounded.view(np.float32).reshape(x.shape)


def quantize(values: np.ndarray, dtype: str) -> np.ndarray:
    """The compressed form of float32 ``values``: float16, or bfloat16 stored as float32."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16)
    return round_to_bfloat16(values)


def dequantize(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 of a compressed blob (for bfloat16, rounded to bfloat16 first)."""
    if dtype == "float16":
        return values.astype(np.float32)
    return round_to_bfloat16(values)


def _dtype_arg(ctx: OpContext) -> str:
    dtype = ctx.str_arg("dtype", "")
    if dtype not in DTYPES:
        raise ctx.fail(f"argument 'dtype' must be one of {list(DTYPES)}, got {dtype!r}.")
    return dtype


def _host(ctx: OpContext, value: Any, index: int) -> np.ndarray:
    if not hasattr(value, "dtype"):
        raise ctx.fail(f"input {ctx.input_name(index)!r} is a {type(value).__name__}, not a "
                       "dense tensor; only dense gradients can be compressed.")
    return host(value)


@register_op("GradientCompress", inputs=(1, 2), outputs=(1, 2))
def gradient_compress(ctx: OpContext) -> Outputs:
    """X (float32) [, E] -> Y = q(X + E) [, E = X + E - float32(Y)]."""
    dtype = _dtype_arg(ctx)
    x = _host(ctx, ctx.inputs[0], 0)
    if x.dtype != np.float32:
        raise ctx.fail(f"gradient {ctx.input_name(0)!r} is {x.dtype}; only float32 gradients "
                       "are compressed. Use gradient_dtype=None for this model.")
    feedback = len(ctx.inputs) == 2
    if feedback != (ctx.num_outputs == 2):
        raise ctx.fail("error feedback needs the error blob as input 1 and output 1.")
    if feedback:
        error = _host(ctx, ctx.inputs[1], 1)
        if error.size not in (0, x.size):
            raise ctx.fail(f"error blob {ctx.input_name(1)!r} holds {error.size} values, the "
                           f"gradient {x.size}; it belongs to another gradient or bucket.")
        if error.size:
            x = x + error.reshape(x.shape).astype(np.float32)
    y = quantize(x, dtype)
    out = ctx.xp.asarray(y)
    if not feedback:
        return (out,)
    return (out, ctx.xp.asarray(x - dequantize(y, dtype)))


@register_op("GradientDecompress", inputs=1, outputs=1)
def gradient_decompress(ctx: OpContext) -> Outputs:
    """Y (compressed) -> float32 (bfloat16: rounded to bfloat16 first)."""
    dtype = _dtype_arg(ctx)
    y = _host(ctx, ctx.inputs[0], 0)
    return (ctx.xp.asarray(dequantize(y, dtype)),)


@register_op("GradientAccumulationStep", inputs=1, outputs=2, inplace=[(0, 0)],
             side_effects=True)
def gradient_accumulation_step(ctx: OpContext) -> Outputs:
    """counter (int64 [1]) -> (counter + 1, bool [1]: (counter + 1) % steps == 0)."""
    steps = ctx.int_arg("steps", 1)
    if steps < 1:
        raise ctx.fail(f"argument 'steps' must be >= 1, got {steps}.")
    counter = _host(ctx, ctx.inputs[0], 0)
    if counter.size != 1:
        raise ctx.fail(f"the counter {ctx.input_name(0)!r} must have one element, got shape "
                       f"{list(counter.shape)}.")
    value = counter.reshape(1).astype(np.int64) + 1
    return (value, np.array([value[0] % steps == 0], dtype=bool))
