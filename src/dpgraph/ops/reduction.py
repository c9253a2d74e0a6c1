"""Reductions: SumElements/SumSqrElements, ReduceFront*/ReduceBack*, Reduce* over ``axes``,
RowwiseMax/ColwiseMax and ArgMax/ArgMin, with Caffe2's gradient ops where Caffe2 has them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import ShapeResult, as_dtype, same_as_input, to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import DataType
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2


def _scalar_infer(dtype: int | None = None) -> Callable[..., ShapeResult]:
    def infer(op: caffe2_pb2.OperatorDef, in_shapes: Sequence[Any],
              in_types: Sequence[Any]) -> ShapeResult:
        return [((), in_types[0] if dtype is None else dtype)]

    return infer


@register_op("SumElements", inputs=1, outputs=1, shape=_scalar_infer())
def sum_elements(ctx: OpContext) -> Outputs:
    """Y = sum(X) (or the mean with ``average=1``), a 0-d tensor."""
    x = ctx.xp.asarray(ctx.inputs[0])
    total = ctx.xp.sum(x)
    if ctx.int_arg("average", 0):
        total = total / max(x.size, 1)
    return (as_dtype(ctx.xp, total, x.dtype),)


@register_op("SumElementsGradient", inputs=2, outputs=1, shape=same_as_input())
def sum_elements_gradient(ctx: OpContext) -> Outputs:
    """[X, dY] -> dX = dY (divided by numel with ``average=1``) everywhere."""
    x, dy = ctx.inputs
    value = ctx.xp.reshape(ctx.xp.asarray(dy), ())
    if ctx.int_arg("average", 0):
        value = value / max(np.size(x), 1)
    return (ctx.xp.full(np.shape(x), value, dtype=ctx.xp.asarray(dy).dtype),)


@register_gradient("SumElements")
def _sum_elements_gradient(g: GradientBuilder) -> None:
    g.add("SumElementsGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("SumElementsInt", inputs=1, outputs=1, shape=_scalar_infer(DataType.INT32))
def sum_elements_int(ctx: OpContext) -> Outputs:
    """Y = sum(X) for int32 X, a 0-d int32 tensor."""
    return (as_dtype(ctx.xp, ctx.xp.sum(ctx.inputs[0]), np.int32),)


@register_op("SumSqrElements", inputs=1, outputs=1, shape=_scalar_infer())
def sum_sqr_elements(ctx: OpContext) -> Outputs:
    """Y = sum(X**2) (or the mean with ``average=1``), a 0-d tensor."""
    x = ctx.xp.asarray(ctx.inputs[0])
    total = ctx.xp.sum(x * x)
    if ctx.int_arg("average", 0):
        total = total / max(x.size, 1)
    return (as_dtype(ctx.xp, total, x.dtype),)


_REDUCERS: dict[str, Callable[..., Any]] = {
    "Sum": lambda xp, x, axes, keep: xp.sum(x, axis=axes, keepdims=keep),
    "Mean": lambda xp, x, axes, keep: xp.mean(x, axis=axes, keepdims=keep),
    "Max": lambda xp, x, axes, keep: xp.max(x, axis=axes, keepdims=keep),
    "Min": lambda xp, x, axes, keep: xp.min(x, axis=axes, keepdims=keep),
    "L2": lambda xp, x, axes, keep: xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keep)),
    "L1": lambda xp, x, axes, keep: xp.sum(xp.abs(x), axis=axes, keepdims=keep),
}


class _FrontBack:
    """The 2-D view of a Reduce(Front|Back)* op: ``rows x cols``, reduced over rows (front)
    or columns (back), and which entries the optional LENGTHS input keeps (front: the first
    ``lengths[c]`` rows of column c; back: the first ``lengths[r]`` columns of row r)."""

    def __init__(self, ctx: OpContext, shape: Sequence[int], front: bool,
                 lengths: Any = None) -> None:
        count = ctx.int_arg("num_reduce_dim", 1)
        if not 0 <= count <= len(shape):
            raise ctx.fail(f"num_reduce_dim {count} must be in [0, {len(shape)}]")
        split = count if front else len(shape) - count
        self.shape = tuple(int(d) for d in shape)
        self.kept = self.shape[split:] if front else self.shape[:split]
        self.rows = int(np.prod(self.shape[:split], dtype=np.int64))
        self.cols = int(np.prod(self.shape[split:], dtype=np.int64))
        self.axis = 0 if front else 1
        self.mask: Any = None
        self.count: Any = self.rows if front else self.cols
        if lengths is not None:
            self._use_lengths(ctx, lengths, front)

    def _use_lengths(self, ctx: OpContext, lengths: Any, front: bool) -> None:
        lens = np.asarray(to_host(lengths)).reshape(-1).astype(np.int64)
        expected, limit = (self.cols, self.rows) if front else (self.rows, self.cols)
        if lens.size != expected:
            raise ctx.fail(f"lengths has {lens.size} entries; expected one per kept entry "
                           f"({expected})")
        if lens.size and (int(lens.min()) < 0 or int(lens.max()) > limit):
            raise ctx.fail(f"lengths must lie in [0, {limit}], got {lens.tolist()[:10]}")
        reduced = np.arange(limit)
        self.mask = reduced[:, None] < lens[None, :] if front else \
            reduced[None, :] < lens[:, None]
        self.count = lens

    def reduced(self, values: Any) -> Any:
        """``values`` (``rows x cols``) reduced to the kept shape's flat length."""
        return values.reshape(self.kept)

    def spread(self, per_kept: Any) -> Any:
        """A kept-shape array broadcast back over the reduced axis (``rows x cols``)."""
        flat = per_kept.reshape(-1)
        return flat[None, :] if self.axis == 0 else flat[:, None]


def _front_back_inputs(ctx: OpContext, front: bool) -> tuple[Any, _FrontBack]:
    x = ctx.xp.asarray(ctx.inputs[0])
    view = _FrontBack(ctx, x.shape, front, ctx.inputs[1] if len(ctx.inputs) > 1 else None)
    return x.reshape(view.rows, view.cols), view


def _reduce_2d(xp: Any, kind: str, x2: Any, view: _FrontBack) -> Any:
    if kind == "Max":
        low = np.finfo(x2.dtype).min if x2.dtype.kind == "f" else np.iinfo(x2.dtype).min
        values = x2 if view.mask is None else xp.where(view.mask, x2, low)
        return values.max(axis=view.axis) if x2.size else xp.full(
            view.rows if view.axis else view.cols, low, dtype=x2.dtype)
    total = (x2 if view.mask is None else x2 * view.mask).sum(axis=view.axis)
    if kind == "Mean":
        total = total / np.maximum(view.count, 1)
    return total


def _register_front_back(kind: str, front: bool) -> None:
    op_type = f"Reduce{'Front' if front else 'Back'}{kind}"

    def kernel(ctx: OpContext) -> Outputs:
        x2, view = _front_back_inputs(ctx, front)
        out = _reduce_2d(ctx.xp, kind, x2, view)
        return (as_dtype(ctx.xp, view.reduced(out), x2.dtype),)

    kernel.__doc__ = (f"{kind} over the {'first' if front else 'last'} num_reduce_dim dims "
                      f"(LENGTHS: only the first lengths[i] entries of each kept entry).")
    register_op(op_type, inputs=(1, 2), outputs=1)(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        dy = ctx.xp.asarray(ctx.inputs[0])
        shape = _shape_of(ctx.inputs[1]) if kind != "Max" else np.shape(ctx.inputs[1])
        lengths_index = 3 if kind == "Max" else 2
        lengths = ctx.inputs[lengths_index] if len(ctx.inputs) > lengths_index else None
        view = _FrontBack(ctx, shape, front, lengths)
        grad = view.spread(dy)
        if kind == "Mean":
            divisor = np.broadcast_to(np.maximum(view.count, 1), (dy.size,))
            grad = grad / view.spread(divisor)
        elif kind == "Max":
            x2 = ctx.xp.asarray(ctx.inputs[1]).reshape(view.rows, view.cols)
            grad = grad * (x2 == view.spread(ctx.xp.asarray(ctx.inputs[2])))
        grad = ctx.xp.broadcast_to(grad, (view.rows, view.cols))
        if view.mask is not None:
            grad = grad * view.mask
        return (as_dtype(ctx.xp, grad, dy.dtype).reshape(view.shape),)

    grad_kernel.__doc__ = (f"Gradient of {op_type}: [dY, X (or X's int64 shape)"
                           f"{', Y' if kind == 'Max' else ''}(, LENGTHS)].")
    register_op(op_type + "Gradient", inputs=(2, 4), outputs=1)(grad_kernel)

    def maker(g: GradientBuilder) -> None:
        inputs = [g.GO(0), g.I(0)] + ([g.O(0)] if kind == "Max" else [])
        if len(g.op.input) > 1:
            inputs.append(g.I(1))
        g.add(op_type + "Gradient", inputs, [g.GI(0)])

    register_gradient(op_type)(maker)


def _shape_of(x_or_shape: Any) -> tuple[int, ...]:
    """Input 1 of the Sum/Mean gradients: X, or X's shape as a 1-D int64 tensor."""
    if np.ndim(x_or_shape) == 1 and x_or_shape.dtype == np.int64:
        return tuple(int(d) for d in to_host(x_or_shape))
    return tuple(np.shape(x_or_shape))


for _kind in ("Sum", "Mean", "Max"):
    _register_front_back(_kind, True)
    _register_front_back(_kind, False)


def _reduce_axes(ctx: OpContext, ndim: int) -> tuple[int, ...]:
    axes = ctx.ints_arg("axes", list(range(ndim))) if ctx.has_arg("axes") else range(ndim)
    normalised = sorted({a + ndim if a < 0 else a for a in axes})
    if any(not 0 <= a < ndim for a in normalised):
        raise ctx.fail(f"axes {list(axes)} out of range for a rank-{ndim} input")
    return tuple(normalised)


def _register_reduce(kind: str) -> None:
    op_type = "Reduce" + kind
    fn = _REDUCERS[kind]

    def kernel(ctx: OpContext) -> Outputs:
        x = ctx.xp.asarray(ctx.inputs[0])
        axes = _reduce_axes(ctx, x.ndim)
        keep = bool(ctx.int_arg("keepdims", 1))
        return (as_dtype(ctx.xp, fn(ctx.xp, x, axes, keep), x.dtype),)

    kernel.__doc__ = f"{kind} over ``axes`` (default all), keeping them with ``keepdims=1``."
    register_op(op_type, inputs=1, outputs=1)(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        dy, x, y = (ctx.xp.asarray(v) for v in ctx.inputs)
        axes = _reduce_axes(ctx, x.ndim)
        keep_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        dy, y = ctx.xp.reshape(dy, keep_shape), ctx.xp.reshape(y, keep_shape)
        if kind == "Mean":
            grad = dy / max(int(np.prod([x.shape[a] for a in axes])), 1)
        elif kind in ("Max", "Min"):
            grad = dy * (x == y)
        elif kind == "L1":
            grad = dy * ctx.xp.sign(x)
        elif kind == "L2":
            safe = ctx.xp.where(y == 0, 1, y)
            grad = ctx.xp.where(y == 0, 0, dy * x / safe)
        else:
            grad = dy
        return (as_dtype(ctx.xp, ctx.xp.broadcast_to(grad, x.shape), dy.dtype),)

    grad_kernel.__doc__ = f"Gradient of {op_type}: [dY, X, Y] -> dX."
    register_op(op_type + "Gradient", inputs=3, outputs=1, shape=same_as_input(1))(grad_kernel)

    def maker(g: GradientBuilder) -> None:
        g.add(op_type + "Gradient", [g.GO(0), g.I(0), g.O(0)], [g.GI(0)])

    register_gradient(op_type)(maker)


for _kind in ("Sum", "Mean", "Max", "Min", "L1", "L2"):
    _register_reduce(_kind)


def _register_wise_max(op_type: str, axis: int) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        x = ctx.xp.asarray(ctx.inputs[0])
        if x.ndim != 3:
            raise ctx.fail(f"input must be 3-D (batch, M, N), got shape {x.shape}")
        return (ctx.xp.max(x, axis=axis),)

    kernel.__doc__ = f"{op_type}: max over dim {axis} of a (batch, M, N) tensor."
    register_op(op_type, inputs=1, outputs=1)(kernel)

    def grad_kernel(ctx: OpContext) -> Outputs:
        x, y, dy = (ctx.xp.asarray(v) for v in ctx.inputs)
        y, dy = ctx.xp.expand_dims(y, axis), ctx.xp.expand_dims(dy, axis)
        return (as_dtype(ctx.xp, dy * (x == y), dy.dtype),)

    grad_kernel.__doc__ = f"[X, Y, dY] -> dX for {op_type}."
    register_op(op_type + "Gradient", inputs=3, outputs=1, shape=same_as_input())(grad_kernel)

    def maker(g: GradientBuilder) -> None:
        g.add(op_type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])

    register_gradient(op_type)(maker)


_register_wise_max("RowwiseMax", 2)
_register_wise_max("ColwiseMax", 1)


def _register_arg_reduce(op_type: str, fn_name: str) -> None:
    def kernel(ctx: OpContext) -> Outputs:
        x = ctx.xp.asarray(ctx.inputs[0])
        axis = ctx.int_arg("axis", -1)
        axis = axis + x.ndim if axis < 0 else axis
        if not 0 <= axis < x.ndim:
            raise ctx.fail(f"axis {ctx.int_arg('axis', -1)} out of range for X {x.shape}")
        index = getattr(ctx.xp, fn_name)(x, axis=axis)
        if ctx.int_arg("keepdims", 1):
            index = ctx.xp.expand_dims(index, axis)
        return (as_dtype(ctx.xp, index, np.int64),)

    kernel.__doc__ = f"int64 index of the {fn_name[3:]} along ``axis`` (default -1, keepdims 1)."
    register_op(op_type, inputs=1, outputs=1)(kernel)


_register_arg_reduce("ArgMax", "argmax")
_register_arg_reduce("ArgMin", "argmin")
