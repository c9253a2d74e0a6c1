"""Shape ops: Flatten, Reshape, Transpose, layout changes, Concat/Split, Slice, Tile, Expand,
ExpandDims/Squeeze, ChannelShuffle, Size and Shape.

Gradient makers follow Caffe2: Flatten/FlattenToVec -> ``ResizeLike([dY, X])``; Reshape ->
``Reshape([dY, old_shape])``; Transpose -> Transpose with the inverse ``axes``; Concat ->
``Split([dY, split_info])``; Split -> ``Concat`` of the output grads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, GradientError
from dpgraph.ir.arguments import MakeArgument, arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import detached, host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import DataType
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.math import reduce_to_shape


def _host_ints(value: Any) -> list[int]:
    return [int(v) for v in host(value).reshape(-1)]


# --- Flatten, Reshape, ResizeLike --------------------------------------------------------
def _flatten_infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]) -> list[Any]:
    if in_shapes[0] is None:
        return [None]
    shape = tuple(in_shapes[0])
    axis = int(arguments_dict(op.arg).get("axis", 1))
    return [((int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))), in_types[0])]


@register_op("Flatten", inputs=1, outputs=1, shape=_flatten_infer)
def flatten(ctx: OpContext) -> Outputs:
    """Reshape to 2-D: (prod(dims[:axis]), prod(dims[axis:])), axis default 1."""
    x = ctx.xp.asarray(ctx.inputs[0])
    axis = ctx.int_arg("axis", 1)
    if not 0 <= axis <= x.ndim:
        raise ctx.fail(f"axis {axis} out of range for X {x.shape}")
    return (detached(ctx, x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))),)


def _flatten_to_vec_infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]
                          ) -> list[Any]:
    if in_shapes[0] is None:
        return [None]
    return [((int(np.prod(in_shapes[0])),), in_types[0])]


@register_op("FlattenToVec", inputs=1, outputs=1, shape=_flatten_to_vec_infer)
def flatten_to_vec(ctx: OpContext) -> Outputs:
    """Reshape to 1-D."""
    return (detached(ctx, ctx.xp.asarray(ctx.inputs[0]).reshape(-1)),)


def _resize_like_gradient(g: GradientBuilder) -> None:
    g.add("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])


register_gradient("Flatten")(_resize_like_gradient)
register_gradient("FlattenToVec")(_resize_like_gradient)


@register_op("ResizeLike", inputs=2, outputs=1, inplace=[(0, 0)], shape=same_as_input(1))
def resize_like(ctx: OpContext) -> Outputs:
    """A's data with B's shape (same number of elements)."""
    a, b = ctx.inputs
    if np.size(a) != np.size(b):
        raise ctx.fail(f"cannot resize {np.shape(a)} like {np.shape(b)}: sizes differ")
    return (ctx.xp.reshape(ctx.xp.asarray(a), np.shape(b)),)


def resolve_shape(ctx: OpContext, old: Sequence[int], new: Sequence[int]) -> tuple[int, ...]:
    """Caffe2's Reshape rules: 0 copies the old dim (of a non-empty input), one -1 is
    inferred (0 for an empty input)."""
    shape = _with_copied_dims(old, new)
    if shape.count(-1) > 1:
        raise ArgumentError(ctx.describe(f"at most one -1 in the new shape, got {list(new)}"))
    total = int(np.prod(old))
    known = int(np.prod([d for d in shape if d != -1]))
    if known == 0 and total != 0:
        raise ctx.fail(f"cannot reshape {tuple(old)} ({total} elements) to zero size {shape}")
    if -1 in shape:
        if total and total % known:
            raise ctx.fail(f"cannot infer -1 in {list(new)} from {total} elements")
        shape[shape.index(-1)] = total // known if total else 0
    if int(np.prod(shape)) != total:
        raise ctx.fail(f"cannot reshape {tuple(old)} ({total} elements) to {shape}")
    return tuple(shape)


def _with_copied_dims(old: Sequence[int], new: Sequence[int]) -> list[int]:
    """``new`` with each 0 replaced by the old dim at its position; an empty input keeps
    its zeros (they are real sizes then), as in Caffe2."""
    if int(np.prod(old)) == 0:
        return [int(d) for d in new]
    return [int(old[i]) if d == 0 and i < len(old) else int(d) for i, d in enumerate(new)]


def _reshape_infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]) -> list[Any]:
    old_shape = None if in_shapes[0] is None else ((len(in_shapes[0]),), DataType.INT64)
    new = arguments_dict(op.arg).get("shape")
    if in_shapes[0] is None or len(op.input) > 1 or not isinstance(new, list):
        return [None, old_shape]
    old = [int(d) for d in in_shapes[0]]
    shape = _with_copied_dims(old, new)
    if shape.count(-1) == 1:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(old)) // known if known else 0
    return [(tuple(shape), in_types[0]), old_shape]


@register_op("Reshape", inputs=(1, 2), outputs=2, inplace=[(0, 0)], shape=_reshape_infer)
def reshape(ctx: OpContext) -> Outputs:
    """[X, (shape)] -> [reshaped, old_shape int64]; the shape arg or the 2nd input."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if len(ctx.inputs) == 2:
        if ctx.has_arg("shape"):
            raise ArgumentError(ctx.describe("give the new shape as an argument or an input, "
                                             "not both"))
        new = _host_ints(ctx.inputs[1])
    elif ctx.has_arg("shape"):
        new = ctx.ints_arg("shape")
    else:
        raise ArgumentError(ctx.describe("needs a shape argument or a 2nd input"))
    shape = resolve_shape(ctx, x.shape, new)
    return (detached(ctx, x.reshape(shape)), np.asarray(x.shape, dtype=np.int64))


@register_gradient("Reshape", copy_arguments=False)
def _reshape_gradient(g: GradientBuilder) -> None:
    g.add("Reshape", [g.GO(0), g.O(1)], [g.GI(0), "_" + g.GI(0) + "_dims"])


# --- Transpose and layouts ---------------------------------------------------------------
def _axes(ctx: OpContext, ndim: int) -> list[int]:
    axes = ctx.ints_arg("axes") if ctx.has_arg("axes") else []
    if not axes:
        return list(range(ndim))[::-1]
    if sorted(axes) != list(range(ndim)):
        raise ArgumentError(ctx.describe(f"axes {axes} is not a permutation of {ndim} dims"))
    return axes


def _transpose_infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]) -> list[Any]:
    if in_shapes[0] is None:
        return [None]
    shape = tuple(in_shapes[0])
    axes = arguments_dict(op.arg).get("axes") or list(range(len(shape)))[::-1]
    return [(tuple(shape[a] for a in axes), in_types[0])]


@register_op("Transpose", inputs=1, outputs=1, shape=_transpose_infer)
def transpose(ctx: OpContext) -> Outputs:
    """Permute dims by ``axes`` (default: reverse them)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    return (detached(ctx, ctx.xp.asarray(ctx.xp.transpose(x, _axes(ctx, x.ndim)), order="C")),)


@register_gradient("Transpose", copy_arguments=False)
def _transpose_gradient(g: GradientBuilder) -> None:
    op = g.add("Transpose", [g.GO(0)], [g.GI(0)])
    for argument in g.op.arg:
        if argument.name == "axes":
            inverse = [0] * len(argument.ints)
            for position, axis in enumerate(argument.ints):
                inverse[axis] = position
            op.arg.append(MakeArgument("axes", inverse))
        else:
            op.arg.append(argument)


def _layout_infer(perm: Sequence[int]) -> Any:
    def infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]) -> list[Any]:
        if in_shapes[0] is None:
            return [None]
        return [(tuple(in_shapes[0][p] for p in perm), in_types[0])]

    return infer


@register_op("NHWC2NCHW", inputs=1, outputs=1, shape=_layout_infer((0, 3, 1, 2)))
def nhwc2nchw(ctx: OpContext) -> Outputs:
    """Move the channel dim from last to second."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.ndim < 3:
        raise ctx.fail(f"input must have rank >= 3, got {x.shape}")
    perm = (0, x.ndim - 1) + tuple(range(1, x.ndim - 1))
    return (detached(ctx, ctx.xp.asarray(ctx.xp.transpose(x, perm), order="C")),)


@register_op("NCHW2NHWC", inputs=1, outputs=1, shape=_layout_infer((0, 2, 3, 1)))
def nchw2nhwc(ctx: OpContext) -> Outputs:
    """Move the channel dim from second to last."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.ndim < 3:
        raise ctx.fail(f"input must have rank >= 3, got {x.shape}")
    perm = (0,) + tuple(range(2, x.ndim)) + (1,)
    return (detached(ctx, ctx.xp.asarray(ctx.xp.transpose(x, perm), order="C")),)


@register_gradient("NHWC2NCHW")
def _nhwc2nchw_gradient(g: GradientBuilder) -> None:
    g.add("NCHW2NHWC", [g.GO(0)], [g.GI(0)])


@register_gradient("NCHW2NHWC")
def _nchw2nhwc_gradient(g: GradientBuilder) -> None:
    g.add("NHWC2NCHW", [g.GO(0)], [g.GI(0)])


# --- Concat and Split --------------------------------------------------------------------
def concat_axis(ctx: OpContext, ndim: int) -> int:
    """The axis of Concat/Split: ``axis``, else from ``order`` (Caffe2's fixed NCHW -> 1,
    NHWC -> 3, whatever the rank)."""
    if ctx.has_arg("axis"):
        axis = ctx.int_arg("axis")
    else:
        axis = 3 if ctx.str_arg("order", "NCHW") == "NHWC" else 1
    return axis + ndim if axis < 0 else axis


def _concat_infer(op: Any, in_shapes: Sequence[Any], in_types: Sequence[Any]) -> list[Any]:
    split_info = ((len(in_shapes),), DataType.INT32)
    if any(s is None for s in in_shapes):
        return [None, split_info][:len(op.output)]
    args = arguments_dict(op.arg)
    add_axis = bool(args.get("add_axis", 0))
    ndim = len(in_shapes[0]) + (1 if add_axis else 0)
    default = ndim - 1 if args.get("order", "NCHW") == "NHWC" else 1
    axis = int(args.get("axis", default))
    axis = axis + ndim if axis < 0 else axis
    shape = list(in_shapes[0])
    if add_axis:
        shape.insert(axis, len(in_shapes))
    else:
        shape[axis] = sum(int(s[axis]) for s in in_shapes)
    return [(tuple(shape), in_types[0]), split_info][:len(op.output)]


@register_op("Concat", inputs=(1, None), outputs=(1, 2), shape=_concat_infer, peer_inputs=True)
def concat(ctx: OpContext) -> Outputs:
    """[X0, X1, ...] -> [concatenated, split_info int32 (sizes along axis)]."""
    xp = ctx.xp
    inputs = [xp.asarray(v) for v in ctx.inputs]
    add_axis = bool(ctx.int_arg("add_axis", 0))
    ndim = inputs[0].ndim + (1 if add_axis else 0)
    axis = concat_axis(ctx, ndim)
    if not 0 <= axis < max(ndim, 1):
        raise ctx.fail(f"axis {axis} out of range for inputs of rank {inputs[0].ndim}")
    if add_axis:
        inputs = [xp.expand_dims(v, axis) for v in inputs]
    try:
        out = xp.concatenate(inputs, axis=axis)
    except ValueError as error:
        shapes = [tuple(v.shape) for v in inputs]
        raise ctx.fail(f"cannot concatenate shapes {shapes} on axis {axis}: {error}") from None
    split_info = np.asarray([v.shape[axis] for v in inputs], dtype=np.int32)
    return (out, split_info)[:ctx.num_outputs]


@register_gradient("Concat")
def _concat_gradient(g: GradientBuilder) -> None:
    if len(g.op.output) < 2:
        raise GradientError(f"Concat {list(g.op.input)} -> {list(g.op.output)}: the gradient "
                            "needs the split_info output; add a 2nd output.")
    g.add("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(len(g.op.input))])


def _split_sizes(ctx: OpContext, total: int) -> list[int]:
    if len(ctx.inputs) == 2:
        if ctx.has_arg("split"):
            raise ArgumentError(ctx.describe("give split as an argument or an input, not both"))
        sizes = _host_ints(ctx.inputs[1])
    elif ctx.has_arg("split"):
        sizes = ctx.ints_arg("split")
    else:
        if total % ctx.num_outputs:
            raise ctx.fail(f"cannot split {total} evenly into {ctx.num_outputs} outputs")
        sizes = [total // ctx.num_outputs] * ctx.num_outputs
    if len(sizes) != ctx.num_outputs or sum(sizes) != total:
        raise ctx.fail(f"split sizes {sizes} must have one entry per output "
                       f"({ctx.num_outputs}) and sum to {total}")
    return sizes


@register_op("Split", inputs=(1, 2), outputs=(1, None))
def split(ctx: OpContext) -> Outputs:
    """Split X along ``axis`` by ``split`` (arg or 2nd input), or into equal parts."""
    xp = ctx.xp
    x = xp.asarray(ctx.inputs[0])
    add_axis = bool(ctx.int_arg("add_axis", 0))
    axis = concat_axis(ctx, x.ndim)
    if not 0 <= axis < x.ndim:
        raise ctx.fail(f"axis {axis} out of range for X {x.shape}")
    sizes = _split_sizes(ctx, x.shape[axis])
    if add_axis and any(s != 1 for s in sizes):
        raise ctx.fail(f"with add_axis=1 every split size must be 1, got {sizes}")
    bounds = np.cumsum(sizes)[:-1].tolist()
    parts = xp.split(x, bounds, axis=axis)
    if add_axis:
        parts = [xp.squeeze(p, axis=axis) for p in parts]
    return tuple(detached(ctx, xp.asarray(p, order="C"), 0, index)
                 for index, p in enumerate(parts))


def _concat_of_output_grads(g: GradientBuilder) -> None:
    grads = []
    for index in range(len(g.op.output)):
        if g.has_go(index):
            grads.append(g.GO(index))
        else:  # Caffe2 drops missing grads (wrong shape); dpgraph fills zeros instead
            zeros = "_" + g.O(index) + "_grad_autogen_zeros"
            g.add("ConstantFill", [g.O(index)], [zeros], value=0.0)
            grads.append(zeros)
    g.add("Concat", grads, [g.GI(0), "_" + g.GI(0) + "_dims"])


register_gradient("Split")(_concat_of_output_grads)

# Caffe2's backward-compatible names.
register_op("DepthConcat", inputs=(1, None), outputs=(1, 2), shape=_concat_infer,
            peer_inputs=True)(concat)
register_op("DepthSplit", inputs=(1, 2), outputs=(1, None))(split)
register_gradient("DepthConcat")(_concat_gradient)
register_gradient("DepthSplit")(_concat_of_output_grads)


@register_op("SplitByLengths", inputs=2, outputs=(1, None))
def split_by_lengths(ctx: OpContext) -> Outputs:
    """Split along ``axis`` (default 0); output k gets the sum of its share of lengths."""
    xp = ctx.xp
    data = xp.asarray(ctx.inputs[0])
    lengths = _host_ints(ctx.inputs[1])
    if len(lengths) % ctx.num_outputs:
        raise ctx.fail(f"{len(lengths)} lengths do not divide into {ctx.num_outputs} outputs")
    axis = ctx.int_arg("axis", 0)
    per = len(lengths) // ctx.num_outputs
    sizes = [sum(lengths[k * per:(k + 1) * per]) for k in range(ctx.num_outputs)]
    if ctx.int_arg("use_scaling_lengths", 0):
        sizes = [size * _length_scale(ctx, data.shape[axis], sum(sizes)) for size in sizes]
    if sum(sizes) != data.shape[axis]:
        raise ctx.fail(f"lengths sum to {sum(sizes)} but data has {data.shape[axis]} "
                       f"entries on axis {axis}")
    parts = xp.split(data, np.cumsum(sizes)[:-1].tolist(), axis=axis)
    return tuple(detached(ctx, xp.asarray(p, order="C"), 0, index)
                 for index, p in enumerate(parts))


def _length_scale(ctx: OpContext, entries: int, total: int) -> int:
    """``use_scaling_lengths``: each length counts ``entries / sum(lengths)`` entries."""
    if total == 0:
        return 1
    if entries % total:
        raise ctx.fail(f"use_scaling_lengths: data has {entries} entries, not a multiple of "
                       f"the lengths' sum {total}")
    return entries // total


register_gradient("SplitByLengths")(_concat_of_output_grads)


@register_op("LengthsToShape", inputs=1, outputs=1)
def lengths_to_shape(ctx: OpContext) -> Outputs:
    """N equal lengths -> the int32 shape ``[N, length]`` of the matrix they make."""
    lengths = _host_ints(ctx.inputs[0])
    if len(set(lengths)) > 1:
        raise ctx.fail(f"all lengths must be equal to form a matrix, got {lengths}")
    return (np.asarray([len(lengths), lengths[0] if lengths else 0], dtype=np.int32),)


# --- Slice -------------------------------------------------------------------------------
def _slices(ctx: OpContext, shape: Sequence[int], args_inputs: Sequence[Any]) -> tuple[Any, ...]:
    if args_inputs:
        starts, ends = _host_ints(args_inputs[0]), _host_ints(args_inputs[1])
    else:
        starts, ends = ctx.ints_arg("starts"), ctx.ints_arg("ends")
    if len(starts) != len(ends) or len(starts) > len(shape):
        raise ctx.fail(f"starts {starts} and ends {ends} must have equal length <= rank "
                       f"{len(shape)}")
    result = []
    for dim, start, end in zip(shape, starts, ends):
        start = dim + 1 + start if start < 0 else start
        end = dim + 1 + end if end < 0 else end
        if not 0 <= start <= end <= dim:
            raise ctx.fail(f"slice [{start}, {end}) out of range for a dim of size {dim}")
        result.append(slice(start, end))
    return tuple(result)


@register_op("Slice", inputs=(1, 3), outputs=1)
def slice_op(ctx: OpContext) -> Outputs:
    """X[starts:ends] per dim; negative indices count from size+1 (-1 = to the end)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    return (x[_slices(ctx, x.shape, ctx.inputs[1:3])].copy(),)


@register_op("SliceGradient", inputs=(2, 4), outputs=1, shape=same_as_input())
def slice_gradient(ctx: OpContext) -> Outputs:
    """[X, (starts, ends,) dY] -> dX: dY in the sliced region, zeros elsewhere."""
    x, dy = ctx.xp.asarray(ctx.inputs[0]), ctx.xp.asarray(ctx.inputs[-1])
    dx = ctx.xp.zeros(x.shape, dtype=dy.dtype)
    dx[_slices(ctx, x.shape, ctx.inputs[1:3] if len(ctx.inputs) == 4 else [])] = dy
    return (dx,)


@register_gradient("Slice")
def _slice_gradient(g: GradientBuilder) -> None:
    inputs = [g.I(0), g.I(1), g.I(2)] if len(g.op.input) > 1 else [g.I(0)]
    g.add("SliceGradient", [*inputs, g.GO(0)], [g.GI(0)])


# --- ExpandDims, Squeeze -----------------------------------------------------------------
@register_op("ExpandDims", inputs=1, outputs=1, inplace=[(0, 0)])
def expand_dims(ctx: OpContext) -> Outputs:
    """Insert size-1 dims at the (sorted, de-duplicated, as in Caffe2) positions ``dims``."""
    x = ctx.xp.asarray(ctx.inputs[0])
    shape = list(x.shape)
    for dim in sorted(set(ctx.ints_arg("dims"))):
        if not 0 <= dim <= len(shape):
            raise ctx.fail(f"dim {dim} out of range for shape {shape}")
        shape.insert(dim, 1)
    return (detached(ctx, x.reshape(shape)),)


@register_op("Squeeze", inputs=1, outputs=1, inplace=[(0, 0)])
def squeeze(ctx: OpContext) -> Outputs:
    """Drop the size-1 dims listed in ``dims``."""
    x = ctx.xp.asarray(ctx.inputs[0])
    dims = sorted(set(ctx.ints_arg("dims")))
    if any(not 0 <= d < x.ndim or x.shape[d] != 1 for d in dims):
        raise ctx.fail(f"cannot squeeze dims {dims} of shape {x.shape}: each must be size 1")
    return (detached(ctx, x.reshape([s for i, s in enumerate(x.shape) if i not in dims])),)


@register_gradient("ExpandDims")
def _expand_dims_gradient(g: GradientBuilder) -> None:
    g.add("Squeeze", [g.GO(0)], [g.GI(0)])


@register_gradient("Squeeze")
def _squeeze_gradient(g: GradientBuilder) -> None:
    g.add("ExpandDims", [g.GO(0)], [g.GI(0)])


# --- Tile, NumpyTile, Expand -------------------------------------------------------------
def _tiles_axis(ctx: OpContext, ndim: int) -> tuple[int, int]:
    if len(ctx.inputs) >= 3:
        tiles, axis = _host_ints(ctx.inputs[1])[0], _host_ints(ctx.inputs[2])[0]
    else:
        tiles, axis = ctx.int_arg("tiles", 1), ctx.int_arg("axis", 0)
    axis = axis + ndim if axis < 0 else axis
    if not 0 <= axis < ndim or tiles < 0:
        raise ctx.fail(f"tiles {tiles} / axis {axis} invalid for a rank-{ndim} input")
    return tiles, axis


@register_op("Tile", inputs=(1, 3), outputs=1)
def tile(ctx: OpContext) -> Outputs:
    """Repeat X ``tiles`` times along ``axis`` (args, or inputs 1 and 2)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    tiles, axis = _tiles_axis(ctx, x.ndim)
    reps = [1] * x.ndim
    reps[axis] = tiles
    ctx.check_output_size([d * r for d, r in zip(x.shape, reps)], x.dtype)
    return (ctx.xp.tile(x, reps),)


@register_op("TileGradient", inputs=(1, 3), outputs=1)
def tile_gradient(ctx: OpContext) -> Outputs:
    """Sum the ``tiles`` copies of dY along ``axis``."""
    dy = ctx.xp.asarray(ctx.inputs[0])
    tiles, axis = _tiles_axis(ctx, dy.ndim)
    shape = dy.shape[:axis] + (tiles, dy.shape[axis] // max(tiles, 1)) + dy.shape[axis + 1:]
    return (ctx.xp.sum(dy.reshape(shape), axis=axis),)


@register_gradient("Tile")
def _tile_gradient(g: GradientBuilder) -> None:
    g.add("TileGradient", [g.GO(0), *g.op.input[1:]], [g.GI(0)])


@register_op("NumpyTile", inputs=2, outputs=1)
def numpy_tile(ctx: OpContext) -> Outputs:
    """numpy.tile(input, repeats), one repeat per dim."""
    x = ctx.xp.asarray(ctx.inputs[0])
    repeats = _host_ints(ctx.inputs[1])
    if len(repeats) != x.ndim:
        raise ctx.fail(f"{len(repeats)} repeats for a rank-{x.ndim} input; give one per dim")
    if any(r < 0 for r in repeats):
        raise ctx.fail(f"repeats {repeats} must be >= 0")
    ctx.check_output_size([d * r for d, r in zip(x.shape, repeats)], x.dtype)
    return (ctx.xp.tile(x, repeats),)


@register_op("Expand", inputs=2, outputs=1)
def expand(ctx: OpContext) -> Outputs:
    """Broadcast X to ``shape`` (numpy rules in both directions, as ONNX Expand; a negative
    dim counts by its absolute value, so -1 keeps X's dim, as in Caffe2)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    target = [abs(d) for d in _host_ints(ctx.inputs[1])]
    try:
        shape = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise ctx.fail(f"cannot expand {x.shape} to {target}") from None
    ctx.check_output_size(shape, x.dtype)
    return (ctx.xp.array(ctx.xp.broadcast_to(x, shape)),)


@register_op("ExpandGradient", inputs=2, outputs=1, shape=same_as_input(1))
def expand_gradient(ctx: OpContext) -> Outputs:
    """[dY, X] -> dX: dY summed back to X's shape."""
    dy, x = (ctx.xp.asarray(v) for v in ctx.inputs)
    return (reduce_to_shape(ctx.xp, dy, x.shape),)


@register_gradient("Expand")
def _expand_gradient(g: GradientBuilder) -> None:
    g.add("ExpandGradient", [g.GO(0), g.I(0)], [g.GI(0)])


# --- ChannelShuffle ----------------------------------------------------------------------
def _shuffle(ctx: OpContext, x: Any, forward: bool) -> Any:
    group = ctx.int_arg("group", 1)
    nhwc = ctx.str_arg("order", "NCHW") == "NHWC"
    channel = x.ndim - 1 if nhwc else 1
    channels = x.shape[channel]
    if channels % group:
        raise ctx.fail(f"{channels} channels do not divide into {group} groups")
    split = (group, channels // group) if forward else (channels // group, group)
    moved = ctx.xp.moveaxis(x, channel, -1)
    shuffled = ctx.xp.swapaxes(moved.reshape(moved.shape[:-1] + split), -1, -2)
    return ctx.xp.ascontiguousarray(ctx.xp.moveaxis(shuffled.reshape(moved.shape), -1, channel))


@register_op("ChannelShuffle", inputs=1, outputs=1, shape=same_as_input())
def channel_shuffle(ctx: OpContext) -> Outputs:
    """Channels (G, K) -> (K, G) transposed (``group`` G, ``order`` NCHW/NHWC)."""
    return (_shuffle(ctx, ctx.xp.asarray(ctx.inputs[0]), True),)


@register_op("ChannelShuffleGradient", inputs=1, outputs=1, shape=same_as_input())
def channel_shuffle_gradient(ctx: OpContext) -> Outputs:
    """The inverse channel permutation applied to dY."""
    return (_shuffle(ctx, ctx.xp.asarray(ctx.inputs[0]), False),)


@register_gradient("ChannelShuffle")
def _channel_shuffle_gradient(g: GradientBuilder) -> None:
    g.add("ChannelShuffleGradient", [g.GO(0)], [g.GI(0)])


# --- Size, Shape -------------------------------------------------------------------------
@register_op("Size", inputs=1, outputs=1,
             shape=lambda op, s, t: [((), DataType.INT64)])
def size(ctx: OpContext) -> Outputs:
    """The number of elements of X, a 0-d int64 tensor."""
    return (np.asarray(int(np.size(ctx.inputs[0])), dtype=np.int64),)


@register_op("Shape", inputs=1, outputs=1)
def shape_op(ctx: OpContext) -> Outputs:
    """X's dims as a 1-D int64 tensor (only ``axes`` when given)."""
    dims = list(np.shape(ctx.inputs[0]))
    if ctx.has_arg("axes"):
        dims = [dims[a] for a in ctx.ints_arg("axes")]
    return (np.asarray(dims, dtype=np.int64),)
