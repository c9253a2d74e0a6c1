"""Dense layers: FC, MatMul, BatchMatMul, Conv, ConvTranspose, MaxPool, AveragePool.

Kernels follow Caffe2's CPU operators (argument names, flattening rules, output sizes) and
gradient makers emit Caffe2's exact gradient ops.  Convolutions are im2col + one batched
matmul (see :mod:`dpgraph.ops._conv_util`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.errors import GradientError, NotSupportedError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops import _conv_util as cu
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

_FLOAT = caffe2_pb2.TensorProto.FLOAT
Shape = tuple[int, ...]
ShapeResult = list[tuple[Shape, int] | None]


def _ctx_for(op: caffe2_pb2.OperatorDef) -> OpContext:
    """An argument-reading context for shape functions (no inputs bound)."""
    return OpContext(op, arguments_dict(op.arg), np, op.device_option)


def _canonical_axis(ctx: OpContext, axis: int, ndim: int) -> int:
    if not -ndim <= axis <= ndim:
        raise ctx.fail(f"axis {axis} is out of range for a {ndim}-D input")
    return axis + ndim if axis < 0 else axis


def _as_matrix(shape: Shape, axis: int) -> tuple[int, int]:
    return math.prod(shape[:axis]), math.prod(shape[axis:])


def _dtype(types: list[int | None], index: int = 0) -> int:
    value = types[index] if index < len(types) else None
    return _FLOAT if value is None else value


# --- FC -----------------------------------------------------------------------------------
def _fc_dims(ctx: OpContext, x_shape: Shape, w_shape: Shape,
             transposed: bool) -> tuple[int, int, int, int]:
    """(axis, M, K, N) of an FC op; W is [N, K] (or [K, N] when transposed)."""
    axis = _canonical_axis(ctx, ctx.int_arg("axis", 1), len(x_shape))
    axis_w = _canonical_axis(ctx, ctx.int_arg("axis_w", 1), len(w_shape))
    m, k = _as_matrix(x_shape, axis)
    n, kw = _as_matrix(w_shape, axis_w)
    if transposed:
        n, kw = kw, n
    if k != kw:
        raise ctx.fail(f"X {tuple(x_shape)} flattened at axis {axis} has {k} columns but W "
                       f"{tuple(w_shape)} expects {kw}; check 'axis'/'axis_w' or the shapes")
    return axis, m, k, n


def reusable_output(ctx: OpContext, index: int, shape: tuple[int, ...],
                    dtype: Any) -> np.ndarray | None:
    """The array output ``index`` held from the previous run when the kernel may write
    this run's ``shape``/``dtype`` value into it (the runtime's context decides, see
    ``RuntimeOpContext.reusable_output``), else None: write a new array.  Call it only
    after every check passed, holding no reference to that array.

    Worth it for large outputs that would otherwise be allocated afresh (bucket packing);
    FC and Relu do not use it: measured, writing into the previous (cache-cold) array was
    0.5-2% slower per MLP step than a new array from the allocator's recently freed memory.
    """
    reuse = getattr(ctx, "reusable_output", None)
    return None if reuse is None else reuse(index, shape, dtype)


_FC_PLAN = "\0fc_plan"


def _fc_plan(ctx: OpContext) -> tuple[bool, int]:
    """(whether ``axis`` and ``axis_w`` select the last dimension of 2-D X and W, number of
    outputs), decided once per op instance and kept in its decoded arguments."""
    plan = ctx.args.get(_FC_PLAN)
    if plan is None:
        last = ctx.int_arg("axis", 1) in (1, -1) and ctx.int_arg("axis_w", 1) in (1, -1)
        plan = ctx.args[_FC_PLAN] = (last, len(ctx.op.output))
    return plan


def _plain_matrices(x: Any, w: Any, other: Any, other_ndim: int) -> bool:
    """Numpy arrays of one dtype, X and W 2-D with matching columns, ``other`` (b or dY)
    ``other_ndim``-D with W's row count as its last dimension."""
    return type(x) is np.ndarray and type(w) is np.ndarray and type(other) is np.ndarray \
        and x.ndim == 2 and w.ndim == 2 and other.ndim == other_ndim and \
        x.dtype == w.dtype and w.dtype == other.dtype and x.shape[1] == w.shape[1] and \
        other.shape[-1] == w.shape[0]


def _fc_forward(ctx: OpContext, transposed: bool) -> Outputs:
    x, w, b = ctx.inputs
    if not transposed and _fc_plan(ctx)[0] and _plain_matrices(x, w, b, 1):
        # the common FC: no reshape, axis arithmetic or conversion, the same matmul
        y = np.matmul(x, w.T)
        y += b  # into the matmul's result: no second [M, N] temporary
        return (y,)
    axis, m, k, n = _fc_dims(ctx, x.shape, w.shape, transposed)
    if b.size != n:
        raise ctx.fail(f"bias {ctx.input_name(2)!r} has {b.size} values for {n} outputs")
    w2 = w.reshape(k, n) if transposed else w.reshape(n, k).T
    y = ctx.xp.matmul(x.reshape(m, k), w2)
    if y.dtype == b.dtype:
        y += b.reshape(n)  # into the matmul's result: no second [M, N] temporary
    else:
        y = y + b.reshape(n)
    return (_as(_shaped(y, (*x.shape[:axis], n)), x.dtype),)


def _as(value: Any, dtype: Any) -> Any:
    """``value`` in ``dtype``, converted only when it is not already."""
    return value if value.dtype == dtype else value.astype(dtype)


def _shaped(value: Any, shape: tuple[int, ...]) -> Any:
    """``value`` itself when it has ``shape`` (a reshape would make a view, which later
    in-place updates of the blob cannot write into), else reshaped."""
    return value if value.shape == tuple(shape) else value.reshape(shape)


def _fc_backward(ctx: OpContext, transposed: bool) -> Outputs:
    x, w, dy = ctx.inputs
    if not transposed:
        plain, num_outputs = _fc_plan(ctx)
        if plain and _plain_matrices(x, w, dy, 2) and dy.shape[0] == x.shape[0]:
            # the general path's matmuls and sum on the same (unreshaped) arrays
            grads = [np.matmul(dy.T, x), np.add.reduce(dy, axis=0)]  # dy.sum, no wrapper
            if num_outputs > 2:
                grads.append(np.matmul(dy, w))
            return grads
    axis, m, k, n = _fc_dims(ctx, x.shape, w.shape, transposed)
    x2, dy2 = x.reshape(m, k), dy.reshape(m, n)
    dw = ctx.xp.matmul(x2.T, dy2) if transposed else ctx.xp.matmul(dy2.T, x2)
    outs: list[Any] = [_as(_shaped(dw, w.shape), w.dtype), _as(dy2.sum(axis=0), dy.dtype)]
    if ctx.num_outputs > 2:
        w2 = w.reshape(k, n).T if transposed else w.reshape(n, k)
        outs.append(_as(_shaped(ctx.xp.matmul(dy2, w2), x.shape), x.dtype))
    return outs


def _fc_shape(transposed: bool) -> Any:
    def shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
              types: list[int | None]) -> ShapeResult:
        if shapes[0] is None or shapes[1] is None:
            return [None]
        axis, _, _, n = _fc_dims(_ctx_for(op), shapes[0], shapes[1], transposed)
        return [((*shapes[0][:axis], n), _dtype(types))]
    return shape


def _fc_grad_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                   types: list[int | None]) -> ShapeResult:
    x, w = shapes[0], shapes[1]
    if x is None or w is None:
        return [None] * len(op.output)
    transposed = op.type == "FCTransposedGradient"
    n = _fc_dims(_ctx_for(op), x, w, transposed)[3]
    result: ShapeResult = [(w, _dtype(types, 1)), ((n,), _dtype(types)), (x, _dtype(types))]
    return result[:len(op.output)]


@register_op("FC", inputs=3, outputs=1, shape=_fc_shape(False))
def fc(ctx: OpContext) -> Outputs:
    """Y = X·Wᵀ + b with X flattened to 2-D at ``axis`` and W at ``axis_w``."""
    return _fc_forward(ctx, transposed=False)


@register_op("PackedFC", inputs=3, outputs=1, shape=_fc_shape(False))
def packed_fc(ctx: OpContext) -> Outputs:
    """Caffe2's MKL-packed FC: the same math as FC (inference only, no gradient)."""
    return _fc_forward(ctx, transposed=False)


@register_op("FCTransposed", inputs=3, outputs=1, shape=_fc_shape(True))
def fc_transposed(ctx: OpContext) -> Outputs:
    """Y = X·W + b with W stored [in, out]."""
    return _fc_forward(ctx, transposed=True)


@register_op("FCGradient", inputs=3, outputs=(2, 3), shape=_fc_grad_shape)
def fc_gradient(ctx: OpContext) -> Outputs:
    """[X, W, dY] -> [dW, db, dX]."""
    return _fc_backward(ctx, transposed=False)


@register_op("FCTransposedGradient", inputs=3, outputs=(2, 3), shape=_fc_grad_shape)
def fc_transposed_gradient(ctx: OpContext) -> Outputs:
    """[X, W, dY] -> [dW, db, dX] for FCTransposed."""
    return _fc_backward(ctx, transposed=True)


def _fc_gradient_maker(grad_type: str) -> Any:
    def maker(g: GradientBuilder) -> None:
        g.add(grad_type, [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(2), g.GI(0)])
    return maker


register_gradient("FC")(_fc_gradient_maker("FCGradient"))
register_gradient("FCTransposed")(_fc_gradient_maker("FCTransposedGradient"))


# --- MatMul and BatchMatMul ------------------------------------------------------------------
def _matmul_operands(ctx: OpContext, a: Any, b: Any) -> tuple[Any, Any]:
    axis_a = _canonical_axis(ctx, ctx.int_arg("axis_a", 1), a.ndim)
    axis_b = _canonical_axis(ctx, ctx.int_arg("axis_b", 1), b.ndim)
    a2 = a.reshape(_as_matrix(a.shape, axis_a))
    b2 = b.reshape(_as_matrix(b.shape, axis_b))
    if ctx.int_arg("trans_a", 0):
        a2 = a2.T
    if ctx.int_arg("trans_b", 0):
        b2 = b2.T
    if a2.shape[1] != b2.shape[0]:
        raise ctx.fail(f"inner dimensions differ: A as {a2.shape} times B as {b2.shape}; "
                       "check trans_a/trans_b and axis_a/axis_b")
    return a2, b2


@register_op("MatMul", inputs=(2, 3), outputs=1)
def matmul(ctx: OpContext) -> Outputs:
    """2-D product of A and B flattened at axis_a/axis_b (optionally transposed).

    A third input, when given, only supplies the output shape (used by the gradient).
    """
    a, b = ctx.inputs[:2]
    a2, b2 = _matmul_operands(ctx, a, b)
    y = ctx.xp.matmul(a2, b2)
    if ctx.num_inputs == 3:
        y = y.reshape(ctx.inputs[2].shape)
    return (y,)


@register_gradient("MatMul", copy_arguments=False)
def matmul_gradient(g: GradientBuilder) -> None:
    trans_a, trans_b = int(g.arg("trans_a", 0)), int(g.arg("trans_b", 0))
    axis_a, axis_b = int(g.arg("axis_a", 1)), int(g.arg("axis_b", 1))
    a, b, dy, da, db = g.I(0), g.I(1), g.GO(0), g.GI(0), g.GI(1)
    if trans_a and trans_b:  # Y = A'B': dA = B'G', dB = G'A'
        g.add("MatMul", [b, dy, a], [da], trans_a=1, trans_b=1, axis_a=axis_b)
        g.add("MatMul", [dy, a, b], [db], trans_a=1, trans_b=1, axis_b=axis_a)
    elif trans_a:  # Y = A'B: dA = BG', dB = AG
        g.add("MatMul", [b, dy, a], [da], trans_b=1, axis_a=axis_b)
        g.add("MatMul", [a, dy, b], [db], axis_a=axis_a)
    elif trans_b:  # Y = AB': dA = GB, dB = G'A
        g.add("MatMul", [dy, b, a], [da], axis_b=axis_b)
        g.add("MatMul", [dy, a, b], [db], trans_a=1, axis_b=axis_a)
    else:  # Y = AB: dA = GB', dB = A'G
        g.add("MatMul", [dy, b, a], [da], trans_b=1, axis_b=axis_b)
        g.add("MatMul", [a, dy, b], [db], trans_a=1, axis_a=axis_a)


@register_op("BatchMatMul", inputs=2, outputs=1)
def batch_matmul(ctx: OpContext) -> Outputs:
    """Batched A·B over the last two dims; ``broadcast=1`` allows numpy broadcasting."""
    a, b = ctx.inputs
    broadcast = ctx.int_arg("broadcast", 0)
    if ctx.int_arg("trans_a", 0) and a.ndim >= 2:
        a = a.swapaxes(-1, -2)
    if ctx.int_arg("trans_b", 0) and b.ndim >= 2:
        b = b.swapaxes(-1, -2)
    if not broadcast and (a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]):
        raise ctx.fail(f"A {a.shape} and B {b.shape} need equal batch dims (or broadcast=1)")
    try:
        return (ctx.xp.matmul(a, b),)
    except ValueError as error:
        raise ctx.fail(f"cannot multiply A {a.shape} by B {b.shape}: {error}") from error


@register_gradient("BatchMatMul", copy_arguments=False)
def batch_matmul_gradient(g: GradientBuilder) -> None:
    if int(g.arg("broadcast", 0)):
        raise GradientError(f"BatchMatMul {list(g.op.input)}: the gradient is not supported "
                            "with broadcast=1 (as in Caffe2); reshape inputs to equal batch dims")
    trans_a, trans_b = int(g.arg("trans_a", 0)), int(g.arg("trans_b", 0))
    a, b, dy, da, db = g.I(0), g.I(1), g.GO(0), g.GI(0), g.GI(1)
    if trans_a and trans_b:
        g.add("BatchMatMul", [b, dy], [da], trans_a=1, trans_b=1)
        g.add("BatchMatMul", [dy, a], [db], trans_a=1, trans_b=1)
    elif trans_a:
        g.add("BatchMatMul", [b, dy], [da], trans_b=1)
        g.add("BatchMatMul", [a, dy], [db])
    elif trans_b:
        g.add("BatchMatMul", [dy, b], [da])
        g.add("BatchMatMul", [dy, a], [db], trans_a=1)
    else:
        g.add("BatchMatMul", [dy, b], [da], trans_b=1)
        g.add("BatchMatMul", [a, dy], [db], trans_a=1)


# --- Conv and ConvTranspose ------------------------------------------------------------------
def _filter_cf(w: Any, order: str) -> Any:
    """Filter in channel-first layout (NHWC filters are [M, *k, C])."""
    return cu.channel_first(w, order)


def _dense_channel_first(ctx: OpContext, x: Any, order: str) -> Any:
    return x if order == "NCHW" else ctx.xp.ascontiguousarray(cu.channel_first(x, order))


def _conv_setup(ctx: OpContext, x: Any, w: Any) -> tuple[str, Any, Any, cu.Geometry]:
    order = cu.check_order(ctx)
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ctx.fail(f"X {x.shape} and filter {w.shape} must have the same rank >= 3")
    # NHWC data is made channel-first contiguous once: im2col from a strided view is slow
    xc, wc = _dense_channel_first(ctx, x, order), _filter_cf(w, order)
    geom = cu.parse_geometry(ctx, xc.shape[2:], kernel_shape=wc.shape[2:])
    if wc.shape[2:] != geom.kernel:
        raise ctx.fail(f"filter {w.shape} does not match kernel {geom.kernel}")
    if any(o < 1 for o in geom.out_shape(xc.shape[2:])):  # even for an empty batch
        raise ctx.fail(f"kernel {geom.kernel} (dilation {geom.dilation}) is larger than the "
                       f"padded input {x.shape}; use a smaller kernel or more padding")
    return order, xc, wc, geom


def _check_conv_channels(ctx: OpContext, xc: Any, wc: Any, geom: cu.Geometry) -> None:
    c, m, g = xc.shape[1], wc.shape[0], geom.group
    if c != wc.shape[1] * g or m % g:
        raise ctx.fail(f"{c} input channels and filter {tuple(wc.shape)} (channel-first) do "
                       f"not fit group={g}: need C == filter C x group and M divisible by group")


def _add_bias(y: Any, b: Any, ctx: OpContext) -> Any:
    """Add a per-channel bias in place (``y`` is always a fresh kernel result)."""
    if b.size != y.shape[1]:
        raise ctx.fail(f"bias {ctx.input_name(2)!r} has shape {tuple(b.shape)} but there are "
                       f"{y.shape[1]} output channels; give one bias value per filter")
    y += b.reshape(-1, *(1,) * (y.ndim - 2)).astype(y.dtype, copy=False)
    return y


def _conv_shape_geometry(op: caffe2_pb2.OperatorDef, x: Shape, w: Shape
                         ) -> tuple[OpContext, str, Shape, cu.Geometry]:
    """(context, order, spatial input dims, geometry) for the shape function of a
    convolution-like op with input shape ``x`` and filter shape ``w``."""
    ctx = _ctx_for(op)
    order = cu.check_order(ctx)
    spatial = tuple(x[2:] if order == "NCHW" else x[1:-1])
    kernel = tuple(w[2:] if order == "NCHW" else w[1:-1])
    return ctx, order, spatial, cu.parse_geometry(ctx, spatial, kernel_shape=kernel)


def _conv_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                types: list[int | None]) -> ShapeResult:
    x, w = shapes[0], shapes[1]
    if x is None or w is None:
        return [None]
    _, order, spatial, geom = _conv_shape_geometry(op, x, w)
    out = geom.out_shape(spatial)
    m = w[0]
    shape = (x[0], m, *out) if order == "NCHW" else (x[0], *out, m)
    return [(shape, _dtype(types))]


def _bias_channels(op: caffe2_pb2.OperatorDef, args: dict[str, Any], w: Shape) -> int:
    if op.type != "ConvTransposeGradient":
        return int(w[0])
    channels = w[-1] if str(args.get("order", "NCHW")) == "NHWC" else w[1]
    return int(channels) * int(args.get("group", 1))


def _same_as_inputs(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                    types: list[int | None]) -> ShapeResult:
    """Gradient ops whose outputs mirror [W, (b), X] shapes; db has the output channels
    (W's first dim; ConvTranspose: its channel dim times ``group``), as Caffe2 infers."""
    x, w = shapes[0], shapes[1]
    result: ShapeResult = [None if w is None else (w, _dtype(types, 1))]
    args = arguments_dict(op.arg)
    if not int(args.get("no_bias", 0)) and len(op.output) > 1:
        result.append(None if w is None else ((_bias_channels(op, args, w),), _dtype(types, 1)))
    if len(op.output) > len(result):
        result.append(None if x is None else (x, _dtype(types)))
    return result


@register_op("Conv", inputs=(2, 3), outputs=1, shape=_conv_shape)
def conv(ctx: OpContext) -> Outputs:
    """N-d convolution (order NCHW or NHWC) with optional bias, stride/pad/dilation/group."""
    order, xc, wc, geom = _conv_setup(ctx, ctx.inputs[0], ctx.inputs[1])
    _check_conv_channels(ctx, xc, wc, geom)
    y = cu.conv_forward(ctx.xp, xc, wc, geom)
    if ctx.num_inputs == 3:
        y = _add_bias(y, ctx.inputs[2], ctx)
    return (cu.channel_last(y.astype(xc.dtype, copy=False), order, ctx.xp),)


def _conv_family_gradient(ctx: OpContext, setup: Callable[..., tuple[str, Any, Any, Any]],
                          backward: Callable[..., tuple[Any, Any]]) -> Outputs:
    """[X, W, dY] -> [dW, db, dX] for Conv and ConvTranspose, given their setup and backward
    functions; db is left out with no_bias=1 and dX when the op does not ask for it."""
    x, w, dy = ctx.inputs
    order, xc, wc, geom = setup(ctx, x, w)
    no_bias = bool(ctx.int_arg("no_bias", 0))
    need_dx = ctx.num_outputs == (2 if no_bias else 3)
    dyc = _dense_channel_first(ctx, dy, order)
    dw, dx = backward(ctx.xp, xc, wc, dyc, geom, need_dx)
    outs: list[Any] = [cu.channel_last(dw, order, ctx.xp).astype(w.dtype, copy=False)]
    if not no_bias:
        outs.append(dyc.sum(axis=(0, *range(2, dyc.ndim))).astype(dy.dtype, copy=False))
    if need_dx:
        outs.append(cu.channel_last(dx, order, ctx.xp).astype(x.dtype, copy=False))
    return outs


@register_op("ConvGradient", inputs=3, outputs=(1, 3), shape=_same_as_inputs)
def conv_gradient(ctx: OpContext) -> Outputs:
    """[X, W, dY] -> [dW, db, dX] ([dW, dX] with no_bias=1; dX only when asked)."""
    return _conv_family_gradient(ctx, _conv_setup, cu.conv_backward)


def _adj(ctx: OpContext, nd: int) -> tuple[int, ...]:
    if ctx.has_arg("adjs"):
        return tuple(ctx.ints_arg("adjs"))
    if ctx.has_arg("adj"):
        return (ctx.int_arg("adj"),) * nd
    if nd == 2:
        return (ctx.int_arg("adj_h", 0), ctx.int_arg("adj_w", 0))
    return (0,) * nd


def _conv_transpose_setup(ctx: OpContext, x: Any, w: Any) -> tuple[str, Any, Any, cu.Geometry]:
    order, xc, wc, geom = _conv_setup(ctx, x, w)
    if wc.shape[0] != xc.shape[1] or xc.shape[1] % geom.group:
        raise ctx.fail(f"filter {tuple(w.shape)} must start with the {xc.shape[1]} input "
                       f"channels, divisible by group={geom.group}")
    return order, xc, wc, geom


def _conv_transpose_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                          types: list[int | None]) -> ShapeResult:
    x, w = shapes[0], shapes[1]
    if x is None or w is None:
        return [None]
    ctx, order, spatial, geom = _conv_shape_geometry(op, x, w)
    out = tuple((s - 1) * st + e + a - h - t for s, st, e, a, h, t in zip(
        spatial, geom.stride, geom.extent, _adj(ctx, geom.nd), geom.pad_head, geom.pad_tail))
    m = (w[1] if order == "NCHW" else w[-1]) * geom.group
    shape = (x[0], m, *out) if order == "NCHW" else (x[0], *out, m)
    return [(shape, _dtype(types))]


@register_op("ConvTranspose", inputs=(2, 3), outputs=1, shape=_conv_transpose_shape)
def conv_transpose(ctx: OpContext) -> Outputs:
    """Transposed convolution; filter [C, M/group, *k] (NCHW) or [C, *k, M/group] (NHWC)."""
    order, xc, wc, geom = _conv_transpose_setup(ctx, ctx.inputs[0], ctx.inputs[1])
    adj = _adj(ctx, geom.nd)
    if any(a >= s for a, s in zip(adj, geom.stride)):
        raise ctx.fail(f"adj {adj} must be smaller than stride {geom.stride}")
    y = cu.conv_transpose_forward(ctx.xp, xc, wc, geom, adj)
    if ctx.num_inputs == 3:
        y = _add_bias(y, ctx.inputs[2], ctx)
    return (cu.channel_last(y.astype(xc.dtype, copy=False), order, ctx.xp),)


@register_op("ConvTransposeGradient", inputs=3, outputs=(1, 3), shape=_same_as_inputs)
def conv_transpose_gradient(ctx: OpContext) -> Outputs:
    """[X, W, dY] -> [dW, db, dX] ([dW, dX] with no_bias=1)."""
    return _conv_family_gradient(ctx, _conv_transpose_setup, cu.conv_transpose_backward)


def _conv_gradient_maker(grad_type: str) -> Any:
    def maker(g: GradientBuilder) -> None:
        compute_dx = not int(g.arg("no_gradient_to_input", 0))
        outputs = [g.GI(1)]
        extra: dict[str, Any] = {}
        if len(g.op.input) == 3:
            outputs.append(g.GI(2))
        else:
            extra["no_bias"] = 1
        if compute_dx:
            outputs.append(g.GI(0))
        g.add(grad_type, [g.I(0), g.I(1), g.GO(0)], outputs, **extra)
    return maker


register_gradient("Conv")(_conv_gradient_maker("ConvGradient"))
register_gradient("ConvTranspose")(_conv_gradient_maker("ConvTransposeGradient"))

for _nd in (1, 2, 3):  # Caffe2's fixed-rank aliases share the kernels
    register_op(f"Conv{_nd}D", inputs=(2, 3), outputs=1, shape=_conv_shape)(conv)
    register_op(f"Conv{_nd}DGradient", inputs=3, outputs=(1, 3),
                shape=_same_as_inputs)(conv_gradient)
    register_gradient(f"Conv{_nd}D")(_conv_gradient_maker(f"Conv{_nd}DGradient"))


# --- Pooling ------------------------------------------------------------------------------
def _pool_setup(ctx: OpContext, x: Any) -> tuple[str, Any, cu.Geometry]:
    order = cu.check_order(ctx)
    if x.ndim < 3:
        raise ctx.fail(f"pooling needs an input with spatial dims, got shape {x.shape}")
    xc = cu.channel_first(x, order)
    geom = cu.parse_geometry(ctx, xc.shape[2:], pooling=True)
    if any(o < 1 for o in geom.out_shape(xc.shape[2:])) and xc.size:
        raise ctx.fail(f"kernel {geom.kernel} is larger than the padded input {x.shape}")
    return order, xc, geom


def _avg_divisor(ctx: OpContext, geom: cu.Geometry, spatial: Shape, out: Shape) -> Any:
    """Per-output window sizes (padding excluded unless count_include_pad)."""
    xp = ctx.xp
    if ctx.int_arg("count_include_pad", 0):
        return float(math.prod(geom.kernel))
    ones = cu.pad_spatial(xp, xp.ones((1, 1, *spatial), dtype=np.float32), geom)
    count = xp.zeros((1, 1, *out), dtype=np.float32)
    for _, block in cu.offset_slices(geom, out):
        count += ones[block]
    return xp.maximum(count, 1.0)


def _pool_forward(ctx: OpContext, kind: str) -> Outputs:
    order, xc, geom = _pool_setup(ctx, ctx.inputs[0])
    xp = ctx.xp
    out = geom.out_shape(xc.shape[2:])
    fill = -np.inf if kind == "max" else 0.0
    xpad = cu.pad_spatial(xp, xc, geom, fill)
    blocks = cu.offset_slices(geom, out)
    y = xp.array(xpad[blocks[0][1]], copy=True)
    for _, block in blocks[1:]:
        if kind == "max":
            xp.maximum(y, xpad[block], out=y)
        else:
            y += xpad[block]
    if kind == "avg":
        y = y / _avg_divisor(ctx, geom, xc.shape[2:], out)
    return (cu.channel_last(y.astype(xc.dtype, copy=False), order, xp),)


def _pool_backward(ctx: OpContext, kind: str) -> Outputs:
    x, y, dy = ctx.inputs
    order, xc, geom = _pool_setup(ctx, x)
    xp = ctx.xp
    yc, dyc = cu.channel_first(y, order), cu.channel_first(dy, order)
    out = yc.shape[2:]
    padded = geom.padded(xc.shape[2:])
    dxpad = xp.zeros((*xc.shape[:2], *padded), dtype=dy.dtype)
    if kind == "max":
        xpad = cu.pad_spatial(xp, xc, geom, -np.inf)
        for _, block in cu.offset_slices(geom, out):
            dxpad[block] += (xpad[block] == yc) * dyc  # every tied maximum gets dY (Caffe2)
    else:
        share = dyc / _avg_divisor(ctx, geom, xc.shape[2:], out)
        for _, block in cu.offset_slices(geom, out):
            dxpad[block] += share
    dx = dxpad[cu.inner_slices(geom, xc.shape[2:])]
    return (cu.channel_last(dx.astype(x.dtype, copy=False), order, xp),)


def _pool_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                types: list[int | None]) -> ShapeResult:
    x = shapes[0]
    if x is None:
        return [None]
    ctx = _ctx_for(op)
    order = cu.check_order(ctx)
    spatial = tuple(x[2:] if order == "NCHW" else x[1:-1])
    out = cu.parse_geometry(ctx, spatial, pooling=True).out_shape(spatial)
    shape = (x[0], x[1], *out) if order == "NCHW" else (x[0], *out, x[-1])
    return [(shape, _dtype(types))]


def _pool_grad_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                     types: list[int | None]) -> ShapeResult:
    return [None if shapes[0] is None else (shapes[0], _dtype(types))]


def _pool_gradient_maker(grad_type: str) -> Any:
    def maker(g: GradientBuilder) -> None:
        g.add(grad_type, [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])
    return maker


def _register_pool(op_type: str, kind: str) -> None:
    def forward(ctx: OpContext) -> Outputs:
        return _pool_forward(ctx, kind)

    def backward(ctx: OpContext) -> Outputs:
        return _pool_backward(ctx, kind)

    forward.__doc__ = f"{kind} pooling (kernel, stride, pads, global_pooling, order)."
    backward.__doc__ = f"[X, Y, dY] -> dX for {op_type}."
    register_op(op_type, inputs=1, outputs=1, shape=_pool_shape)(forward)
    register_op(op_type + "Gradient", inputs=3, outputs=1, shape=_pool_grad_shape)(backward)
    register_gradient(op_type)(_pool_gradient_maker(op_type + "Gradient"))


for _base, _kind in (("MaxPool", "max"), ("AveragePool", "avg")):
    for _suffix in ("", "1D", "2D", "3D"):
        _register_pool(_base + _suffix, _kind)


# --- MaxPoolWithIndex (Caffe2's CUDA-only op; the same math on any device here) -----------
def _max_pool_with_index_setup(ctx: OpContext, x: Any) -> cu.Geometry:
    if cu.check_order(ctx) != "NCHW":
        raise NotSupportedError(ctx.describe(
            "MaxPoolWithIndex supports order NCHW only (as Caffe2's kernel); transpose the "
            "input or use MaxPool"))
    if x.ndim != 4:
        raise ctx.fail(f"MaxPoolWithIndex only supports 4-D inputs, got shape {x.shape}")
    geom = cu.parse_geometry(ctx, x.shape[2:], pooling=True)
    if any(d != 1 for d in geom.dilation):
        raise NotSupportedError(ctx.describe("MaxPoolWithIndex does not support dilation"))
    return geom


def _max_pool_with_index_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                               types: list[int | None]) -> ShapeResult:
    pooled = _pool_shape(op, shapes, types)[0]
    if pooled is None:
        return [None, None]
    return [pooled, ((math.prod(pooled[0]),), caffe2_pb2.TensorProto.INT32)]


@register_op("MaxPoolWithIndex", inputs=1, outputs=2, shape=_max_pool_with_index_shape)
def max_pool_with_index(ctx: OpContext) -> Outputs:
    """X (NCHW) -> [Y, index]: max pooling plus, per output (flattened, int32), the position
    ``h * W + w`` of the first maximum of its window in row-major order (-1 if none)."""
    (x,) = ctx.inputs
    xp = ctx.xp
    geom = _max_pool_with_index_setup(ctx, x)
    width, out = x.shape[3], geom.out_shape(x.shape[2:])
    if any(o < 1 for o in out) and x.size:
        raise ctx.fail(f"kernel {geom.kernel} is larger than the padded input {x.shape}")
    xpad = cu.pad_spatial(xp, x, geom, -np.inf)
    y = xp.full((*x.shape[:2], *out), -np.finfo(x.dtype).max, dtype=x.dtype)
    index = xp.full(y.shape, -1, dtype=np.int32)
    rows = xp.arange(out[0]).reshape(-1, 1) * geom.stride[0] - geom.pad_head[0]
    cols = xp.arange(out[1]).reshape(1, -1) * geom.stride[1] - geom.pad_head[1]
    for (kh, kw), block in cu.offset_slices(geom, out):
        values = xpad[block]
        better = values > y
        y = xp.where(better, values, y)
        position = ((rows + kh) * width + (cols + kw)).astype(np.int32)
        index = xp.where(better, position, index)
    return y, index.reshape(-1)


@register_op("MaxPoolWithIndexGradient", inputs=3, outputs=1, shape=_pool_grad_shape)
def max_pool_with_index_gradient(ctx: OpContext) -> Outputs:
    """[X, dY, index] -> dX: each dY value added at its window's recorded argmax."""
    x, dy, index = ctx.inputs
    xp = ctx.xp
    _max_pool_with_index_setup(ctx, x)
    if index.size != dy.size:
        raise ctx.fail(f"index has {index.size} entries for {dy.size} output gradients")
    planes, plane = x.shape[0] * x.shape[1], x.shape[2] * x.shape[3]
    if not planes or not dy.size:
        return (xp.zeros_like(x),)
    idx = index.reshape(planes, -1).astype(np.int64)
    if idx.size and int(idx.max()) >= plane:
        raise ctx.fail(f"index values must be < H*W = {plane}")
    target = idx + (xp.arange(planes) * plane).reshape(-1, 1)
    valid = (idx >= 0).reshape(-1)
    dx = xp.bincount(target.reshape(-1)[valid], weights=dy.reshape(-1)[valid],
                     minlength=planes * plane)
    return (dx.reshape(x.shape).astype(x.dtype, copy=False),)


@register_gradient("MaxPoolWithIndex")
def _max_pool_with_index_grad(g: GradientBuilder) -> None:
    g.add("MaxPoolWithIndexGradient", [g.I(0), g.GO(0), g.O(1)], [g.GI(0)])


# --- FC variants from Caffe2's experiments: FC_Decomp, FC_Prune, FC_Sparse ------------------
def _rows_of(x: Any) -> tuple[int, int]:
    """(M, K) of an experimental FC input: M = dim 0 (1 for a vector), K = the rest."""
    m = x.shape[0] if x.ndim > 1 else 1
    return m, (x.size // m if m else math.prod(x.shape[1:]))


def _fc_out_shape(x: Any, n: int) -> tuple[int, ...]:
    return (x.shape[0], n) if x.ndim > 1 else (n,)


def _fc_decomp_shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
                     types: list[int | None]) -> ShapeResult:
    x, u = shapes[0], shapes[1]
    if x is None or u is None:
        return [None]
    return [(((x[0], u[0]) if len(x) > 1 else (u[0],)), _dtype(types))]


@register_op("FC_Decomp", inputs=4, outputs=1, shape=_fc_decomp_shape)
def fc_decomp(ctx: OpContext) -> Outputs:
    """[X, U, V, b] -> Y = X·V·Uᵀ + b, the FC with W ≈ U·Vᵀ (U [N, r], V [K, r])."""
    x, u, v, b = ctx.inputs
    m, k = _rows_of(x)
    n = u.shape[0]
    if u.ndim != 2 or v.ndim != 2 or v.shape != (k, u.shape[1]) or b.size != n:
        raise ctx.fail(f"X {x.shape} (K={k}), U {u.shape}, V {v.shape}, b {b.shape} do not fit "
                       "U [N, rank], V [K, rank], b [N]")
    y = ctx.xp.matmul(ctx.xp.matmul(x.reshape(m, k), v), u.T) + b.reshape(n)
    return (y.reshape(_fc_out_shape(x, n)).astype(x.dtype, copy=False),)


@register_op("FCGradient_Decomp", inputs=4, outputs=(3, 4))
def fc_decomp_gradient(ctx: OpContext) -> Outputs:
    """[X, U, V, dY] -> [dU, dV, db, (dX)] for FC_Decomp."""
    x, u, v, dy = ctx.inputs
    xp = ctx.xp
    m, k = _rows_of(x)
    n = u.shape[0]
    x2, dy2 = x.reshape(m, k), dy.reshape(m, n)
    xv, dyu = xp.matmul(x2, v), xp.matmul(dy2, u)
    outs: list[Any] = [xp.matmul(dy2.T, xv).astype(u.dtype, copy=False),
                       xp.matmul(x2.T, dyu).astype(v.dtype, copy=False),
                       dy2.sum(axis=0).astype(dy.dtype, copy=False)]
    if ctx.num_outputs == 4:
        outs.append(xp.matmul(dyu, v.T).reshape(x.shape).astype(x.dtype, copy=False))
    return outs


@register_gradient("FC_Decomp")
def _fc_decomp_grad(g: GradientBuilder) -> None:
    g.add("FCGradient_Decomp", [g.I(0), g.I(1), g.I(2), g.GO(0)],
          [g.GI(1), g.GI(2), g.GI(3), g.GI(0)])


@register_op("FC_Prune", inputs=8, outputs=(1, 2))
def fc_prune(ctx: OpContext) -> Outputs:
    """[X, W, mask, b, ag_dw, mask_seq, thres, comp_lb] -> [Y = X·Wᵀ + b, (compress rate)].

    As in Caffe2 the forward pass ignores the mask (pruning happens in the training-time
    gradient op, which dpgraph does not implement); the optional second output is
    ``mean(mask)`` as a 0-d array.
    """
    x, w, mask, b = ctx.inputs[:4]
    m, k = _rows_of(x)
    n = w.shape[0]
    if w.ndim < 2 or w.size != n * k or b.size != n:
        raise ctx.fail(f"X {x.shape} (K={k}), W {w.shape}, b {b.shape} do not fit W [N, K]")
    y = ctx.xp.matmul(x.reshape(m, k), w.reshape(n, k).T) + b.reshape(n)
    outs: list[Any] = [y.reshape(_fc_out_shape(x, n)).astype(x.dtype, copy=False)]
    if ctx.num_outputs == 2:
        outs.append(ctx.xp.asarray(mask.sum() / max(mask.size, 1), dtype=mask.dtype))
    return outs


@register_op("FC_Sparse", inputs=5, outputs=1)
def fc_sparse(ctx: OpContext) -> Outputs:
    """[Xt, W_csr, iw, jw, b] -> Yt = W·Xt + b: W [N, K] in zero-based CSR (values W_csr, row
    pointers iw of N+1 entries, column indices jw), Xt [K, M] (transposed X), Yt [N, M]."""
    xt, values, iw, jw, b = ctx.inputs
    xp = ctx.xp
    if xt.ndim != 2 or b.ndim != 1:
        raise ctx.fail(f"Xt must be 2-D [K, M] and b 1-D, got {xt.shape} and {b.shape}")
    n, k = iw.size - 1, xt.shape[0]
    pointers = iw.reshape(-1).astype(np.int64)
    cols = jw.reshape(-1).astype(np.int64)
    if n != b.shape[0] or int(pointers[-1]) != values.size or cols.size != values.size:
        raise ctx.fail(f"CSR weights (iw {iw.shape}, jw {jw.shape}, values {values.shape}) "
                       f"do not describe {b.shape[0]} rows")
    if cols.size and (int(cols.min()) < 0 or int(cols.max()) >= k):
        raise ctx.fail(f"column indices jw must lie in [0, {k})")
    rows = xp.repeat(xp.arange(n), xp.diff(pointers))
    dense = xp.zeros((n, k), dtype=xt.dtype)
    xp.add.at(dense, (rows, cols), values.reshape(-1).astype(xt.dtype, copy=False))
    return ((xp.matmul(dense, xt) + b.reshape(n, 1)).astype(xt.dtype, copy=False),)
