"""Helpers shared by the op family modules: TensorProto type codes, host copies of device
arrays (re-exported from :mod:`dpgraph.ir.arrays`), in-place output buffers, and the
``shape=`` functions many families use.

Family modules import from here (never from each other) for these, so each helper has one
definition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.ir.arrays import host, is_array, to_host  # noqa: F401  (re-exported: one definition)
from dpgraph.proto import caffe2_pb2

ShapeResult = list[Any]

_TensorProto = caffe2_pb2.TensorProto
#: Caffe2 ``TensorProto.DataType`` codes the kernels' shape functions report.
FLOAT: int = _TensorProto.FLOAT
INT32: int = _TensorProto.INT32
BOOL: int = _TensorProto.BOOL
INT64: int = _TensorProto.INT64
FLOAT16: int = _TensorProto.FLOAT16


def scalar_value(value: Any) -> float:
    """The single value of a 1-element blob (lr, weights); works for numpy and CuPy."""
    return float(value.reshape(-1)[0]) if hasattr(value, "reshape") else float(value)


def as_dtype(xp: Any, value: Any, dtype: Any) -> Any:
    """``value`` as an array of ``dtype`` (0-d results stay arrays)."""
    out = xp.asarray(value)
    return out if out.dtype == dtype else out.astype(dtype)


# --- in-place updates -----------------------------------------------------------------------
def inplace_target(ctx: Any, input_index: int, output_index: int) -> np.ndarray | None:
    """The input array itself when the op writes that blob in place (Caffe2's in-place ops:
    the same blob name in and out) and it may be updated there: a writable numpy array that
    owns its memory (a view could alias another blob).  ``None`` means: write a new array.

    Kernels call this only after every check passed, so a failing op still leaves its
    outputs untouched.
    """
    value = ctx.inputs[input_index]
    if type(value) is not np.ndarray or value.base is not None or not value.flags.writeable:
        return None
    return value if ctx.op.input[input_index] == ctx.op.output[output_index] else None


def out_buffer(ctx: Any, input_index: int, output_index: int) -> np.ndarray:
    """Where output ``output_index`` is written: input ``input_index`` in place when
    :func:`inplace_target` allows it, else a new array like it."""
    target = inplace_target(ctx, input_index, output_index)
    return target if target is not None else np.empty_like(ctx.inputs[input_index])


def detached(ctx: Any, value: Any, input_index: int = 0, output_index: int = 0) -> Any:
    """``value``, an output computed from input ``input_index`` (a reshape, split or
    transpose), copied when it shares that input's memory and the op is not in place: as
    Caffe2 copies there, and because kernels update blobs in place, one blob must not be a
    view of another (ops whose outputs are views on purpose, such as Alias, skip this)."""
    source = ctx.inputs[input_index]
    if ctx.op.input[input_index] == ctx.op.output[output_index]:
        return value
    if type(value) is np.ndarray and type(source) is np.ndarray and \
            np.may_share_memory(value, source):
        return value.copy()
    return value


def same_float_arrays(*values: Any) -> bool:
    """Numpy float arrays of one dtype: then one ufunc with ``out=`` computes the values the
    allocating form computes (a single ufunc also handles overlapping operands)."""
    first = values[0]
    return type(first) is np.ndarray and first.dtype.kind == "f" and all(
        type(v) is np.ndarray and v.dtype == first.dtype for v in values)


def reads_apart(target: Any, others: Sequence[Any]) -> bool:
    """True when ``target`` (an array updated step by step in place, or ``None``) shares no
    memory with the ``others``, which later steps still read."""
    return target is None or not any(
        type(v) is np.ndarray and np.may_share_memory(target, v) for v in others)


# --- shape functions ---------------------------------------------------------------------
def same_as_input(index: int = 0, dtype: int | None = None) -> Callable[..., ShapeResult]:
    """``shape=`` function: every output has input ``index``'s shape (and type)."""

    def infer(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
              in_types: Sequence[Any]) -> ShapeResult:
        if index >= len(in_shapes) or in_shapes[index] is None:
            return [None] * len(op.output)
        kind = in_types[index] if dtype is None else dtype
        return [(tuple(in_shapes[index]), kind)] * len(op.output)

    return infer


def like_inputs(*pairs: int) -> Callable[..., ShapeResult]:
    """``shape=`` function: output k has the shape and type (float if unknown) of input
    ``pairs[k]``."""

    def infer(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
        return [None if shapes[i] is None else (tuple(shapes[i]), types[i] or FLOAT)
                for i in pairs]

    return infer
