"""Activations: Relu family, Sigmoid/Tanh, Softmax, Softplus, Swish, Glu, PRelu, Clip, Dropout.

Gradient ops follow Caffe2: most take ``[Y, dY]`` (``ReluGradient``, ``SigmoidGradient``,
``SoftmaxGradient``...); ``SwishGradient`` takes ``[X, Y, dY]``; ``PReluGradient`` takes
``[Y, dY, X, slope]``; ``DropoutGrad`` takes ``[dY, mask]`` (``[dY]`` with ``is_test``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, GradientError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import as_dtype, out_buffer, same_as_input, same_float_arrays
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import DataType
from dpgraph.ops.gradient_builder import GradientBuilder

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _sigmoid(xp: Any, x: Any) -> Any:
    # exp of a non-positive number only: no overflow warnings for large |x|.
    z = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


# --- [Y, dY] activations -----------------------------------------------------------------
Forward = Callable[[OpContext, Any, Any], Any]
Backward = Callable[[OpContext, Any, Any, Any], Any]

_FORWARD: dict[str, Forward] = {
    "Relu": lambda ctx, xp, x: xp.maximum(x, 0),
    "ReluN": lambda ctx, xp, x: xp.clip(x, 0, ctx.float_arg("n", 6.0)),
    "LeakyRelu": lambda ctx, xp, x: xp.where(x >= 0, x, x * ctx.float_arg("alpha", 0.01)),
    "Elu": lambda ctx, xp, x: xp.where(
        x > 0, x, ctx.float_arg("alpha", 1.0) * xp.expm1(xp.minimum(x, 0))),
    "Selu": lambda ctx, xp, x: ctx.float_arg("scale", _SELU_SCALE) * xp.where(
        x > 0, x, ctx.float_arg("alpha", _SELU_ALPHA) * xp.expm1(xp.minimum(x, 0))),
    "ThresholdedRelu": lambda ctx, xp, x: xp.where(x > ctx.float_arg("alpha", 1.0), x, 0),
    "Sigmoid": lambda ctx, xp, x: _sigmoid(xp, x),
    "Tanh": lambda ctx, xp, x: xp.tanh(x),
    "Softplus": lambda ctx, xp, x: xp.logaddexp(x, 0),
    "HardSigmoid": lambda ctx, xp, x: xp.clip(
        ctx.float_arg("alpha", 0.2) * x + ctx.float_arg("beta", 0.5), 0, 1),
}

_BACKWARD: dict[str, Backward] = {
    "Relu": lambda ctx, xp, y, dy: dy * (y > 0),
    "ReluN": lambda ctx, xp, y, dy: dy * ((y > 0) & (y < ctx.float_arg("n", 6.0))),
    "LeakyRelu": lambda ctx, xp, y, dy: xp.where(y > 0, dy, dy * ctx.float_arg("alpha", 0.01)),
    "Elu": lambda ctx, xp, y, dy: xp.where(y > 0, dy, dy * (y + ctx.float_arg("alpha", 1.0))),
    "Selu": lambda ctx, xp, y, dy: ctx.float_arg("scale", _SELU_SCALE) * xp.where(
        y > 0, dy,
        dy * (y / ctx.float_arg("scale", _SELU_SCALE) + ctx.float_arg("alpha", _SELU_ALPHA))),
    "ThresholdedRelu": lambda ctx, xp, y, dy: dy * (y > 0),
    "Sigmoid": lambda ctx, xp, y, dy: dy * y * (1 - y),
    "Tanh": lambda ctx, xp, y, dy: dy * (1 - y * y),
    "Softplus": lambda ctx, xp, y, dy: dy * -xp.expm1(-y),
    "HardSigmoid": lambda ctx, xp, y, dy: dy * ctx.float_arg("alpha", 0.2) * ((y > 0) & (y < 1)),
}


# Hot activations written with ``out=``: into X (forward) or dY (gradient) when the op is in
# place, as Caffe2 runs them; the same float operations as the forms above.
_FORWARD_INTO: dict[str, Callable[[Any, Any], Any]] = {
    "Relu": lambda x, out: np.maximum(x, 0, out=out),
}
def _relu_gradient_into(y: Any, dy: Any, out: Any) -> Any:
    """dY * (Y > 0), with the mask written as dY's float type first (1.0/0.0, the values the
    bool mask converts to): a plain float multiply, about 10% faster than one casting a
    bool mask inside (measured on [256, 1024] float32)."""
    mask = np.empty_like(dy) if out is None or out is dy or out is y else out
    np.greater(y, 0, out=mask)
    return np.multiply(dy, mask, out=mask if out is None else out)


_BACKWARD_INTO: dict[str, Callable[[Any, Any, Any], Any]] = {
    "Relu": _relu_gradient_into,
}


_IN_PLACE = "\0in_place"


def _into(ctx: OpContext, value: np.ndarray, input_index: int) -> np.ndarray | None:
    """``out=`` for a hot activation: ``value`` (input ``input_index``) when the op writes
    its blob in place (names compared once per op instance) and the array may be written
    there (it owns its memory, a view could alias another blob), else None: a new array."""
    in_place = ctx.args.get(_IN_PLACE)
    if in_place is None:
        in_place = ctx.args[_IN_PLACE] = ctx.op.input[input_index] == ctx.op.output[0]
    return value if in_place and value.base is None and value.flags.writeable else None


def _register_activation(op_type: str) -> None:
    forward, backward = _FORWARD[op_type], _BACKWARD[op_type]
    forward_into, backward_into = _FORWARD_INTO.get(op_type), _BACKWARD_INTO.get(op_type)

    def kernel(ctx: OpContext) -> Outputs:
        x = ctx.inputs[0]
        if forward_into is not None and type(x) is np.ndarray and x.dtype.kind == "f":
            return (forward_into(x, _into(ctx, x, 0)),)
        x = ctx.xp.asarray(x)
        if forward_into is not None and same_float_arrays(x):
            return (forward_into(x, out_buffer(ctx, 0, 0)),)
        return (as_dtype(ctx.xp, forward(ctx, ctx.xp, x), x.dtype),)

    kernel.__doc__ = f"Y = {op_type}(X), elementwise."
    register_op(op_type, inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        y, dy = ctx.inputs
        if backward_into is not None and type(y) is np.ndarray and type(dy) is np.ndarray \
                and y.dtype.kind == "f" and dy.dtype == y.dtype and y.shape == dy.shape:
            return (backward_into(y, dy, _into(ctx, dy, 1)),)
        y, dy = ctx.xp.asarray(y), ctx.xp.asarray(dy)
        if backward_into is not None and same_float_arrays(y, dy) and y.shape == dy.shape:
            return (backward_into(y, dy, out_buffer(ctx, 1, 0)),)
        return (as_dtype(ctx.xp, backward(ctx, ctx.xp, y, dy), dy.dtype),)

    grad_kernel.__doc__ = f"[Y, dY] -> dX for {op_type}."
    register_op(op_type + "Gradient", inputs=2, outputs=1, inplace=[(1, 0)],
                shape=same_as_input(1))(grad_kernel)

    def maker(g: GradientBuilder) -> None:
        g.add(op_type + "Gradient", [g.O(0), g.GO(0)], [g.GI(0)])

    register_gradient(op_type)(maker)


for _type in _FORWARD:
    _register_activation(_type)


# --- Clip -------------------------------------------------------------------------------
@register_op("Clip", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def clip(ctx: OpContext) -> Outputs:
    """Y = min(max(X, min), max); unset bounds are open."""
    x = ctx.xp.asarray(ctx.inputs[0])
    low = ctx.float_arg("min") if ctx.has_arg("min") else None
    high = ctx.float_arg("max") if ctx.has_arg("max") else None
    if low is None and high is None:
        return (x.copy(),)
    return (as_dtype(ctx.xp, ctx.xp.clip(x, low, high), x.dtype),)


@register_op("ClipGradient", inputs=2, outputs=1, inplace=[(1, 0)], shape=same_as_input(1))
def clip_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY] -> dX = dY where min < Y < max, else 0."""
    y, dy = ctx.inputs
    mask = ctx.xp.ones(y.shape, dtype=bool)
    if ctx.has_arg("min"):
        mask &= y > ctx.float_arg("min")
    if ctx.has_arg("max"):
        mask &= y < ctx.float_arg("max")
    return (as_dtype(ctx.xp, dy * mask, dy.dtype),)


@register_gradient("Clip")
def _clip_gradient(g: GradientBuilder) -> None:
    g.add("ClipGradient", [g.O(0), g.GO(0)], [g.GI(0)])



# --- Swish, Glu, PRelu -------------------------------------------------------------------
@register_op("Swish", inputs=1, outputs=1, shape=same_as_input())
def swish(ctx: OpContext) -> Outputs:
    """Y = X * sigmoid(X)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    return (as_dtype(ctx.xp, x * _sigmoid(ctx.xp, x), x.dtype),)


@register_op("SwishGradient", inputs=3, outputs=1, shape=same_as_input())
def swish_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dY] -> dX = dY * (Y + sigmoid(X) * (1 - Y))."""
    x, y, dy = (ctx.xp.asarray(v) for v in ctx.inputs)
    return (as_dtype(ctx.xp, dy * (y + _sigmoid(ctx.xp, x) * (1 - y)), dy.dtype),)


@register_gradient("Swish")
def _swish_gradient(g: GradientBuilder) -> None:
    g.add("SwishGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


def _glu_infer(op: Any, in_shapes: Any, in_types: Any) -> list[Any]:
    if in_shapes[0] is None:
        return [None]
    shape = list(in_shapes[0])
    dim = int(arguments_dict(op.arg).get("dim", -1))
    shape[dim] //= 2
    return [(tuple(shape), in_types[0])]


@register_op("Glu", inputs=1, outputs=1, shape=_glu_infer)
def glu(ctx: OpContext) -> Outputs:
    """Split X in halves A, B along ``dim`` (default -1); Y = A * sigmoid(B)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    dim = ctx.int_arg("dim", -1)
    if x.shape[dim] % 2:
        raise ctx.fail(f"dim {dim} of X {x.shape} must have an even size")
    a, b = ctx.xp.split(x, 2, axis=dim)
    return (as_dtype(ctx.xp, a * _sigmoid(ctx.xp, b), x.dtype),)


def _slope_view(ctx: OpContext, x: Any, slope: Any) -> Any:
    if slope.size == 1:
        return slope.reshape(())
    nhwc = ctx.str_arg("order", "NCHW") == "NHWC"
    channels = x.shape[-1] if nhwc else x.shape[1]
    if slope.size != channels:
        raise ctx.fail(f"slope has {slope.size} values but X {x.shape} has {channels} "
                       "channels; give one slope or one per channel")
    if nhwc:
        return slope.reshape(-1)
    return slope.reshape((1, -1) + (1,) * (x.ndim - 2))


@register_op("PRelu", inputs=2, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def prelu(ctx: OpContext) -> Outputs:
    """Y = X where X > 0, else slope * X (one slope, or one per channel)."""
    x, slope = (ctx.xp.asarray(v) for v in ctx.inputs)
    return (as_dtype(ctx.xp, ctx.xp.where(x > 0, x, x * _slope_view(ctx, x, slope)),
                     x.dtype),)


@register_op("PReluGradient", inputs=4, outputs=2)
def prelu_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY, X, slope] -> [dX, dslope]."""
    _, dy, x, slope = (ctx.xp.asarray(v) for v in ctx.inputs)
    view = _slope_view(ctx, x, slope)
    dx = ctx.xp.where(x > 0, dy, dy * view)
    contribution = ctx.xp.where(x > 0, 0, dy * x)
    if slope.size == 1:
        dslope = ctx.xp.sum(contribution).reshape(slope.shape)
    else:
        channel = x.ndim - 1 if ctx.str_arg("order", "NCHW") == "NHWC" else 1
        axes = tuple(i for i in range(x.ndim) if i != channel)
        dslope = ctx.xp.sum(contribution, axis=axes).reshape(slope.shape)
    return (as_dtype(ctx.xp, dx, dy.dtype), as_dtype(ctx.xp, dslope, slope.dtype))


@register_gradient("PRelu")
def _prelu_gradient(g: GradientBuilder) -> None:
    g.add("PReluGradient", [g.O(0), g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


# --- Softmax -----------------------------------------------------------------------------
def _as_rows(ctx: OpContext, x: Any) -> Any:
    axis = ctx.int_arg("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ctx.fail(f"axis {ctx.int_arg('axis', 1)} out of range for X {x.shape}")
    rows = int(np.prod(x.shape[:axis]))
    return x.reshape(rows, int(np.prod(x.shape[axis:])))


def softmax_rows(xp: Any, rows: Any) -> Any:
    """Row-wise softmax of a 2-D array (max-shifted)."""
    if rows.size == 0:
        return rows.copy()
    shifted = xp.exp(rows - xp.max(rows, axis=1, keepdims=True))
    return shifted / xp.sum(shifted, axis=1, keepdims=True)


@register_op("Softmax", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def softmax(ctx: OpContext) -> Outputs:
    """Softmax over the dims from ``axis`` (default 1) on, after a 2-D flatten."""
    x = ctx.xp.asarray(ctx.inputs[0])
    return (as_dtype(ctx.xp, softmax_rows(ctx.xp, _as_rows(ctx, x)).reshape(x.shape), x.dtype),)


@register_op("SoftmaxGradient", inputs=2, outputs=1, inplace=[(1, 0)], shape=same_as_input(1))
def softmax_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY] -> dX = Y * (dY - sum(dY * Y)) per row."""
    y, dy = (ctx.xp.asarray(v) for v in ctx.inputs)
    y2, dy2 = _as_rows(ctx, y), _as_rows(ctx, dy)
    dx = y2 * (dy2 - ctx.xp.sum(dy2 * y2, axis=1, keepdims=True))
    return (as_dtype(ctx.xp, dx.reshape(dy.shape), dy.dtype),)


@register_gradient("Softmax")
def _softmax_gradient(g: GradientBuilder) -> None:
    g.add("SoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)])


@register_op("LogSoftmax", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def log_softmax(ctx: OpContext) -> Outputs:
    """log(Softmax(X)) over the dims from ``axis`` (default 1) on, computed stably."""
    x = ctx.xp.asarray(ctx.inputs[0])
    rows = _as_rows(ctx, x)
    if rows.size == 0:
        return (x.copy(),)
    shifted = rows - ctx.xp.max(rows, axis=1, keepdims=True)
    out = shifted - ctx.xp.log(ctx.xp.sum(ctx.xp.exp(shifted), axis=1, keepdims=True))
    return (as_dtype(ctx.xp, out.reshape(x.shape), x.dtype),)


@register_op("LogSoftmaxGradient", inputs=2, outputs=1, inplace=[(1, 0)],
             shape=same_as_input(1))
def log_softmax_gradient(ctx: OpContext) -> Outputs:
    """[Y, dY] -> dX = dY - exp(Y) * sum(dY) per row."""
    y, dy = (ctx.xp.asarray(v) for v in ctx.inputs)
    y2, dy2 = _as_rows(ctx, y), _as_rows(ctx, dy)
    dx = dy2 - ctx.xp.exp(y2) * ctx.xp.sum(dy2, axis=1, keepdims=True)
    return (as_dtype(ctx.xp, dx.reshape(dy.shape), dy.dtype),)


@register_gradient("LogSoftmax")
def _log_softmax_gradient(g: GradientBuilder) -> None:
    g.add("LogSoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)])


# --- Dropout -----------------------------------------------------------------------------
def _dropout_infer(op: Any, in_shapes: Any, in_types: Any) -> list[Any]:
    if in_shapes[0] is None:
        return [None] * len(op.output)
    shape = tuple(in_shapes[0])
    return [(shape, in_types[0]), (shape, DataType.BOOL)][:len(op.output)]


def _ratio(ctx: OpContext) -> float:
    ratio = ctx.float_arg("ratio", 0.5)
    if not 0.0 <= ratio <= 1.0:
        raise ArgumentError(ctx.describe(f"ratio {ratio} must be in [0, 1]"))
    return ratio


def _keep_scale(ratio: float) -> float:
    """1 / (1 - ratio); 0 when everything is dropped (ratio 1), as in Caffe2."""
    return 0.0 if ratio >= 1.0 else 1.0 / (1.0 - ratio)


@register_op("Dropout", inputs=1, outputs=(1, 2), inplace=[(0, 0)], shape=_dropout_infer)
def dropout(ctx: OpContext) -> Outputs:
    """Training: keep each element with probability 1-ratio, scaled by 1/(1-ratio); the
    mask output is bool.  ``is_test=1``: identity (mask all True)."""
    xp = ctx.xp
    x = xp.asarray(ctx.inputs[0])
    ratio = _ratio(ctx)
    if ctx.int_arg("is_test", 0):
        outputs = [x.copy(), xp.ones(x.shape, dtype=bool)]
    else:
        mask = xp.asarray(ctx.rng.uniform(0.0, 1.0, size=x.shape) >= ratio)
        outputs = [as_dtype(xp, x * mask * _keep_scale(ratio), x.dtype), mask]
    return tuple(outputs[:ctx.num_outputs])


@register_op("DropoutGrad", inputs=(1, 2), outputs=1, inplace=[(0, 0)], shape=same_as_input())
def dropout_grad(ctx: OpContext) -> Outputs:
    """[dY, mask] -> dX = dY * mask / (1 - ratio); ``is_test``: dX = dY."""
    dy = ctx.xp.asarray(ctx.inputs[0])
    if ctx.int_arg("is_test", 0):
        return (dy.copy(),)
    if len(ctx.inputs) < 2:
        raise ctx.fail("training-mode DropoutGrad needs the mask input")
    scale = _keep_scale(_ratio(ctx))
    return (as_dtype(ctx.xp, dy * ctx.inputs[1] * scale, dy.dtype),)


@register_gradient("Dropout")
def _dropout_gradient(g: GradientBuilder) -> None:
    if g.arg("is_test", 0):
        g.add("DropoutGrad", [g.GO(0)], [g.GI(0)])
        return
    if len(g.op.output) < 2:
        raise GradientError(f"Dropout {list(g.op.input)} -> {list(g.op.output)}: training "
                            "mode needs the mask output for its gradient; add a 2nd output.")
    g.add("DropoutGrad", [g.GO(0), g.O(1)], [g.GI(0)])
