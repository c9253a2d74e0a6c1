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
  overflow to +-inf).  The compressed blob *is* float16, so the collective moves half the
  bytes; across processes it is summed in float32 and rounded once
  (:mod:`dpgraph.collectives.halfsum`).
* ``bfloat16``: the upper 16 bits of the float32, rounded to nearest with ties to even
  (NaN stays NaN).  numpy has no bfloat16, so the value is *stored as float32 with the low 16
  bits zeroed*: numerically exact bfloat16.  Across processes the compression pass marks the
  ``Allreduce`` with ``wire_dtype="bfloat16"``, so only the upper 16 bits travel; local
  reductions (Sum, NCCLAllreduce) move float32 words.  The reduction result is rounded to
  bfloat16 again when decompressed (a bfloat16 all-reduce's output).

The casts are bitwise numpy's definitions, done by torch's vectorised kernels when torch is
installed (numpy's float16 casts are scalar), a cache-sized chunk at a time; a chunk holding
a NaN is redone by numpy so NaN payloads match too.  The kernels write into their output's
previous array when the runtime allows it (no page faults on the hot path).

Error feedback (a second input/output): ``X' = X + E``; ``Y = q(X')``;
``E = X' - float32(Y)``.  An empty ``E`` (size 0, as the init net makes it) means no
carried error yet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import host
from dpgraph.ops.bucket import reusable_output, shared_bucket
from dpgraph.ops.context import OpContext, Outputs

#: gradient_dtype names accepted by the ops (and by Parallelize).
DTYPES = ("float16", "bfloat16")

#: Arrays at least this large are cast by torch's vectorised kernels when torch is
#: installed (numpy's float16 casts are scalar: ~10x slower); smaller ones by numpy.
TORCH_MIN_SIZE = 1 << 14
#: Elements cast at a time: the chunk is still in the cache when its NaN check reads it.
_CHUNK = 1 << 18
_TORCH: list[Any] = []


def torch_module() -> Any:
    """torch, or None when it is not installed (imported once, on the first large cast)."""
    if not _TORCH:
        try:
            import torch as module
        except ImportError:
            module = None  # type: ignore[assignment]
        _TORCH.append(module)
    return _TORCH[0]


def _fast(*arrays: np.ndarray) -> Any:
    """torch when every array is a large C-contiguous numpy array and torch is there."""
    if arrays[0].size < TORCH_MIN_SIZE or not all(
            type(a) is np.ndarray and a.flags.c_contiguous for a in arrays):
        return None
    return torch_module()


def _out(out: np.ndarray | None, like: np.ndarray, dtype: Any) -> np.ndarray:
    if out is None:
        return np.empty(like.shape, dtype)
    if out.shape != like.shape or out.dtype != dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; "
                         f"expected {like.shape} and {np.dtype(dtype)}")
    return out


def _cast(torch: Any, src: np.ndarray, dst: np.ndarray, via: Any, wide: np.ndarray,
          exact: Any) -> None:
    """``dst`` = ``src`` cast by torch (through the torch dtype ``via`` when given), a
    cache-sized chunk at a time.  torch and numpy differ only in NaN bit patterns, so a
    chunk whose float32 side (``wide``: ``src`` or ``dst``) holds a NaN is redone with the
    numpy definition ``exact(src_chunk) -> dst_chunk``."""
    flat_src, flat_dst, flat_wide = src.reshape(-1), dst.reshape(-1), wide.reshape(-1)
    before = wide is src
    t_src, t_dst = _as_torch(torch, flat_src), _as_torch(torch, flat_dst)
    scratch = None if via is None else torch.empty(min(_CHUNK, flat_src.size), dtype=via)
    for start in range(0, flat_src.size, _CHUNK):
        stop = min(start + _CHUNK, flat_src.size)
        # src may be dst (in place): keep a NaN chunk's source for the numpy redo
        nan = before and np.isnan(np.maximum.reduce(flat_wide[start:stop]))
        saved = flat_src[start:stop].copy() if nan else None
        if scratch is None:
            t_dst[start:stop].copy_(t_src[start:stop])
        else:
            piece = scratch[:stop - start]
            piece.copy_(t_src[start:stop])
            t_dst[start:stop].copy_(piece)
        if not before and np.isnan(np.maximum.reduce(flat_wide[start:stop])):
            saved = flat_src[start:stop]
        if saved is not None:
            flat_dst[start:stop] = exact(saved)


def _as_torch(torch: Any, array: np.ndarray) -> Any:
    """A torch view of ``array``; uint16 words are bfloat16 bit patterns."""
    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _numpy_float16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16)


def _convert(src: np.ndarray, out: np.ndarray | None, dtype: Any, exact: Any,
             narrowing: bool) -> np.ndarray:
    """``out`` = ``exact(src)`` as ``dtype``: torch's cast a chunk at a time for large arrays
    (bitwise ``exact``'s result, see :func:`_cast`), else ``exact`` itself.  ``narrowing``:
    the float32 side is ``src`` (compressing), else ``out`` (decompressing)."""
    out = _out(out, src, dtype)
    torch = _fast(src, out)
    if torch is None:
        np.copyto(out, exact(src))
    else:
        _cast(torch, src, out, None, src if narrowing else out, exact)
    return out


def to_float16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> float16 exactly as numpy's ``astype`` (nearest, ties to even, overflow to
    +-inf, NaN payloads as numpy keeps them), into ``out`` when given."""
    return _convert(x, out, np.float16, _numpy_float16, narrowing=True)


def from_float16(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 -> float32 (exact; NaN payloads as numpy's ``astype``)."""
    return _convert(h, out, np.float32, lambda v: v.astype(np.float32), narrowing=False)


def _numpy_round_to_bfloat16(values: np.ndarray) -> np.ndarray:
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


def _numpy_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    return (_numpy_round_to_bfloat16(values).view(np.uint32) >> 16).astype(np.uint16)


def round_to_bfloat16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 (nearest, ties to even), as float32 whose low
    16 bits are zero; NaN stays a quiet NaN: ``(bits | 0x00400000) & 0xFFFF0000``; +-inf
    stay infinite.  Into ``out`` (float32, same shape) when given; ``out`` may be
    ``values`` itself."""
    x = np.asarray(values)
    torch = _fast(x, *(() if out is None else (out,))) if x.dtype == np.float32 else None
    if torch is None:
        result = _numpy_round_to_bfloat16(x)
        if out is None:
            return result
        np.copyto(_out(out, result, np.float32), result)
        return out
    out = _out(out, x, np.float32)
    _cast(torch, x, out, torch.bfloat16, x, _numpy_round_to_bfloat16)
    return out


def to_bfloat16_bits(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of float32 ``x`` rounded as
    :func:`round_to_bfloat16`."""
    return _convert(x, out, np.uint16, _numpy_bfloat16_bits, narrowing=True)


def from_bfloat16_bits(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 of bfloat16 bit patterns (uint16): exact, NaN bits kept."""
    return _convert(bits, out, np.float32,
                    lambda v: (v.astype(np.uint32) << 16).view(np.float32), narrowing=False)


def quantize(values: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """The compressed form of float32 ``values``: float16, or bfloat16 stored as float32."""
    if dtype == "float16":
        return to_float16(values, out)
    return round_to_bfloat16(values, out)


def dequantize(values: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 of a compressed blob (for bfloat16, rounded to bfloat16 first)."""
    if dtype == "float16":
        return from_float16(values, out)
    return round_to_bfloat16(values, out)


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


#: The numpy dtype a compressed blob is stored in.
_STORED = {"float16": np.float16, "bfloat16": np.float32}


def _reused(ctx: OpContext, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
    """Output 0's array from the previous run when the runtime lets this kernel overwrite
    it (host arrays only): no allocation and no page faults on the hot path."""
    if ctx.xp is not np:
        return None
    previous = ctx.prev_output(0)
    if shared_bucket(previous) and previous.shape == tuple(shape) and \
            previous.dtype == dtype and previous.flags.writeable:
        return previous  # decompressing into the bucket the gradients are views of
    del previous  # the runtime's check counts the references to the array
    return reusable_output(ctx, 0, tuple(shape), np.dtype(dtype))


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
    y = quantize(x, dtype, _reused(ctx, x.shape, _STORED[dtype]))
    out = ctx.xp.asarray(y)
    if not feedback:
        return (out,)
    return (out, ctx.xp.asarray(x - dequantize(y, dtype)))


@register_op("GradientDecompress", inputs=1, outputs=1)
def gradient_decompress(ctx: OpContext) -> Outputs:
    """Y (compressed) -> float32 (bfloat16: rounded to bfloat16 first)."""
    dtype = _dtype_arg(ctx)
    y = _host(ctx, ctx.inputs[0], 0)
    return (ctx.xp.asarray(dequantize(y, dtype, _reused(ctx, y.shape, np.float32))),)


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
