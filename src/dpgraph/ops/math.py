"""Elementwise math: binary arithmetic with Caffe2 broadcasting, unary functions, N-ary
Sum/Max/Min/Mean, comparisons and logic, and scaling helpers.

Binary ops follow Caffe2: with ``broadcast=1`` the legacy form applies (B's shape is matched
against A's dims starting at ``axis``; ``axis=-1`` aligns B to the end; the output has A's
shape); without it, numpy's multidirectional broadcasting is used.  Gradient makers are
Caffe2's: Add passes the gradient through, Sub adds ``Negative``, Mul uses two ``Mul`` ops and,
under ``broadcast``, ``SumReduceLike`` reduces B's gradient to B's shape.  Without
``broadcast`` the gradients assume equal shapes, as in Caffe2.  Reductions live in
``ops/reduction.py``.
"""

from __future__ import annotations

import math as _pymath
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, GradientError
from dpgraph.ir.arguments import MakeArgument, arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import (
    ShapeResult,
    as_dtype,
    inplace_target,
    out_buffer,
    reads_apart,
    same_as_input,
    same_float_arrays,
    to_host,
)
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import DataType
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2


def _binary_infer(dtype: int | None = None) -> Callable[..., ShapeResult]:
    def infer(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
              in_types: Sequence[Any]) -> ShapeResult:
        if in_shapes[0] is None or in_shapes[1] is None:
            return [None]
        args = arguments_dict(op.arg)
        if args.get("broadcast"):
            shape = tuple(in_shapes[0])
        else:
            shape = tuple(np.broadcast_shapes(tuple(in_shapes[0]), tuple(in_shapes[1])))
        return [(shape, in_types[0] if dtype is None else dtype)]

    return infer


# --- broadcasting ------------------------------------------------------------------------
def legacy_axis(ctx_args: dict[str, Any], a_ndim: int, b_ndim: int) -> int:
    """Where B's first dim sits in A for Caffe2's ``broadcast=1`` form."""
    axis_str = ctx_args.get("axis_str", "") or ""
    if axis_str:
        order = ctx_args.get("order", "NCHW") or "NCHW"
        if len(axis_str) != 1 or axis_str not in order:
            raise ArgumentError(f"axis_str {axis_str!r} must be one letter of order {order!r}")
        axis = order.index(axis_str)
    else:
        axis = int(ctx_args.get("axis", -1))
    if axis == -1:
        axis = a_ndim - b_ndim
    if not 0 <= axis <= a_ndim - b_ndim:
        raise ArgumentError(f"broadcast axis {axis} does not fit B of rank {b_ndim} in A of "
                            f"rank {a_ndim}; use 0 <= axis <= {a_ndim - b_ndim}")
    return axis


def legacy_shape(args: dict[str, Any], a_shape: Sequence[int], b_shape: Sequence[int]
                 ) -> tuple[int, ...]:
    """B's shape padded with 1s to A's rank, aligned at the legacy broadcast axis.

    Leading size-1 dims of a B with a higher rank than A are dropped first (a ``[1]`` B
    against a 0-d A, as in the optimizer's ``lr_multiplier``).
    """
    b_shape = tuple(b_shape)
    while len(b_shape) > len(a_shape) and b_shape[0] == 1:
        b_shape = b_shape[1:]
    axis = legacy_axis(args, len(a_shape), len(b_shape))
    padded = (1,) * axis + tuple(b_shape) + (1,) * (len(a_shape) - axis - len(b_shape))
    for a_dim, b_dim in zip(a_shape, padded):
        if b_dim not in (1, a_dim):
            raise ArgumentError(f"broadcast dimension mismatch: B {tuple(b_shape)} at axis "
                                f"{axis} against A {tuple(a_shape)}")
    return padded


def binary_operands(ctx: OpContext) -> tuple[Any, Any]:
    """(A, B), with B reshaped for the legacy ``broadcast=1`` form when it is set."""
    a, b = ctx.inputs[0], ctx.inputs[1]
    if ctx.int_arg("broadcast", 0):
        if np.ndim(b) > np.ndim(a) and any(d != 1 for d in np.shape(b)[:np.ndim(b) - np.ndim(a)]):
            raise ctx.fail(f"with broadcast=1, B {np.shape(b)} cannot have a higher rank than "
                           f"A {np.shape(a)}")
        try:
            b = ctx.xp.reshape(b, legacy_shape(ctx.args, np.shape(a), np.shape(b)))
        except ArgumentError as error:
            raise ctx.fail(str(error)) from None
    else:
        try:
            np.broadcast_shapes(np.shape(a), np.shape(b))
        except ValueError:
            raise ctx.fail(
                f"shapes of {ctx.input_name(0)!r} {np.shape(a)} and {ctx.input_name(1)!r} "
                f"{np.shape(b)} do not broadcast; make them match, or set broadcast=1 (and "
                f"axis) for Caffe2's legacy broadcasting of B into A") from None
    return a, b


def reduce_to_shape(xp: Any, grad: Any, shape: Sequence[int]) -> Any:
    """Sum ``grad`` over the dims numpy broadcasting expanded to reach it from ``shape``."""
    shape = tuple(shape)
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, dim in enumerate(shape) if dim == 1 and grad.shape[lead + i] != 1)
    if axes:
        grad = xp.sum(grad, axis=axes, keepdims=True)
    return xp.reshape(grad, shape)


# --- binary arithmetic -------------------------------------------------------------------
def _int_divide(xp: Any, a: Any, b: Any) -> Any:
    quotient = xp.floor_divide(a, b)
    # C++ integer division truncates towards zero.
    return quotient + ((quotient < 0) & (quotient * b != a))


_ARITHMETIC: dict[str, Callable[[Any, Any, Any], Any]] = {
    "Add": lambda xp, a, b: xp.add(a, b),
    "Sub": lambda xp, a, b: xp.subtract(a, b),
    "Mul": lambda xp, a, b: xp.multiply(a, b),
    "Div": lambda xp, a, b: (_int_divide(xp, a, b) if np.dtype(a.dtype).kind in "iu"
                             else xp.divide(a, b)),
}


_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _binary_target(ctx: OpContext, a: Any, b: Any) -> Any:
    """The input array C is written into when the op is in place (C named as A or B) and C
    has that input's shape, dtype (float) and memory; else ``None``."""
    if not same_float_arrays(a, b):
        return None
    for index, value in ((0, a), (1, b)):
        target = inplace_target(ctx, index, 0)
        if target is value and target.shape == np.broadcast_shapes(a.shape, b.shape):
            return target
    return None


def _register_arithmetic(op_type: str, fn: Callable[[Any, Any, Any], Any]) -> None:
    ufunc = _UFUNCS[op_type]

    def kernel(ctx: OpContext) -> Outputs:
        a, b = binary_operands(ctx)
        target = _binary_target(ctx, a, b)
        if target is not None:
            return (ufunc(a, b, out=target),)
        return (as_dtype(ctx.xp, fn(ctx.xp, ctx.xp.asarray(a), ctx.xp.asarray(b)),
                         ctx.xp.asarray(a).dtype),)

    kernel.__doc__ = f"C = A {op_type} B, elementwise, with Caffe2 broadcasting."
    register_op(op_type, inputs=2, outputs=1, inplace=[(0, 0), (1, 0)],
                shape=_binary_infer())(kernel)


for _type, _fn in _ARITHMETIC.items():
    _register_arithmetic(_type, _fn)


def broadcast_arguments(g: GradientBuilder, with_broadcast: bool = True
                        ) -> list[caffe2_pb2.Argument]:
    """The forward op's broadcast, axis, axis_str and order arguments, with Caffe2's defaults."""
    defaults: list[tuple[str, Any]] = [("axis", -1), ("axis_str", ""), ("order", "NCHW")]
    if with_broadcast:
        defaults.insert(0, ("broadcast", 0))
    result = []
    for name, default in defaults:
        found = [a for a in g.op.arg if a.name == name]
        result.append(found[-1] if found else MakeArgument(name, default))
    return result


def _add_with_args(g: GradientBuilder, op_type: str, inputs: list[str], outputs: list[str],
                   args: Sequence[caffe2_pb2.Argument], name: str = "") -> None:
    op = g.add(op_type, inputs, outputs)
    op.arg.extend(args)
    if name:
        op.name = name


def _has_arg(g: GradientBuilder, name: str) -> bool:
    return any(a.name == name for a in g.op.arg)


@register_gradient("Add")
def _add_gradient(g: GradientBuilder) -> None:
    g.add("AddGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


@register_gradient("Sub")
def _sub_gradient(g: GradientBuilder) -> None:
    g.add("SubGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


@register_gradient("Mul")
def _mul_gradient(g: GradientBuilder) -> None:
    """The final Caffe2's ``MulGradient([dC, A, B]) -> [dA, dB]`` (forward args copied)."""
    if g.O(0) in (g.I(0), g.I(1)):
        raise GradientError(f"Gradient computation cannot be carried out if Mul uses in-place "
                            f"computation: inputs {list(g.op.input)}, output {g.O(0)!r}.")
    g.add("MulGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


@register_gradient("Div")
def _div_gradient(g: GradientBuilder) -> None:
    """The final Caffe2's ``DivGradient([dC, A, B, C]) -> [dA, dB]`` (forward args copied,
    broadcasting included)."""
    if g.O(0) == g.I(1):
        raise GradientError(f"Gradient computation cannot be carried out if Div writes its "
                            f"output over B: inputs {list(g.op.input)}, output {g.O(0)!r}; "
                            f"write C to a new blob.")
    g.add("DivGradient", [g.GO(0), g.I(0), g.I(1), g.O(0)], [g.GI(0), g.GI(1)])


@register_op("DivGradient", inputs=(3, 4), outputs=2)
def div_gradient(ctx: OpContext) -> Outputs:
    """``[dC, A, B, C]`` (or the legacy ``[B, C, dC]``) -> ``[dA = dC / B,
    dB = -dC * C / B]``, each summed down to its input's shape."""
    xp = ctx.xp
    if len(ctx.inputs) == 4:
        dc, a, b, c = (xp.asarray(v) for v in ctx.inputs)
        a_shape = a.shape
    else:
        b, c, dc = (xp.asarray(v) for v in ctx.inputs)
        a_shape = dc.shape
    b_view = xp.reshape(b, binary_operands_shape(ctx, c, b))
    quotient = dc / b_view
    da = reduce_to_shape(xp, xp.broadcast_to(quotient, dc.shape), a_shape)
    db = reduce_to_shape(xp, -quotient * c, b_view.shape)
    return (as_dtype(xp, da, dc.dtype), as_dtype(xp, xp.reshape(db, b.shape), dc.dtype))


@register_op("SumReduceLike", inputs=2, outputs=1, shape=same_as_input(1))
def sum_reduce_like(ctx: OpContext) -> Outputs:
    """Sum A down to B's shape, B aligned to A as in ``broadcast=1`` (axis, axis_str)."""
    a, b = ctx.inputs
    if np.size(b) == 1:
        return (ctx.xp.reshape(ctx.xp.sum(a), np.shape(b)).astype(a.dtype),)
    try:
        padded = legacy_shape(ctx.args, np.shape(a), np.shape(b))
    except ArgumentError as error:
        raise ctx.fail(str(error)) from None
    out = reduce_to_shape(ctx.xp, a, padded)
    return (ctx.xp.reshape(out, np.shape(b)),)


def _late_binary_gradient(op_type: str) -> None:
    """Caffe2's later ``<Op>Gradient([dC, A, B]) -> [dA, dB]`` form, for imported nets."""

    def kernel(ctx: OpContext) -> Outputs:
        dc, a, b = (ctx.xp.asarray(v) for v in ctx.inputs[:3])
        b_view = ctx.xp.reshape(b, binary_operands_shape(ctx, a, b))
        if op_type == "AddGradient":
            da, db = dc, dc
        elif op_type == "SubGradient":
            da, db = dc, -dc
        else:
            da, db = dc * b_view, dc * a
        da = reduce_to_shape(ctx.xp, ctx.xp.broadcast_to(da, dc.shape), a.shape)
        db = reduce_to_shape(ctx.xp, ctx.xp.broadcast_to(db, dc.shape), b_view.shape)
        return (da.astype(dc.dtype), ctx.xp.reshape(db, b.shape).astype(dc.dtype))

    kernel.__doc__ = f"[dC, A, B] -> [dA, dB] for {op_type[:-8]} (broadcast-aware)."
    register_op(op_type, inputs=3, outputs=2)(kernel)


def binary_operands_shape(ctx: OpContext, a: Any, b: Any) -> tuple[int, ...]:
    """B's shape as the forward kernel saw it (legacy padding under ``broadcast=1``)."""
    if ctx.int_arg("broadcast", 0):
        return legacy_shape(ctx.args, a.shape, b.shape)
    return tuple(b.shape)


for _type in ("AddGradient", "SubGradient", "MulGradient"):
    _late_binary_gradient(_type)


# --- comparisons and logic ---------------------------------------------------------------
_COMPARE: dict[str, Callable[[Any, Any, Any], Any]] = {
    "EQ": lambda xp, a, b: xp.equal(a, b), "NE": lambda xp, a, b: xp.not_equal(a, b),
    "LT": lambda xp, a, b: xp.less(a, b), "LE": lambda xp, a, b: xp.less_equal(a, b),
    "GT": lambda xp, a, b: xp.greater(a, b), "GE": lambda xp, a, b: xp.greater_equal(a, b),
    "And": lambda xp, a, b: xp.logical_and(a, b), "Or": lambda xp, a, b: xp.logical_or(a, b),
    "Xor": lambda xp, a, b: xp.logical_xor(a, b),
}


def _register_compare(op_type: str, fn: Callable[[Any, Any, Any], Any]) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        a, b = binary_operands(ctx)
        return (ctx.xp.asarray(fn(ctx.xp, a, b)),)

    kernel.__doc__ = f"C = {op_type}(A, B) as bool, with Caffe2 broadcasting."
    inplace = [(0, 0)] if op_type in ("And", "Or", "Xor") else []
    register_op(op_type, inputs=2, outputs=1, inplace=inplace,
                shape=_binary_infer(DataType.BOOL))(kernel)


for _type, _compare_fn in _COMPARE.items():
    _register_compare(_type, _compare_fn)


_BITWISE: dict[str, Callable[[Any, Any, Any], Any]] = {
    "BitwiseAnd": lambda xp, a, b: xp.bitwise_and(a, b),
    "BitwiseOr": lambda xp, a, b: xp.bitwise_or(a, b),
    "BitwiseXor": lambda xp, a, b: xp.bitwise_xor(a, b),
}


def _register_bitwise(op_type: str, fn: Callable[[Any, Any, Any], Any]) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        a, b = binary_operands(ctx)
        if a.dtype.kind not in "biu" or b.dtype.kind not in "biu":
            raise ArgumentError(ctx.describe(
                f"{op_type} takes bool or integer tensors, got {a.dtype} and {b.dtype}; "
                "cast them first"))
        return (ctx.xp.asarray(fn(ctx.xp, a, b)),)

    kernel.__doc__ = f"C = {op_type}(A, B) on bool/integer tensors, with Caffe2 broadcasting."
    register_op(op_type, inputs=2, outputs=1, inplace=[(0, 0)], shape=_binary_infer())(kernel)


for _type, _bitwise_fn in _BITWISE.items():
    _register_bitwise(_type, _bitwise_fn)


@register_op("Not", inputs=1, outputs=1, shape=same_as_input(0, DataType.BOOL))
def not_op(ctx: OpContext) -> Outputs:
    """Y = not X (bool)."""
    return (ctx.xp.logical_not(ctx.inputs[0]),)


# --- unary functions ---------------------------------------------------------------------
def erf(xp: Any, x: Any) -> Any:
    """erf(x) elementwise (scipy when installed, else the math module), on ``xp``."""
    try:
        from scipy.special import erf as erf_fn
    except ImportError:  # scipy is optional: fall back to the math module
        erf_fn = np.vectorize(_pymath.erf, otypes=[np.float64])
    return xp.asarray(erf_fn(to_host(x)))


def _erf_grad(xp: Any, x: Any) -> Any:
    return 2.0 / np.sqrt(np.pi) * xp.exp(-x * x)


_UNARY: dict[str, Callable[[Any, Any], Any]] = {
    "Exp": lambda xp, x: xp.exp(x), "Log": lambda xp, x: xp.log(x),
    "Sqrt": lambda xp, x: xp.sqrt(x), "Abs": lambda xp, x: xp.abs(x),
    "Negative": lambda xp, x: xp.negative(x), "Sign": lambda xp, x: xp.sign(x),
    "Ceil": lambda xp, x: xp.ceil(x), "Floor": lambda xp, x: xp.floor(x),
    "Sqr": lambda xp, x: xp.multiply(x, x), "Erf": erf,
    "Cos": lambda xp, x: xp.cos(x), "Sin": lambda xp, x: xp.sin(x),
    "Tan": lambda xp, x: xp.tan(x), "Acos": lambda xp, x: xp.arccos(x),
    "Asin": lambda xp, x: xp.arcsin(x), "Atan": lambda xp, x: xp.arctan(x),
    "Cosh": lambda xp, x: xp.cosh(x), "Sinh": lambda xp, x: xp.sinh(x),
    "Rsqrt": lambda xp, x: 1.0 / xp.sqrt(x), "Cube": lambda xp, x: x * x * x,
}

#: d f / d x for the ops whose gradient op is ``<Op>Gradient``.
_DERIVATIVES: dict[str, Callable[[Any, Any], Any]] = {
    "Abs": lambda xp, x: xp.sign(x), "Erf": _erf_grad,
    "Cos": lambda xp, x: -xp.sin(x), "Sin": lambda xp, x: xp.cos(x),
    "Tan": lambda xp, x: 1.0 / xp.cos(x) ** 2,
    "Acos": lambda xp, x: -1.0 / xp.sqrt(1.0 - x * x),
    "Asin": lambda xp, x: 1.0 / xp.sqrt(1.0 - x * x),
    "Atan": lambda xp, x: 1.0 / (1.0 + x * x),
    "Cosh": lambda xp, x: xp.sinh(x), "Sinh": lambda xp, x: xp.cosh(x),
    "Cube": lambda xp, x: 3.0 * x * x,
}

#: Gradient ops whose inputs are [dY, X] rather than [X, dY].
_DY_FIRST = frozenset({"Cosh", "Sinh", "Cube"})


def _register_unary(op_type: str, fn: Callable[[Any, Any], Any]) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        x = ctx.xp.asarray(ctx.inputs[0])
        return (as_dtype(ctx.xp, fn(ctx.xp, x), x.dtype),)

    kernel.__doc__ = f"Y = {op_type}(X), elementwise."
    register_op(op_type, inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())(kernel)


def _register_derivative(op_type: str, fn: Callable[[Any, Any], Any]) -> None:
    grad_type = op_type + "Gradient"
    dy_first = op_type in _DY_FIRST

    def kernel(ctx: OpContext) -> Outputs:
        first, second = ctx.inputs
        x, dy = (second, first) if dy_first else (first, second)
        return (as_dtype(ctx.xp, dy * fn(ctx.xp, x), dy.dtype),)

    kernel.__doc__ = f"dX = dY * {op_type}'(X)."
    register_op(grad_type, inputs=2, outputs=1, shape=same_as_input(1 if dy_first else 0)
                )(kernel)

    def maker(g: GradientBuilder) -> None:
        inputs = [g.GO(0), g.I(0)] if dy_first else [g.I(0), g.GO(0)]
        g.add(grad_type, inputs, [g.GI(0)])

    register_gradient(op_type)(maker)


for _type, _unary_fn in _UNARY.items():
    _register_unary(_type, _unary_fn)
for _type, _derivative in _DERIVATIVES.items():
    _register_derivative(_type, _derivative)


@register_gradient("Exp")
def _exp_gradient(g: GradientBuilder) -> None:
    g.add("Mul", [g.O(0), g.GO(0)], [g.GI(0)])


@register_gradient("Log")
def _log_gradient(g: GradientBuilder) -> None:
    g.add("Div", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("Sqrt")
def _sqrt_gradient(g: GradientBuilder) -> None:
    g.add("Scale", [g.GO(0)], [g.GI(0)], scale=0.5)
    g.add("Div", [g.GI(0), g.O(0)], [g.GI(0)])


@register_op("RsqrtGradient", inputs=2, outputs=1, shape=same_as_input())
def rsqrt_gradient(ctx: OpContext) -> Outputs:
    """[dY, Y] -> dX = -0.5 * dY * Y**3."""
    dy, y = ctx.inputs
    return (as_dtype(ctx.xp, -0.5 * dy * y * y * y, dy.dtype),)


@register_gradient("Rsqrt")
def _rsqrt_gradient(g: GradientBuilder) -> None:
    g.add("RsqrtGradient", [g.GO(0), g.O(0)], [g.GI(0)])


@register_gradient("Negative")
def _negative_gradient(g: GradientBuilder) -> None:
    g.add("Negative", [g.GO(0)], [g.GI(0)])


@register_gradient("Sqr")
def _sqr_gradient(g: GradientBuilder) -> None:
    g.add("Scale", [g.GO(0)], [g.GO(0)], scale=2.0)
    g.add("Mul", [g.GO(0), g.I(0)], [g.GI(0)])


@register_op("Scale", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def scale(ctx: OpContext) -> Outputs:
    """Y = scale * X."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if same_float_arrays(x):
        return (np.multiply(x, ctx.float_arg("scale", 1.0), out=out_buffer(ctx, 0, 0)),)
    return (as_dtype(ctx.xp, x * ctx.float_arg("scale", 1.0), x.dtype),)


@register_gradient("Scale")
def _scale_gradient(g: GradientBuilder) -> None:
    g.add("Scale", [g.GO(0)], [g.GI(0)])  # the forward ``scale`` argument is copied


@register_op("ScaleBlobs", inputs=(1, None), outputs=(1, None), inplace="any")
def scale_blobs(ctx: OpContext) -> Outputs:
    """Y_i = scale * X_i for every input (one output per input)."""
    if ctx.num_outputs != len(ctx.inputs):
        raise ctx.fail(f"ScaleBlobs needs one output per input, got {len(ctx.inputs)} inputs "
                       f"and {ctx.num_outputs} outputs")
    factor = ctx.float_arg("scale", 1.0)
    return tuple(as_dtype(ctx.xp, ctx.xp.asarray(x) * factor, ctx.xp.asarray(x).dtype)
                 for x in ctx.inputs)


@register_gradient("ScaleBlobs")
def _scale_blobs_gradient(g: GradientBuilder) -> None:
    count = len(g.op.input)
    g.add("ScaleBlobs", [g.GO(i) for i in range(count)], [g.GI(i) for i in range(count)])


# --- Pow ---------------------------------------------------------------------------------
@register_op("Pow", inputs=(1, 2), outputs=1, inplace=[(0, 0), (1, 0)], shape=same_as_input())
def pow_op(ctx: OpContext) -> Outputs:
    """Z = X ** exponent (argument) or X ** Y (second input, Caffe2 broadcasting)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if len(ctx.inputs) == 1:
        if not ctx.has_arg("exponent"):
            raise ArgumentError(ctx.describe("needs an exponent argument or a second input"))
        return (as_dtype(ctx.xp, ctx.xp.power(x, ctx.float_arg("exponent")), x.dtype),)
    if ctx.has_arg("exponent"):
        raise ArgumentError(ctx.describe("give either the exponent argument or a 2nd input"))
    a, b = binary_operands(ctx)
    return (as_dtype(ctx.xp, ctx.xp.power(a, b), x.dtype),)


@register_gradient("Pow", copy_arguments=False)
def _pow_gradient(g: GradientBuilder) -> None:
    if _has_arg(g, "exponent"):
        exponent = float(g.arg("exponent"))
        if g.I(0) != g.O(0):
            reduced = exponent - 1.0
        elif abs(exponent) > 1e-12:
            reduced = (exponent - 1.0) / exponent
        else:
            raise GradientError(f"In-place Pow of {g.I(0)!r} with exponent 0 has no usable "
                                "gradient; write the Pow output to a new blob.")
        g.add("Pow", [g.I(0)], [g.GI(0)], exponent=reduced)
        g.add("Mul", [g.GI(0), g.GO(0)], [g.GI(0)])
        g.add("Scale", [g.GI(0)], [g.GI(0)], scale=exponent)
        return
    _pow_tensor_gradient(g)


def _pow_tensor_gradient(g: GradientBuilder) -> None:
    if g.O(0) in (g.I(0), g.I(1)):
        raise GradientError("Gradient computation cannot be carried out if Pow uses in-place "
                            f"computation: inputs {list(g.op.input)}, output {g.O(0)!r}.")
    bflag = _has_arg(g, "broadcast")
    args = broadcast_arguments(g) if bflag else []
    gx, gy = g.GI(0), g.GI(1)
    g.add("ConstantFill", [g.I(1)], [gy], value=1.0)
    g.add("Sub", [g.I(1), gy], [gy])
    _add_with_args(g, "Pow", [g.I(0), gy], [gx], args)
    g.add("Mul", [gx, g.GO(0)], [gx])
    _add_with_args(g, "Mul", [gx, g.I(1)], [gx], args)
    pre = gy + "_autogen_pre_red"
    g.add("Log", [g.I(0)], [pre])
    g.add("Mul", [pre, g.O(0)], [pre])
    if bflag:
        g.add("Mul", [pre, g.GO(0)], [pre])
        _add_with_args(g, "SumReduceLike", [pre, g.I(1)], [gy], args[1:])
    else:
        g.add("Mul", [pre, g.GO(0)], [gy])


# --- N-ary -------------------------------------------------------------------------------
@register_op("Sum", inputs=(1, None), outputs=1, inplace=[(0, 0)], shape=same_as_input())
def sum_op(ctx: OpContext) -> Outputs:
    """Y = X0 + X1 + ... (same shapes); the output may be X0."""
    xp = ctx.xp
    first = xp.asarray(ctx.inputs[0])
    if len(ctx.inputs) == 1:
        return (first.copy(),)
    for index, value in enumerate(ctx.inputs[1:], 1):
        if np.shape(value) != first.shape:
            raise ctx.fail(f"input {ctx.input_name(index)!r} has shape {np.shape(value)} but "
                           f"{ctx.input_name(0)!r} has {first.shape}; Sum needs inputs of one "
                           f"shape (use Add with broadcast=1 to broadcast)")
    if same_float_arrays(*ctx.inputs) and reads_apart(inplace_target(ctx, 0, 0),
                                                      ctx.inputs[2:]):
        # one pass per input, into X0 when in place (X2... are read after X0 is written)
        total = np.add(first, ctx.inputs[1], out=out_buffer(ctx, 0, 0))
        for value in ctx.inputs[2:]:
            np.add(total, value, out=total)
        return (total,)
    total = reduce(xp.add, ctx.inputs[1:], first)
    return (as_dtype(xp, total, first.dtype),)


@register_gradient("Sum")
def _sum_gradient(g: GradientBuilder) -> None:
    for index in range(len(g.op.input)):
        g.set_input_grad(index, g.GO(0))


def _register_extremum(op_type: str, fn: Callable[..., Any]) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        first = ctx.xp.asarray(ctx.inputs[0])
        return (as_dtype(ctx.xp, reduce(fn, ctx.inputs[1:], first), first.dtype),)

    kernel.__doc__ = f"Y = elementwise {op_type} over all inputs."
    register_op(op_type, inputs=(1, None), outputs=1, inplace=[(0, 0)],
                shape=same_as_input())(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        y, dy = ctx.inputs[0], ctx.inputs[1]
        return tuple(as_dtype(ctx.xp, dy * (x == y), dy.dtype) for x in ctx.inputs[2:])

    grad_kernel.__doc__ = f"[Y, dY, X0, ...] -> dXi = dY where Xi == Y ({op_type})."
    register_op(op_type + "Gradient", inputs=(3, None), outputs=(1, None))(grad_kernel)

    def maker(g: GradientBuilder) -> None:
        count = len(g.op.input)
        g.add(op_type + "Gradient", [g.O(0), g.GO(0), *[g.I(i) for i in range(count)]],
              [g.GI(i) for i in range(count)])

    register_gradient(op_type)(maker)


_register_extremum("Max", np.maximum)
_register_extremum("Min", np.minimum)


@register_op("Mean", inputs=(1, None), outputs=1, inplace=[(0, 0)], shape=same_as_input())
def mean_op(ctx: OpContext) -> Outputs:
    """Y = (X0 + ... + Xn-1) / n."""
    first = ctx.xp.asarray(ctx.inputs[0])
    total = reduce(ctx.xp.add, ctx.inputs[1:], first)
    return (as_dtype(ctx.xp, total / len(ctx.inputs), first.dtype),)


@register_op("MeanGradient", inputs=1, outputs=(1, None))
def mean_gradient(ctx: OpContext) -> Outputs:
    """dY -> dXi = dY / n for each of the n outputs."""
    dy = ctx.xp.asarray(ctx.inputs[0])
    grad = as_dtype(ctx.xp, dy / ctx.num_outputs, dy.dtype)
    return tuple(grad.copy() for _ in range(ctx.num_outputs))


@register_gradient("Mean")
def _mean_gradient(g: GradientBuilder) -> None:
    g.add("MeanGradient", [g.GO(0)], [g.GI(i) for i in range(len(g.op.input))])


# --- scaling helpers ---------------------------------------------------------------------
@register_op("SquareRootDivide", inputs=2, outputs=1, shape=same_as_input())
def square_root_divide(ctx: OpContext) -> Outputs:
    """Y[i] = X[i] / sqrt(scale[i]) (scale 0 counts as 1), rows along the first dim."""
    xp = ctx.xp
    data, factor = xp.asarray(ctx.inputs[0]), xp.asarray(ctx.inputs[1])
    if factor.shape[:1] != data.shape[:1]:
        raise ctx.fail(f"scale {factor.shape} must have one value per row of data "
                       f"{data.shape}")
    root = xp.sqrt(xp.where(factor == 0, 1, factor).astype(np.float64))
    root = root.reshape((-1,) + (1,) * (data.ndim - 1))
    return (as_dtype(xp, data / root, data.dtype),)


@register_gradient("SquareRootDivide")
def _square_root_divide_gradient(g: GradientBuilder) -> None:
    g.add("SquareRootDivide", [g.GO(0), g.I(1)], [g.GI(0)])


@register_op("ClipTensorByScaling", inputs=(2, 3), outputs=1, inplace=[(0, 0)],
             shape=same_as_input())
def clip_tensor_by_scaling(ctx: OpContext) -> Outputs:
    """Y = X * threshold / val when val > threshold (val: a norm), else X.

    A 3rd input, when given, holds an additional scale applied to ``threshold``.
    """
    x = ctx.xp.asarray(ctx.inputs[0])
    value = float(np.asarray(to_host(ctx.inputs[1])).reshape(-1)[0])
    threshold = ctx.float_arg("threshold", 0.0)
    if len(ctx.inputs) == 3:
        threshold *= float(np.asarray(to_host(ctx.inputs[2])).reshape(-1)[0])
    if value > threshold:
        return (as_dtype(ctx.xp, x * (threshold / value), x.dtype),)
    return (x.copy(),)
