"""Normalisation ops: SpatialBN, ChannelStats, ChannelBackpropStats, AffineChannel,
GroupNorm, LayerNorm, InstanceNorm, ElementwiseLinear, Moments, BatchMoments.

Per-channel ops take ``order`` (NCHW or NHWC) over inputs N x C x D1..Dk (or N x D1..Dk x C).
Statistics are biased (divide by the count), as in Caffe2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._conv_util import channel_first, check_order
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

Shape = tuple[int, ...]
ShapeResult = list[tuple[Shape, int] | None]


# --- per-channel helpers --------------------------------------------------------------------
def _channels(ctx: OpContext, x: Any) -> tuple[str, int, tuple[int, ...], tuple[int, ...]]:
    """(order, C, reduce axes, broadcast shape of a per-channel vector)."""
    order = check_order(ctx)
    if x.ndim < 2:
        raise ctx.fail(f"input {ctx.input_name(0)!r} needs at least 2 dims (N, C), got {x.shape}")
    if order == "NCHW":
        c = x.shape[1]
        return order, c, (0, *range(2, x.ndim)), (1, c, *(1,) * (x.ndim - 2))
    c = x.shape[-1]
    return order, c, tuple(range(x.ndim - 1)), (c,)


def _check_vec(ctx: OpContext, index: int, c: int) -> Any:
    v = ctx.inputs[index]
    if v.size != c:
        raise ctx.fail(f"input {ctx.input_name(index)!r} has {v.size} values, expected one per "
                       f"channel ({c}); check 'order'")
    return v.reshape(c)


def _same_shape(*indices: int) -> Any:
    """Shape function: output k mirrors input indices[k]."""
    def shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
              types: list[int | None]) -> ShapeResult:
        result: ShapeResult = []
        for i in indices[:len(op.output)]:
            shape_i = shapes[i]
            result.append(None if shape_i is None else (shape_i, types[i] or 1))
        return result
    return shape


# --- SpatialBN ------------------------------------------------------------------------------
def _batch_stats(ctx: OpContext, x: Any, axes: tuple[int, ...], c: int) -> tuple[Any, Any]:
    """Batch mean and biased variance, from X or from combined sums (num_batches > 1)."""
    xp = ctx.xp
    batches = ctx.int_arg("num_batches", 1)
    if batches > 1:
        if ctx.num_inputs < 7:
            raise ctx.fail(f"num_batches={batches} needs inputs sums and sumsq (7 inputs)")
        count = (x.size // max(c, 1)) * batches
        mean = _check_vec(ctx, 5, c) / count
        var = xp.maximum(_check_vec(ctx, 6, c) / count - mean * mean, 0)
        return mean.astype(x.dtype), var.astype(x.dtype)
    mean = x.mean(axis=axes)
    centred = x - mean.reshape(_channels(ctx, x)[3])
    return mean, (centred * centred).mean(axis=axes)


def _unbiased(var: Any, count: int) -> Any:
    """The running variance blends the unbiased batch variance: ``var * n / (n - 1)``
    (infinite scale for a single value, as in Caffe2)."""
    scale = float("inf") if count == 1 else count / (count - 1)
    with np.errstate(invalid="ignore"):
        return var * scale


@register_op("SpatialBN", inputs=(5, 7), outputs=(1, 5),
             inplace=[(0, 0), (3, 1), (4, 2), (5, 3), (6, 4)], shape=_same_shape(0, 3, 4, 3, 4))
def spatial_bn(ctx: OpContext) -> Outputs:
    """Batch normalisation per channel; training mode also blends the running stats."""
    x = ctx.inputs[0]
    _, c, axes, bshape = _channels(ctx, x)
    scale, bias = _check_vec(ctx, 1, c), _check_vec(ctx, 2, c)
    running_mean, running_var = _check_vec(ctx, 3, c), _check_vec(ctx, 4, c)
    eps = ctx.float_arg("epsilon", 1e-5)
    if ctx.int_arg("is_test", 0):
        if ctx.num_outputs != 1:
            raise ctx.fail("is_test=1 produces only Y (1 output)")
        inv_std = 1.0 / ctx.xp.sqrt(running_var + eps)
        mult = (scale * inv_std).reshape(bshape)
        y = (x - running_mean.reshape(bshape)) * mult + bias.reshape(bshape)
        return (y.astype(x.dtype, copy=False),)
    if ctx.num_outputs != 5:
        raise ctx.fail("training mode (is_test=0) needs 5 outputs: Y, running_mean, "
                       "running_var, saved_mean, saved_inv_std")
    dtype = x.dtype
    if x.size == 0:  # an empty batch: running stats unchanged, saved stats zero
        zeros = ctx.xp.zeros(c, dtype=dtype)
        return x.copy(), running_mean.astype(dtype), running_var.astype(dtype), zeros, zeros
    mean, var = _batch_stats(ctx, x, axes, c)
    inv_std = (1.0 / ctx.xp.sqrt(var + eps)).astype(x.dtype)
    y = (x - mean.reshape(bshape)) * (scale * inv_std).reshape(bshape) + bias.reshape(bshape)
    momentum = ctx.float_arg("momentum", 0.9)
    new_mean = momentum * running_mean + (1.0 - momentum) * mean
    new_var = momentum * running_var + (1.0 - momentum) * _unbiased(var, x.size // c * max(
        ctx.int_arg("num_batches", 1), 1))
    return (y.astype(dtype, copy=False), new_mean.astype(dtype), new_var.astype(dtype),
            mean.astype(dtype), inv_std)


@register_op("SpatialBNGradient", inputs=(5, 7), outputs=3, inplace=[(5, 1), (6, 2)],
             shape=_same_shape(0, 1, 1))
def spatial_bn_gradient(ctx: OpContext) -> Outputs:
    """[X, scale, dY, saved_mean, saved_inv_std (+ dscale_sum, dbias_sum)] -> dX, dscale, dbias.

    With ``is_test=1`` input 4 is the running variance (inference-mode affine gradient).
    """
    x, _, dy = ctx.inputs[:3]
    _, c, axes, bshape = _channels(ctx, x)
    scale, mean = _check_vec(ctx, 1, c), _check_vec(ctx, 3, c)
    rstd = _check_vec(ctx, 4, c)
    if ctx.int_arg("is_test", 0):
        rstd = 1.0 / ctx.xp.sqrt(rstd + ctx.float_arg("epsilon", 1e-5))
    x_hat = (x - mean.reshape(bshape)) * rstd.reshape(bshape)
    if ctx.num_inputs == 7 and x.shape[0] == 0:  # Caffe2: an empty batch: zero dscale, dbias
        dscale = dbias = ctx.xp.zeros(c, dtype=x.dtype)
    elif ctx.num_inputs == 7:
        batches = ctx.int_arg("num_batches", 1)
        dscale = _check_vec(ctx, 5, c) / batches
        dbias = _check_vec(ctx, 6, c) / batches
    else:
        dscale = (dy * x_hat).sum(axis=axes)
        dbias = dy.sum(axis=axes)
    if ctx.int_arg("is_test", 0):
        dx = dy * (scale * rstd).reshape(bshape)
    else:
        count = x.size // max(c, 1)
        dx = (scale * rstd).reshape(bshape) * (
            dy - (x_hat * dscale.reshape(bshape) + dbias.reshape(bshape)) / max(count, 1))
    dtype = x.dtype
    return dx.astype(dtype, copy=False), dscale.astype(dtype), dbias.astype(dtype)


@register_gradient("SpatialBN")
def spatial_bn_gradient_maker(g: GradientBuilder) -> None:
    if int(g.arg("is_test", 0)):
        inputs = [g.I(0), g.I(1), g.GO(0), g.I(3), g.I(4)]
    else:
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4)]
        if int(g.arg("num_batches", 1)) > 1:
            inputs += [g.GI(1), g.GI(2)]
    g.add("SpatialBNGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


# --- ChannelStats / ChannelBackpropStats ----------------------------------------------------
def _vec_shape(index: int, count: int) -> Any:
    def shape(op: caffe2_pb2.OperatorDef, shapes: list[Shape | None],
              types: list[int | None]) -> ShapeResult:
        x = shapes[0]
        if x is None:
            return [None] * count
        order = next((a.s.decode() for a in op.arg if a.name == "order"), "NCHW")
        c = x[1] if order == "NCHW" else x[-1]
        return [((c,), types[index] or 1)] * count
    return shape


@register_op("ChannelStats", inputs=1, outputs=2, shape=_vec_shape(0, 2))
def channel_stats(ctx: OpContext) -> Outputs:
    """X -> per-channel sum and sum of squares."""
    (x,) = ctx.inputs
    _, _, axes, _ = _channels(ctx, x)
    return x.sum(axis=axes), (x * x).sum(axis=axes)


@register_op("ChannelBackpropStats", inputs=4, outputs=2, shape=_vec_shape(0, 2))
def channel_backprop_stats(ctx: OpContext) -> Outputs:
    """[X, mean, inv_std, dY] -> dscale = Σ dY·(X-mean)·inv_std, dbias = Σ dY."""
    x, _, _, dy = ctx.inputs
    _, c, axes, bshape = _channels(ctx, x)
    mean, inv_std = _check_vec(ctx, 1, c), _check_vec(ctx, 2, c)
    x_hat = (x - mean.reshape(bshape)) * inv_std.reshape(bshape)
    return ((dy * x_hat).sum(axis=axes).astype(x.dtype, copy=False),
            dy.sum(axis=axes).astype(x.dtype, copy=False))


# --- AffineChannel --------------------------------------------------------------------------
@register_op("AffineChannel", inputs=3, outputs=1, inplace=[(0, 0)], shape=_same_shape(0))
def affine_channel(ctx: OpContext) -> Outputs:
    """Y = X·scale + bias per channel."""
    x = ctx.inputs[0]
    _, c, _, bshape = _channels(ctx, x)
    scale, bias = _check_vec(ctx, 1, c), _check_vec(ctx, 2, c)
    return ((x * scale.reshape(bshape) + bias.reshape(bshape)).astype(x.dtype, copy=False),)


@register_op("AffineChannelGradient", inputs=(2, 3), outputs=(1, 3), inplace=[(0, 0)])
def affine_channel_gradient(ctx: OpContext) -> Outputs:
    """[dY, scale] -> dX, or (is_learnable) [dY, X, scale] -> dX, dscale, dbias."""
    dy = ctx.inputs[0]
    _, c, axes, bshape = _channels(ctx, dy)
    scale = _check_vec(ctx, ctx.num_inputs - 1, c)
    dx = (dy * scale.reshape(bshape)).astype(dy.dtype, copy=False)
    if ctx.num_outputs == 1:
        return (dx,)
    if ctx.num_inputs < 3:
        raise ctx.fail("dscale needs inputs [dY, X, scale] (is_learnable=1)")
    x = ctx.inputs[1]
    return dx, (dy * x).sum(axis=axes).astype(dy.dtype), dy.sum(axis=axes).astype(dy.dtype)


@register_gradient("AffineChannel")
def affine_channel_gradient_maker(g: GradientBuilder) -> None:
    if int(g.arg("is_learnable", 0)):
        g.add("AffineChannelGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])
    else:
        g.add("AffineChannelGradient", [g.GO(0), g.I(1)], [g.GI(0)])


# --- GroupNorm and InstanceNorm -------------------------------------------------------------
def _grouped(ctx: OpContext, x: Any, groups: int) -> tuple[str, Any]:
    """X as (N, G, C/G, S) channel-first (a copy for NHWC)."""
    order = check_order(ctx)
    xc = channel_first(x, order)
    n, c = xc.shape[:2]
    if groups < 1 or c % groups:
        raise ctx.fail(f"{c} channels cannot be split into group={groups}")
    return order, xc.reshape(n, groups, c // groups, math.prod(xc.shape[2:]))


def _ungroup(xg: Any, like: Any, order: str, xp: Any) -> Any:
    from dpgraph.ops._conv_util import channel_last

    if order == "NCHW":
        return xg.reshape(like.shape)
    shape = (like.shape[0], like.shape[-1], *like.shape[1:-1])
    return channel_last(xg.reshape(shape), order, xp)


def _norm_forward(ctx: OpContext, groups: int, eps: float) -> tuple[Any, Any, Any, str]:
    """Y (grouped, before affine), mean and inv_std (N, G) of grouped normalisation."""
    x = ctx.inputs[0]
    order, xg = _grouped(ctx, x, groups)
    mean = xg.mean(axis=(2, 3))
    centred = xg - mean[:, :, None, None]
    inv_std = (1.0 / ctx.xp.sqrt((centred * centred).mean(axis=(2, 3)) + eps)).astype(x.dtype)
    return centred * inv_std[:, :, None, None], mean.astype(x.dtype), inv_std, order


def _affine_grouped(x_hat: Any, gamma: Any, beta: Any) -> Any:
    g, cg = x_hat.shape[1:3]
    return x_hat * gamma.reshape(1, g, cg, 1) + beta.reshape(1, g, cg, 1)


def _norm_backward(ctx: OpContext, x: Any, dy: Any, gamma: Any, mean: Any, inv_std: Any,
                   groups: int) -> Outputs:
    """dX, dgamma, dbeta of grouped normalisation with per-channel affine."""
    order, xg = _grouped(ctx, x, groups)
    _, dyg = _grouped(ctx, dy, groups)
    n, g, cg, _ = xg.shape
    mean4, rstd4 = mean.reshape(n, g, 1, 1), inv_std.reshape(n, g, 1, 1)
    x_hat = (xg - mean4) * rstd4
    dgamma = (dyg * x_hat).sum(axis=(0, 3)).reshape(-1)
    dbeta = dyg.sum(axis=(0, 3)).reshape(-1)
    gy = dyg * gamma.reshape(1, g, cg, 1)
    dx = rstd4 * (gy - gy.mean(axis=(2, 3), keepdims=True)
                  - x_hat * (gy * x_hat).mean(axis=(2, 3), keepdims=True))
    dtype = x.dtype
    return (_ungroup(dx, x, order, ctx.xp).astype(dtype, copy=False), dgamma.astype(dtype),
            dbeta.astype(dtype))


@register_op("GroupNorm", inputs=3, outputs=(1, 3))
def group_norm(ctx: OpContext) -> Outputs:
    """Y = gamma·(X - mean_g)·inv_std_g + beta; outputs Y, mean (N, G), inv_std (N, G)."""
    x, gamma, beta = ctx.inputs
    groups = ctx.int_arg("group", 32)
    x_hat, mean, inv_std, order = _norm_forward(ctx, groups, ctx.float_arg("epsilon", 1e-5))
    y = _ungroup(_affine_grouped(x_hat, gamma, beta), x, order, ctx.xp)
    return (y.astype(x.dtype, copy=False), mean, inv_std)[:ctx.num_outputs]


@register_op("GroupNormGradient", inputs=6, outputs=3)
def group_norm_gradient(ctx: OpContext) -> Outputs:
    """[dY, X, gamma, beta, mean, inv_std] -> dX, dgamma, dbeta."""
    dy, x, gamma, _, mean, inv_std = ctx.inputs
    return _norm_backward(ctx, x, dy, gamma, mean, inv_std, ctx.int_arg("group", 32))


@register_gradient("GroupNorm")
def group_norm_gradient_maker(g: GradientBuilder) -> None:
    if len(g.op.output) < 3:
        raise _needs_outputs("GroupNorm", g, "Y, mean, inv_std")
    g.add("GroupNormGradient", [g.GO(0), g.I(0), g.I(1), g.I(2), g.O(1), g.O(2)],
          [g.GI(0), g.GI(1), g.GI(2)])


def _needs_outputs(op_type: str, g: GradientBuilder, names: str) -> Exception:
    from dpgraph.errors import GradientError

    return GradientError(f"{op_type} {list(g.op.input)}: the gradient needs the outputs "
                         f"{names}; add them to the op")


@register_op("InstanceNorm", inputs=3, outputs=(1, 3))
def instance_norm(ctx: OpContext) -> Outputs:
    """Per-sample, per-channel normalisation; optional outputs saved_mean, saved_inv_stdev."""
    x, scale, bias = ctx.inputs
    c = channel_first(x, check_order(ctx)).shape[1]
    x_hat, mean, inv_std, order = _norm_forward(ctx, c, ctx.float_arg("epsilon", 1e-5))
    y = _ungroup(_affine_grouped(x_hat, scale, bias), x, order, ctx.xp)
    return (y.astype(x.dtype, copy=False), mean, inv_std)[:ctx.num_outputs]


@register_op("InstanceNormGradient", inputs=(4, 6), outputs=3)
def instance_norm_gradient(ctx: OpContext) -> Outputs:
    """[X, scale, bias, dY (, saved_mean, saved_inv_stdev)] -> dX, dscale, dbias."""
    x, scale, _, dy = ctx.inputs[:4]
    c = channel_first(x, check_order(ctx)).shape[1]
    if ctx.num_inputs >= 6:
        mean, inv_std = ctx.inputs[4], ctx.inputs[5]
    else:
        _, mean, inv_std, _ = _norm_forward(ctx, c, ctx.float_arg("epsilon", 1e-5))
    return _norm_backward(ctx, x, dy, scale, mean, inv_std, c)


@register_gradient("InstanceNorm")
def instance_norm_gradient_maker(g: GradientBuilder) -> None:
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)]
    inputs += [g.O(k) for k in (1, 2) if k < len(g.op.output)]
    g.add("InstanceNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


# --- LayerNorm ------------------------------------------------------------------------------
def _layer_dims(ctx: OpContext, x: Any) -> tuple[int, int, int]:
    axis = ctx.int_arg("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ctx.fail(f"axis {ctx.int_arg('axis', 1)} is out of range for shape {x.shape}")
    return axis, math.prod(x.shape[:axis]), math.prod(x.shape[axis:])


@register_op("LayerNorm", inputs=(1, 3), outputs=3)
def layer_norm(ctx: OpContext) -> Outputs:
    """Normalise over dims [axis:]; outputs Y, mean and std (shape X.shape[:axis] + (1,))."""
    x = ctx.inputs[0]
    axis, m, d = _layer_dims(ctx, x)
    x2 = x.reshape(m, d)
    mean = x2.mean(axis=1, keepdims=True)
    centred = x2 - mean
    std = ctx.xp.sqrt((centred * centred).mean(axis=1, keepdims=True)
                      + ctx.float_arg("epsilon", 1e-5))
    y = (centred / std).reshape(x.shape)
    if ctx.int_arg("elementwise_affine", 0):
        gamma, beta = ctx.inputs[1], ctx.inputs[2]
        y = y * gamma.reshape(x.shape[axis:]) + beta.reshape(x.shape[axis:])
    stats_shape = (*x.shape[:axis], 1)
    dtype = x.dtype
    return (y.astype(dtype, copy=False), mean.reshape(stats_shape).astype(dtype),
            std.reshape(stats_shape).astype(dtype))


@register_op("LayerNormGradient", inputs=(5, 6), outputs=(1, 3))
def layer_norm_gradient(ctx: OpContext) -> Outputs:
    """[dY, Y, mean, std, X (, gamma)] -> dX (, dgamma, dbeta)."""
    dy, _, mean, std, x = ctx.inputs[:5]
    axis, m, d = _layer_dims(ctx, x)
    x_hat = (x.reshape(m, d) - mean.reshape(m, 1)) / std.reshape(m, 1)
    dy2 = dy.reshape(m, d)
    gy = dy2 * ctx.inputs[5].reshape(1, d) if ctx.num_inputs == 6 else dy2
    dx = (gy - gy.mean(axis=1, keepdims=True)
          - x_hat * (gy * x_hat).mean(axis=1, keepdims=True)) / std.reshape(m, 1)
    outs: list[Any] = [dx.reshape(x.shape).astype(x.dtype, copy=False)]
    if ctx.num_outputs == 3:
        affine_shape = x.shape[axis:]
        outs += [(dy2 * x_hat).sum(axis=0).reshape(affine_shape).astype(x.dtype),
                 dy2.sum(axis=0).reshape(affine_shape).astype(x.dtype)]
    return outs


@register_gradient("LayerNorm")
def layer_norm_gradient_maker(g: GradientBuilder) -> None:
    inputs = [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0)]
    outputs = [g.GI(0)]
    if int(g.arg("elementwise_affine", 0)):
        inputs.append(g.I(1))
        outputs += [g.GI(1), g.GI(2)]
    g.add("LayerNormGradient", inputs, outputs)


# --- ElementwiseLinear ----------------------------------------------------------------------
def _linear_dims(ctx: OpContext, x: Any) -> tuple[int, int]:
    axis = ctx.int_arg("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    n, d = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    if ctx.inputs[1].size != d:
        raise ctx.fail(f"a has {ctx.inputs[1].size} values but X {x.shape} flattened at axis "
                       f"{axis} has {d} columns")
    return n, d


@register_op("ElementwiseLinear", inputs=3, outputs=1, shape=_same_shape(0))
def elementwise_linear(ctx: OpContext) -> Outputs:
    """Y = X·a + b with X flattened to (N, D) at ``axis`` and a, b of size D."""
    x, a, b = ctx.inputs
    n, d = _linear_dims(ctx, x)
    y = x.reshape(n, d) * a.reshape(1, d) + b.reshape(1, d)
    return (y.reshape(x.shape).astype(x.dtype, copy=False),)


@register_op("ElementwiseLinearGradient", inputs=3, outputs=3)
def elementwise_linear_gradient(ctx: OpContext) -> Outputs:
    """[dY, X, a] -> dX, da, db."""
    dy, x, a = ctx.inputs
    n, d = _grad_linear_dims(ctx, x)
    dy2 = dy.reshape(n, d)
    dx = (dy2 * a.reshape(1, d)).reshape(x.shape)
    return (dx.astype(x.dtype, copy=False), (dy2 * x.reshape(n, d)).sum(axis=0).astype(a.dtype),
            dy2.sum(axis=0).astype(a.dtype))


def _grad_linear_dims(ctx: OpContext, x: Any) -> tuple[int, int]:
    axis = ctx.int_arg("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return math.prod(x.shape[:axis]), math.prod(x.shape[axis:])


@register_gradient("ElementwiseLinear")
def elementwise_linear_gradient_maker(g: GradientBuilder) -> None:
    g.add("ElementwiseLinearGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])


# --- Moments and BatchMoments ---------------------------------------------------------------
def _moment_axes(ctx: OpContext, x: Any) -> tuple[int, ...]:
    if not ctx.has_arg("axes"):
        return tuple(range(x.ndim))
    axes = tuple(sorted({a + x.ndim if a < 0 else a for a in ctx.ints_arg("axes")}))
    if any(not 0 <= a < x.ndim for a in axes):
        raise ctx.fail(f"axes {ctx.ints_arg('axes')} out of range for shape {x.shape}")
    return axes


@register_op("Moments", inputs=1, outputs=2)
def moments(ctx: OpContext) -> Outputs:
    """Mean and biased variance over ``axes`` (all by default), ``keepdims`` default 1."""
    (x,) = ctx.inputs
    axes = _moment_axes(ctx, x)
    keep = bool(ctx.int_arg("keepdims", 1))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=keep)
    if not keep:
        mean = mean.reshape(var.shape)
    return mean.astype(x.dtype, copy=False), var.astype(x.dtype, copy=False)


@register_op("MomentsGradient", inputs=4, outputs=1)
def moments_gradient(ctx: OpContext) -> Outputs:
    """[dmean, dvar, X, mean] -> dX = dmean/n + dvar·2(X - mean)/n."""
    dmean, dvar, x, mean = ctx.inputs
    axes = _moment_axes(ctx, x)
    keep_shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    n = math.prod(x.shape[i] for i in axes) or 1
    dx = (dmean.reshape(keep_shape)
          + 2.0 * dvar.reshape(keep_shape) * (x - mean.reshape(keep_shape))) / n
    return (dx.astype(x.dtype, copy=False),)


@register_gradient("Moments")
def moments_gradient_maker(g: GradientBuilder) -> None:
    g.add("MomentsGradient", [g.GO(0), g.GO(1), g.I(0), g.O(0)], [g.GI(0)])


@register_op("BatchMoments", inputs=1, outputs=2, shape=_vec_shape(0, 2))
def batch_moments(ctx: OpContext) -> Outputs:
    """Per-channel mean and second moment E[x²] (not centred), as Caffe2."""
    (x,) = ctx.inputs
    _, _, axes, _ = _channels(ctx, x)
    return (x.mean(axis=axes).astype(x.dtype, copy=False),
            (x * x).mean(axis=axes).astype(x.dtype, copy=False))


@register_op("BatchMomentsGradient", inputs=3, outputs=1)
def batch_moments_gradient(ctx: OpContext) -> Outputs:
    """[dmu, dvar, X] -> dX = (dmu + 2·dvar·X) / count."""
    dmu, dvar, x = ctx.inputs
    _, c, _, bshape = _channels(ctx, x)
    count = max(x.size // max(c, 1), 1)
    dx = (dmu.reshape(bshape) + 2.0 * dvar.reshape(bshape) * x) / count
    return (dx.astype(x.dtype, copy=False),)


@register_gradient("BatchMoments")
def batch_moments_gradient_maker(g: GradientBuilder) -> None:
    g.add("BatchMomentsGradient", [g.GO(0), g.GO(1), g.I(0)], [g.GI(0)])


# --- LRN (local response normalisation across channels) -----------------------------------
def _lrn_args(ctx: OpContext, x: Any) -> tuple[int, int, float, float, float]:
    """(channel axis, size, alpha, beta, bias) of an LRN op."""
    order = check_order(ctx)
    if x.ndim < 2:
        raise ctx.fail(f"LRN needs an input with a channel axis, got shape {x.shape}")
    size = ctx.int_arg("size", 0)
    if size < 1:
        raise ctx.fail(f"argument 'size' must be a positive window size, got {size}")
    axis = 1 if order == "NCHW" else x.ndim - 1
    return (axis, size, ctx.float_arg("alpha", 0.0), ctx.float_arg("beta", 0.0),
            ctx.float_arg("bias", 1.0))


def _channel_window_sum(xp: Any, a: Any, axis: int, size: int, before: int) -> Any:
    """``out[c] = sum(a[c - before : c - before + size])`` along ``axis`` (zeros outside)."""
    width = [(0, 0)] * a.ndim
    width[axis] = (before, size - 1 - before)
    padded = xp.pad(a, width)
    channels = a.shape[axis]
    out = xp.zeros_like(a)
    for j in range(size):
        index = [slice(None)] * a.ndim
        index[axis] = slice(j, j + channels)
        out += padded[tuple(index)]
    return out


def _lrn_scale(ctx: OpContext, x: Any) -> Any:
    axis, size, alpha, _, bias = _lrn_args(ctx, x)
    squares = x * x * x.dtype.type(alpha / size)
    return bias + _channel_window_sum(ctx.xp, squares, axis, size, (size - 1) // 2)


@register_op("LRN", inputs=1, outputs=(1, 2), shape=_same_shape(0, 0))
def lrn(ctx: OpContext) -> Outputs:
    """X -> [Y, (scale)]: scale = bias + alpha/size · Σ X² over a window of ``size`` channels
    (starting ``(size-1)//2`` before the channel), Y = X · scale^(-beta)."""
    (x,) = ctx.inputs
    beta = _lrn_args(ctx, x)[3]
    scale = _lrn_scale(ctx, x).astype(x.dtype, copy=False)
    y = (x * scale ** x.dtype.type(-beta)).astype(x.dtype, copy=False)
    return (y, scale)[:ctx.num_outputs]


@register_op("LRNGradient", inputs=(3, 4), outputs=1, shape=_same_shape(0))
def lrn_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dY] -> dX (Caffe2 recomputes the scale; [X, Y, scale, dY] is also accepted)."""
    x, y, dy = ctx.inputs[0], ctx.inputs[1], ctx.inputs[-1]
    axis, size, alpha, beta, _ = _lrn_args(ctx, x)
    scale = ctx.inputs[2] if ctx.num_inputs == 4 else _lrn_scale(ctx, x)
    ratio = dy * y / scale
    before = size - 1 - (size - 1) // 2  # the windows that contain each channel
    accum = _channel_window_sum(ctx.xp, ratio, axis, size, before)
    dx = dy * scale ** (-beta) - (2.0 * alpha * beta / size) * x * accum
    return (dx.astype(x.dtype, copy=False),)


@register_gradient("LRN")
def _lrn_grad(g: GradientBuilder) -> None:
    g.add("LRNGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])
