"""Fill operators: constant, random and given-value initialisers.

Fillers have Caffe2's ``NO_GRADIENT``: their gradient maker adds nothing, so an input used
only for its shape (``ConstantFill(x)``) gets no gradient and autodiff does not fail.

Every filler takes its output shape from the ``shape`` argument when it has no input, or
from its input (its shape, or its values with ``input_as_shape=1``) followed by
``extra_shape``, as Caffe2's ``FillerOp`` does.  Random fills draw from ``ctx.rng``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, ResourceLimitError, ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.proto_io import check_tensor_size
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

DataType = caffe2_pb2.TensorProto

#: Caffe2 ``TensorProto.DataType`` -> numpy dtype.
NUMPY_DTYPES: dict[int, Any] = {
    DataType.FLOAT: np.float32, DataType.INT32: np.int32, DataType.BYTE: np.uint8,
    DataType.STRING: np.object_, DataType.BOOL: np.bool_, DataType.UINT8: np.uint8,
    DataType.INT8: np.int8, DataType.UINT16: np.uint16, DataType.INT16: np.int16,
    DataType.INT64: np.int64, DataType.FLOAT16: np.float16, DataType.DOUBLE: np.float64,
}

_CAFFE2_TYPES: dict[Any, int] = {
    np.dtype(np.float32): DataType.FLOAT, np.dtype(np.int32): DataType.INT32,
    np.dtype(np.object_): DataType.STRING, np.dtype(np.bool_): DataType.BOOL,
    np.dtype(np.uint8): DataType.UINT8, np.dtype(np.int8): DataType.INT8,
    np.dtype(np.uint16): DataType.UINT16, np.dtype(np.int16): DataType.INT16,
    np.dtype(np.int64): DataType.INT64, np.dtype(np.float16): DataType.FLOAT16,
    np.dtype(np.float64): DataType.DOUBLE,
}


def caffe2_dtype(dtype: Any) -> int:
    """The Caffe2 DataType of a numpy dtype (``UNDEFINED`` if it has none)."""
    return _CAFFE2_TYPES.get(np.dtype(dtype), DataType.UNDEFINED)


def parse_dtype(value: Any, what: str = "dtype") -> int:
    """A Caffe2 DataType from an int or a name (``"FLOAT"``, ``"int64"``)."""
    if isinstance(value, (bytes, str)):
        name = value.decode() if isinstance(value, bytes) else value
        try:
            return int(DataType.DataType.Value(name.upper()))
        except ValueError:
            raise ArgumentError(f"{what}: unknown data type name {name!r}; use one of "
                                f"{list(DataType.DataType.keys())}.") from None
    return int(value)


def numpy_dtype(data_type: int, what: str = "dtype") -> Any:
    """The numpy dtype of a Caffe2 DataType; raises ArgumentError for unsupported ones."""
    try:
        return NUMPY_DTYPES[data_type]
    except KeyError:
        raise ArgumentError(f"{what}: data type {data_type} is not supported by dpgraph; "
                            f"supported: {sorted(NUMPY_DTYPES)}.") from None


# --- output shape ------------------------------------------------------------------------
def fill_shape(ctx: OpContext, itemsize: int = 4) -> tuple[int, ...]:
    """The output shape of a filler op (Caffe2 ``FillerOp`` rules), checked before anything
    is allocated: no negative dimension, and no more than ``max_tensor_bytes()``."""
    shape = _declared_shape(ctx)
    if any(d < 0 for d in shape):
        source = "input_as_shape input" if ctx.inputs else "argument 'shape'"
        raise ArgumentError(ctx.describe(
            f"{source} gives the negative dimension(s) {list(shape)}; every dimension must be "
            ">= 0"))
    try:
        check_tensor_size(shape, itemsize, "output")
    except (ShapeError, ResourceLimitError) as error:  # the op's description only when needed
        raise type(error)(ctx.describe(str(error))) from None
    return shape


def _declared_shape(ctx: OpContext) -> tuple[int, ...]:
    if isinstance(ctx.arg("shape"), (int, float)):
        raise ArgumentError(ctx.describe(
            f"argument 'shape' must be a list of dims, got the single value "
            f"{ctx.arg('shape')!r}; write shape=[{ctx.arg('shape')!r}]"))
    if not ctx.inputs:
        if ctx.has_arg("extra_shape") or ctx.int_arg("input_as_shape", 0):
            raise ArgumentError(ctx.describe(
                "extra_shape and input_as_shape need an input; pass one or drop them"))
        return tuple(ctx.ints_arg("shape"))
    if ctx.has_arg("shape") and ctx.ints_arg("shape"):
        raise ArgumentError(ctx.describe(
            "cannot set the shape argument and pass an input at the same time"))
    source = ctx.inputs[0]
    if ctx.int_arg("input_as_shape", 0):
        values = np.asarray(to_host(source))
        if values.ndim != 1:
            raise ctx.fail("with input_as_shape=1 the input must be a 1-D int64 tensor, "
                           f"got shape {values.shape}")
        if values.dtype.kind not in "iub":
            raise ctx.fail(f"with input_as_shape=1 the input must hold integers, got "
                           f"{values.dtype}; pass an int64 tensor")
        shape = [int(v) for v in values]
    else:
        shape = list(np.shape(source))
    return tuple(shape + ctx.ints_arg("extra_shape"))


def _fill_shape_fn(default_dtype: int, dtype_arg: bool = False) -> Any:
    """A ``shape=`` function for fillers producing ``default_dtype`` (or the dtype arg)."""

    def infer(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
              in_types: Sequence[Any]) -> list[Any]:
        args = arguments_dict(op.arg)
        dtype = parse_dtype(args.get("dtype", default_dtype)) if dtype_arg else default_dtype
        if not op.input:
            shape = args.get("shape", [])
            return [(tuple(int(s) for s in (shape if isinstance(shape, list) else [shape])),
                     dtype)]
        if args.get("input_as_shape") or in_shapes[0] is None:
            return [None]
        extra = args.get("extra_shape", [])
        return [(tuple(in_shapes[0]) + tuple(int(s) for s in extra), dtype)]

    return infer


# --- constant fills ----------------------------------------------------------------------
def _constant_dtype(ctx: OpContext) -> int:
    if ctx.has_arg("dtype"):
        return parse_dtype(ctx.arg("dtype"))
    value = ctx.arg("value")
    if isinstance(value, int) and not isinstance(value, bool):
        return DataType.INT64  # Caffe2 infers INT64 from an integer ``value``
    if isinstance(value, str):
        return DataType.STRING
    return DataType.FLOAT


def _constant_infer(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
                    in_types: Sequence[Any]) -> list[Any]:
    args = arguments_dict(op.arg)
    dtype = parse_dtype(args["dtype"]) if "dtype" in args else (
        DataType.INT64 if isinstance(args.get("value"), int) else DataType.FLOAT)
    result = _fill_shape_fn(dtype)(op, in_shapes, in_types)
    return [None if r is None else (r[0], dtype) for r in result]


def _value_input(ctx: OpContext) -> Any:
    """The one-element VALUE input (ConstantFill's second input)."""
    value = np.asarray(to_host(ctx.inputs[1]))
    if value.size != 1:
        raise ctx.fail(f"the value input {ctx.input_name(1)!r} must hold exactly one element, "
                       f"got shape {value.shape}")
    return value.reshape(())


@register_op("ConstantFill", inputs=(0, 2), outputs=1, shape=_constant_infer)
def constant_fill(ctx: OpContext) -> Outputs:
    """Y = value everywhere (dtype arg, or inferred from value: int -> INT64); with a second
    input, the value (and, without a dtype arg, the dtype) is that one-element tensor's."""
    if len(ctx.inputs) == 2:
        value_array = _value_input(ctx)
        dtype = numpy_dtype(parse_dtype(ctx.arg("dtype"))) if ctx.has_arg("dtype") else \
            value_array.dtype
        shape = fill_shape(ctx, max(np.dtype(dtype).itemsize, 1))
        return (ctx.xp.full(shape, value_array.item(), dtype=dtype),)
    data_type = _constant_dtype(ctx)
    dtype = numpy_dtype(data_type)
    shape = fill_shape(ctx, max(np.dtype(dtype).itemsize, 1))
    value = ctx.arg("value", 0.0)
    if data_type == DataType.STRING:
        out = np.empty(shape, dtype=object)
        out[...] = value if value is not None else ""
        return (out,)
    return (ctx.xp.full(shape, value if value is not None else 0, dtype=dtype),)


@register_op("UniformFill", inputs=(0, 3), outputs=1, shape=_fill_shape_fn(DataType.FLOAT))
def uniform_fill(ctx: OpContext) -> Outputs:
    """Y ~ U(min, max) (args, or inputs 1 and 2 when three inputs are given)."""
    low, high = _bounds(ctx, 0.0, 1.0)
    shape = _shape_with_bound_inputs(ctx, low, high)
    if 0 in shape:
        return (ctx.xp.zeros(shape, dtype=np.float32),)
    values = ctx.rng.uniform(low, high, size=shape).astype(np.float32)
    return (ctx.xp.asarray(values),)


@register_op("Float16UniformFill", inputs=0, outputs=1,
             shape=_fill_shape_fn(DataType.FLOAT16))
def float16_uniform_fill(ctx: OpContext) -> Outputs:
    """Y ~ U(min, max) stored as float16 (args shape, min, max)."""
    low, high = _bounds(ctx, 0.0, 1.0)
    values = ctx.rng.uniform(low, high, size=fill_shape(ctx, 2))
    return (ctx.xp.asarray(np.clip(values, low, high).astype(np.float16)),)


@register_op("UniformIntFill", inputs=(0, 3), outputs=1, shape=_fill_shape_fn(DataType.INT32))
def uniform_int_fill(ctx: OpContext) -> Outputs:
    """Y ~ U{min, ..., max} (both ends included), int32."""
    low, high = _bounds(ctx, 0, 1)
    shape = _shape_with_bound_inputs(ctx, low, high)
    if 0 in shape:
        return (ctx.xp.zeros(shape, dtype=np.int32),)
    values = ctx.rng.integers(int(low), int(high), size=shape, endpoint=True).astype(np.int32)
    return (ctx.xp.asarray(values),)


_UNIQUE_DTYPES: dict[int, Any] = {DataType.INT32: np.int32, DataType.INT64: np.int64}


def _unique_candidates(ctx: OpContext, low: int, high: int, count: int,
                       avoid: np.ndarray) -> np.ndarray:
    """``count`` distinct integers in [low, high] none of which is in ``avoid``, in random
    order: sampled from the explicit candidates when the range is small, else by rejection."""
    span = high - low + 1
    blocked = np.unique(avoid[(avoid >= low) & (avoid <= high)])
    if count > span - blocked.size:
        raise ArgumentError(ctx.describe(
            f"cannot draw {count} unique values from [{low}, {high}] avoiding "
            f"{blocked.size} of them; widen min/max or ask for fewer"))
    if span <= max(4 * count, 1 << 16):
        candidates = np.setdiff1d(np.arange(low, high + 1, dtype=np.int64), blocked)
        return ctx.rng.choice(candidates, size=count, replace=False)
    chosen: dict[int, None] = {}
    avoid_set = set(blocked.tolist())
    while len(chosen) < count:
        for v in ctx.rng.integers(low, high, size=2 * (count - len(chosen)),
                                  endpoint=True).tolist():
            if v not in avoid_set and len(chosen) < count:
                chosen[v] = None
    return np.fromiter(chosen, dtype=np.int64, count=count)


@register_op("UniqueUniformFill", inputs=(0, 2), outputs=1,
             shape=_fill_shape_fn(DataType.INT32, dtype_arg=True))
def unique_uniform_fill(ctx: OpContext) -> Outputs:
    """[shape?, avoid?] -> distinct integers drawn uniformly from [min, max] (both required,
    min < max), none of them in ``avoid``; ``dtype`` INT32 (default) or INT64."""
    data_type = parse_dtype(ctx.arg("dtype", DataType.INT32))
    if data_type not in _UNIQUE_DTYPES:
        raise ArgumentError(ctx.describe(f"dtype must be INT32 or INT64, got {data_type}"))
    if not (ctx.has_arg("min") and ctx.has_arg("max")):
        raise ArgumentError(ctx.describe("needs integer arguments 'min' and 'max'"))
    low, high = ctx.int_arg("min"), ctx.int_arg("max")
    if not low < high:
        raise ArgumentError(ctx.describe(f"max ({high}) must be bigger than min ({low})"))
    dtype = _UNIQUE_DTYPES[data_type]
    shape = fill_shape(ctx, np.dtype(dtype).itemsize)
    avoid = (np.asarray(to_host(ctx.inputs[1])).reshape(-1).astype(np.int64)
             if len(ctx.inputs) == 2 else np.zeros(0, np.int64))
    values = _unique_candidates(ctx, low, high, math.prod(shape), avoid)
    return (ctx.xp.asarray(values.astype(dtype).reshape(shape)),)


def _bounds(ctx: OpContext, low: float, high: float) -> tuple[float, float]:
    if len(ctx.inputs) == 3:
        low_value = np.asarray(to_host(ctx.inputs[1])).reshape(-1)
        high_value = np.asarray(to_host(ctx.inputs[2])).reshape(-1)
        return float(low_value[0]), float(high_value[0])
    if len(ctx.inputs) == 2:
        raise ArgumentError(ctx.describe("takes 0, 1 or 3 inputs (shape, min, max), got 2"))
    low, high = ctx.float_arg("min", low), ctx.float_arg("max", high)
    if low > high:
        raise ArgumentError(ctx.describe(f"min {low} must not exceed max {high}"))
    return low, high


def _shape_with_bound_inputs(ctx: OpContext, low: float, high: float) -> tuple[int, ...]:
    """The fill shape; with the bounds as inputs and min > max, Caffe2 fills nothing: the
    first dimension becomes 0."""
    if len(ctx.inputs) == 3:
        saved = ctx.inputs
        ctx.inputs = saved[:1]
        try:
            shape = fill_shape(ctx)
        finally:
            ctx.inputs = saved
        return (0, *shape[1:]) if low > high and shape else shape
    return fill_shape(ctx)


@register_op("GaussianFill", inputs=(0, 1), outputs=1, shape=_fill_shape_fn(DataType.FLOAT))
def gaussian_fill(ctx: OpContext) -> Outputs:
    """Y ~ N(mean, std**2)."""
    shape = fill_shape(ctx)
    values = ctx.rng.normal(ctx.float_arg("mean", 0.0), ctx.float_arg("std", 1.0), size=shape)
    return (ctx.xp.asarray(values.astype(np.float32)),)


@register_op("XavierFill", inputs=(0, 1), outputs=1, shape=_fill_shape_fn(DataType.FLOAT))
def xavier_fill(ctx: OpContext) -> Outputs:
    """Y ~ U(-s, s) with s = sqrt(3 / fan_in), fan_in = numel / shape[0]."""
    shape = fill_shape(ctx)
    numel = int(np.prod(shape))
    fan_in = numel // shape[0] if shape and shape[0] else 1
    scale = float(np.sqrt(3.0 / max(fan_in, 1)))
    values = ctx.rng.uniform(-scale, scale, size=shape).astype(np.float32)
    return (ctx.xp.asarray(values),)


@register_op("MSRAFill", inputs=(0, 1), outputs=1, shape=_fill_shape_fn(DataType.FLOAT))
def msra_fill(ctx: OpContext) -> Outputs:
    """Y ~ N(0, s**2) with s = sqrt(2 / fan_out), fan_out = numel / shape[1]."""
    shape = fill_shape(ctx)
    numel = int(np.prod(shape))
    fan_out = numel // shape[1] if len(shape) > 1 and shape[1] else max(numel, 1)
    std = float(np.sqrt(2.0 / max(fan_out, 1)))
    values = ctx.rng.normal(0.0, std, size=shape).astype(np.float32)
    return (ctx.xp.asarray(values),)


# --- given values ------------------------------------------------------------------------
def _given_fill(ctx: OpContext, dtype: Any) -> Any:
    shape = fill_shape(ctx)
    raw = ctx.arg("values", [])
    raw = raw if isinstance(raw, list) else [raw]
    if dtype is np.object_:
        values = np.empty(len(raw), dtype=object)
        values[:] = [v.encode() if isinstance(v, str) else v for v in raw]
    elif dtype is np.uint8 and raw and isinstance(raw[0], (bytes, str)):
        # GivenTensorByteStringToUInt8Fill: one string holding the tensor's bytes.
        data = b"".join(v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v
                        for v in raw)  # the argument's stored bytes, as decoded
        values = np.frombuffer(data, dtype=np.uint8).copy()
    else:
        values = np.asarray(raw, dtype=dtype)
    if values.size != int(np.prod(shape)):
        raise ArgumentError(ctx.describe(
            f"{values.size} values do not fill shape {list(shape)}; give exactly "
            f"{int(np.prod(shape))} values"))
    values = values.reshape(shape)
    return values if dtype is np.object_ else ctx.xp.asarray(values)


def _register_given(op_type: str, data_type: int, dtype_arg: bool = False) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        chosen = parse_dtype(ctx.arg("dtype", data_type)) if dtype_arg else data_type
        return (_given_fill(ctx, numpy_dtype(chosen)),)

    kernel.__doc__ = f"Y = the ``values`` argument reshaped to the output shape ({op_type})."
    register_op(op_type, inputs=(0, 1), outputs=1,
                shape=_fill_shape_fn(data_type, dtype_arg))(kernel)


_register_given("GivenTensorFill", DataType.FLOAT, dtype_arg=True)
_register_given("GivenTensorDoubleFill", DataType.DOUBLE)
_register_given("GivenTensorIntFill", DataType.INT32)
_register_given("GivenTensorInt64Fill", DataType.INT64)
_register_given("GivenTensorInt16Fill", DataType.INT16)
_register_given("GivenTensorBoolFill", DataType.BOOL)
_register_given("GivenTensorStringFill", DataType.STRING)
_register_given("GivenTensorByteStringToUInt8Fill", DataType.UINT8)


# --- ranges and diagonals ----------------------------------------------------------------
@register_op("RangeFill", inputs=(0, 1), outputs=1, shape=_fill_shape_fn(DataType.FLOAT))
def range_fill(ctx: OpContext) -> Outputs:
    """Y = 0, 1, 2, ... in row-major order, float32."""
    shape = fill_shape(ctx)
    return (ctx.xp.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape),)


@register_op("LengthsRangeFill", inputs=1, outputs=1)
def lengths_range_fill(ctx: OpContext) -> Outputs:
    """[2, 3] -> [0, 1, 0, 1, 2]: one range per length, int32."""
    xp = ctx.xp
    lengths = xp.asarray(ctx.inputs[0]).astype(np.int64).reshape(-1)
    total = int(lengths.sum()) if lengths.size else 0
    starts = xp.cumsum(lengths) - lengths
    out = xp.arange(total, dtype=np.int64) - xp.repeat(starts, lengths)
    return (out.astype(np.int32),)


@register_op("DiagonalFill", inputs=(0, 1), outputs=1,
             shape=_fill_shape_fn(DataType.FLOAT, dtype_arg=True))
def diagonal_fill(ctx: OpContext) -> Outputs:
    """Zeros with ``value`` on the diagonal (Caffe2's flat-step rule for any rank >= 2)."""
    shape = fill_shape(ctx)
    if len(shape) < 2:
        raise ctx.fail(f"DiagonalFill needs an output of rank >= 2, got shape {list(shape)}")
    if len(shape) == 2:
        step = shape[1] + 1
    else:
        if len(set(shape)) != 1:
            raise ctx.fail(f"all dimensions must be equal for rank > 2, got {list(shape)}")
        step = 1 + sum(int(np.prod(shape[i + 1:])) for i in range(len(shape) - 1))
    dtype = numpy_dtype(parse_dtype(ctx.arg("dtype", DataType.FLOAT)))
    out = ctx.xp.zeros(int(np.prod(shape)), dtype=dtype)
    out[::step] = ctx.arg("value", 0.0)
    return (out.reshape(shape),)


@register_op("Range", inputs=(1, 3), outputs=1)
def range_op(ctx: OpContext) -> Outputs:
    """``Range(stop)``, ``Range(start, stop)`` or ``Range(start, stop, step)`` of scalar
    tensors of one type -> the 1-D tensor ``arange(start, stop, step)`` of that type."""
    scalars = [np.asarray(to_host(v)) for v in ctx.inputs]
    if any(v.size != 1 for v in scalars):
        raise ctx.fail(f"inputs must be scalars, got shapes {[list(v.shape) for v in scalars]}")
    if len({v.dtype for v in scalars}) != 1:
        raise ArgumentError(ctx.describe(
            f"inputs must share one type, got {[str(v.dtype) for v in scalars]}; cast them"))
    dtype = scalars[0].dtype
    values = [v.reshape(()).item() for v in scalars]
    start, stop, step = ([0, *values, 1] if len(values) == 1 else
                         [*values, 1] if len(values) == 2 else values)
    if step == 0:
        raise ArgumentError(ctx.describe("Step size cannot be 0; pass a non-zero step"))
    count = max(0, int(np.ceil((stop - start) / step)))
    check_tensor_size([count], dtype.itemsize, ctx.describe("Range output"))
    return (ctx.xp.asarray(np.arange(count, dtype=dtype) * dtype.type(step) + dtype.type(start)),)


def no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _filler in ("ConstantFill", "UniformFill", "Float16UniformFill", "UniformIntFill",
                "GaussianFill", "XavierFill",
                "MSRAFill", "GivenTensorFill", "GivenTensorDoubleFill", "GivenTensorIntFill",
                "GivenTensorInt64Fill", "GivenTensorInt16Fill", "GivenTensorBoolFill",
                "GivenTensorStringFill",
                "GivenTensorByteStringToUInt8Fill", "RangeFill", "LengthsRangeFill",
                "DiagonalFill", "Range", "UniqueUniformFill"):
    register_gradient(_filler)(no_gradient)
