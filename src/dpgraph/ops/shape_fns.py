"""Caffe2's tensor inference functions for ops registered by other family modules.

Importing this module (``dpgraph.ops`` imports it after every family) attaches a
``shape_fn(op, input_shapes, input_types)`` (see :class:`dpgraph.ir.registry.OpSchema`) to
ops whose own module registered none, or replaces one that disagreed with Caffe2's
``TensorInferenceFunction``.  ``InferShapesAndTypes`` then answers from the shapes alone
instead of running the op's kernel on placeholder inputs (slow for large tensors, and wrong
for these ops' outputs the kernel does not make).

Each function mirrors one Caffe2 schema:

* ``Concat``/``DepthConcat``: the axis comes from ``axis`` or, without it, from ``order``
  (``NCHW`` -> 1, ``NHWC`` -> 3, whatever the rank); ``add_axis`` inserts a new axis of
  size len(inputs); every input shape must be known; ``split_info`` is int32 [len(inputs)].
* ``Split``/``DepthSplit``: outputs only from the ``split`` argument or an equal split;
  with a ``split`` input blob the sizes are data, so the outputs stay unknown.
* ``PadImage``: H and W grown by the pads (``pads``, ``pad`` or ``pad_t/l/b/r``).
* ``DotProductWithPadding``: [X.dims(0)].
* Gloo-style collectives (``Allreduce``, ``Broadcast``, ``Reduce``, ``ReduceScatter``):
  each in-place output keeps its tensor's shape (they have side effects, so no kernel runs
  during inference, and the blobs would otherwise lose their shapes).
* Ops whose output sizes are data (``Slice``, ``Tile``, ``Unique``, ``GatherRanges``,
  ``GatherRangesToDense``, ``AddPadding``, ``SparseToDense``, ...): Caffe2's static rules from
  arguments and input shapes, or unknown where Caffe2 could not tell (sizes given as blobs,
  ``Unique`` of more than one element).  Running the kernel on placeholder zeros would
  report the zeros' answer instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dpgraph.errors import ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops._common import FLOAT, INT32, INT64, ShapeResult

Shape = tuple[int, ...]
ShapeFunction = Callable[[Any, Sequence[Any], Sequence[Any]], ShapeResult]

#: ``order`` -> Caffe2's GetDimFromOrderString: the channel axis of a 4-D image tensor.
_ORDER_AXIS = {"NCHW": 1, "NHWC": 3}


def _unknown(op: Any) -> ShapeResult:
    return [None] * len(op.output)


def _canonical(op: Any, axis: int, ndim: int) -> int:
    """Caffe2's canonical_axis_index_: a negative axis counts from the end; must fit."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op.type}: axis {axis} is out of range for rank {ndim}")
    return axis % ndim


def _order_axis(op: Any, args: dict[str, Any]) -> int:
    """``axis`` if given, else the channel axis named by ``order`` (default NCHW)."""
    if "axis" in args:
        return int(args["axis"])
    order = str(args.get("order", "NCHW"))
    if order not in _ORDER_AXIS:
        raise ShapeError(f"{op.type}: unsupported order {order!r}; use NCHW or NHWC")
    return _ORDER_AXIS[order]


# --- Concat / Split --------------------------------------------------------------------------
def _concat_dim(op: Any, shape: Shape, first: Shape, axis: int) -> int:
    """The size along ``axis`` of one input; an input one rank short (concatenating on the
    last axis) counts as 1.  Every other dimension must match the first input's."""
    if len(shape) == len(first) - 1 and axis == len(first) - 1:
        padded = (*shape, 1)
    elif len(shape) == len(first):
        padded = shape
    else:
        raise ShapeError(f"{op.type}: inputs of rank {len(first)} and {len(shape)} cannot be "
                         f"concatenated on axis {axis}")
    if any(a != b for i, (a, b) in enumerate(zip(first, padded)) if i != axis):
        raise ShapeError(f"{op.type}: shapes {first} and {shape} differ outside axis {axis}")
    return int(padded[axis])


def concat_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """[concatenated (input 0's type), split_info int32 [len(inputs)]]."""
    if not shapes or any(s is None for s in shapes):
        return _unknown(op)
    args = arguments_dict(op.arg)
    add_axis = bool(int(args.get("add_axis", 0)))
    first = tuple(int(d) for d in shapes[0])
    axis = _canonical(op, _order_axis(op, args), len(first) + int(add_axis))
    out = list(first)
    if add_axis:
        if any(tuple(s) != first for s in shapes):
            raise ShapeError(f"{op.type}: with add_axis=1 every input must have shape {first}")
        out.insert(axis, len(shapes))
    else:
        out[axis] = sum(_concat_dim(op, tuple(s), first, axis) for s in shapes)
    result: ShapeResult = [(tuple(out), types[0] or FLOAT), ((len(shapes),), INT32)]
    return result[:len(op.output)]


def _split_sizes(op: Any, args: dict[str, Any], total: int) -> list[int] | None:
    """The output sizes along the axis, or None when they are not known statically."""
    outputs = len(op.output)
    sizes = [int(v) for v in args.get("split", [])]
    if not sizes:
        return [total // outputs] * outputs if total % outputs == 0 else None
    return sizes if len(sizes) == outputs else None


def split_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """Each output: the input with the split axis resized (or removed with add_axis)."""
    if len(op.input) != 1 or not shapes or shapes[0] is None or not op.output:
        return _unknown(op)
    args = arguments_dict(op.arg)
    x = tuple(int(d) for d in shapes[0])
    axis = _canonical(op, _order_axis(op, args), len(x))
    add_axis = bool(int(args.get("add_axis", 0)))
    sizes = _split_sizes(op, args, x[axis])
    if sizes is None or (len(sizes) if add_axis else sum(sizes)) != x[axis]:
        return _unknown(op)
    if add_axis:
        return [(x[:axis] + x[axis + 1:], types[0] or FLOAT)] * len(sizes)
    return [(x[:axis] + (size,) + x[axis + 1:], types[0] or FLOAT) for size in sizes]


# --- gradients, learning rate, padding, distances --------------------------------------------
def _image_pads(op: Any, args: dict[str, Any]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads``, else ``pad_t/l/b/r`` defaulting to ``pad``."""
    if "pads" in args:
        pads = [int(v) for v in args["pads"]]
        if len(pads) != 4:
            raise ShapeError(f"{op.type}: pads must have 4 entries [t, l, b, r], got {pads}")
        return pads[0], pads[1], pads[2], pads[3]
    pad = int(args.get("pad", 0))
    return tuple(int(args.get(name, pad)) for name in  # type: ignore[return-value]
                 ("pad_t", "pad_l", "pad_b", "pad_r"))


def pad_image_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """X with H grown by top + bottom and W by left + right."""
    x = shapes[0]
    if x is None or len(x) != 4:
        return _unknown(op)
    args = arguments_dict(op.arg)
    top, left, bottom, right = _image_pads(op, args)
    h_axis = 1 if str(args.get("order", "NCHW")) == "NHWC" else 2
    out = list(x)
    out[h_axis] += top + bottom
    out[h_axis + 1] += left + right
    return [(tuple(out), types[0] or FLOAT)]


def first_dim_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """Caffe2's IdenticalTypeAndShapeOfInputDim(0, 0): [X.dims(0)] (1 for a scalar)."""
    x = shapes[0]
    if x is None:
        return _unknown(op)
    return [((int(x[0]) if len(x) else 1,), types[0] or FLOAT)]


# --- ops whose output sizes are data: Caffe2's static rules ----------------------------------
def _known(shapes: Sequence[Any], *indices: int) -> bool:
    return all(i < len(shapes) and shapes[i] is not None for i in indices)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def slice_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """From the ``starts``/``ends`` arguments (a negative index counts from dim + 1); with
    starts/ends given as blobs the output is unknown."""
    if len(op.input) > 1 or not _known(shapes, 0):
        return _unknown(op)
    args = arguments_dict(op.arg)
    starts = [int(v) for v in args.get("starts", [])]
    ends = [int(v) for v in args.get("ends", [])]
    out = []
    for i, dim in enumerate(int(d) for d in shapes[0]):
        if i >= len(starts) or dim <= 0:
            out.append(dim if i >= len(starts) else 0)
            continue
        start = starts[i] + dim + 1 if starts[i] < 0 else starts[i]
        end = ends[i] + dim + 1 if ends[i] < 0 else ends[i]
        out.append(end - start)
    return [(tuple(out), types[0] or FLOAT)]


def tile_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """``axis`` (0) multiplied by ``tiles`` (1); unknown when tiles/axis come as blobs."""
    if len(op.input) > 1 or not _known(shapes, 0):
        return _unknown(op)
    args = arguments_dict(op.arg)
    out = [int(d) for d in shapes[0]]
    axis = _canonical(op, int(args.get("axis", 0)), len(out))
    out[axis] *= int(args.get("tiles", 1))
    return [(tuple(out), types[0] or FLOAT)]


def unique_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """A 1-D input of at most one element is its own unique set; longer ones are unknown.
    The remapping (2nd output) is int32 shaped like the input."""
    x = shapes[0]
    if x is None:
        return _unknown(op)
    if len(x) != 1:
        raise ShapeError(f"{op.type}: the input must be 1-D, got shape {tuple(x)}")
    result: ShapeResult = [((int(x[0]),), types[0]) if int(x[0]) <= 1 else None]
    if len(op.output) > 1:
        result.append((tuple(x), INT32))
    return result


def lengths_pad_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """[len(lengths) * target_length, *data.shape[1:]]."""
    if not _known(shapes, 0, 1):
        return _unknown(op)
    target = int(arguments_dict(op.arg).get("target_length", -1))
    if target < 1:
        raise ShapeError(f"{op.type}: target_length must be >= 1, got {target}")
    return [((int(shapes[1][0]) * target, *shapes[0][1:]), types[0] or FLOAT)]


def lengths_to_ranges_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                            ) -> ShapeResult:
    """The lengths' shape plus a trailing 2 (start, length), of the lengths' type."""
    if not _known(shapes, 0):
        return _unknown(op)
    return [((*shapes[0], 2), types[0] or INT32)]


def lengths_to_offsets_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                             ) -> ShapeResult:
    """The lengths' shape, one longer with ``include_last_offset``."""
    if not _known(shapes, 0) or not shapes[0]:
        return _unknown(op)
    extra = int(bool(int(arguments_dict(op.arg).get("include_last_offset", 0))))
    return [((int(shapes[0][0]) + extra, *shapes[0][1:]), types[0] or INT32)]


def shape_op_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """int64 [rank] (or [len(axes)])."""
    axes = arguments_dict(op.arg).get("axes", [])
    if axes:
        return [((len(axes),), INT64)]
    return _unknown(op) if not _known(shapes, 0) else [((len(shapes[0]),), INT64)]


def gather_ranges_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """Caffe2's bound: [numel(DATA)] of DATA's type and [len(RANGES)] of RANGES' type."""
    if not _known(shapes, 0, 1):
        return _unknown(op)
    return [((_numel(shapes[0]),), types[0] or FLOAT),
            ((int(shapes[1][0]),), types[1] or INT32)][:len(op.output)]


def gather_ranges_to_dense_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                                 ) -> ShapeResult:
    """Output i: [len(RANGES), lengths[i]] of DATA's type."""
    if not _known(shapes, 0, 1):
        return _unknown(op)
    lengths = [int(v) for v in arguments_dict(op.arg).get("lengths", [])]
    batch = int(shapes[1][0])
    return [((batch, length), types[0] or FLOAT) for length in lengths][:len(op.output)]


def add_padding_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """[N + (padding_width + end_padding_width) * len(lengths), ...] and int32
    [len(lengths)] (one padded range without lengths)."""
    if not shapes or any(s is None for s in shapes) or not shapes[0]:
        return _unknown(op)
    args = arguments_dict(op.arg)
    width = int(args.get("padding_width", 1))
    end_width = int(args.get("end_padding_width", width))
    ranges = int(shapes[1][0]) if len(shapes) > 1 else 1
    out = (int(shapes[0][0]) + (width + end_width) * ranges, *shapes[0][1:])
    return [(out, types[0] or FLOAT), ((ranges,), INT32)][:len(op.output)]


def batch_one_hot_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]) -> ShapeResult:
    """[N, len(values)] of the data's type."""
    if not _known(shapes, 0, 2):
        return _unknown(op)
    return [((int(shapes[0][0]), int(shapes[2][0])), types[0] or FLOAT)]


def batch_bucket_one_hot_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                               ) -> ShapeResult:
    """[N, len(lengths) + len(boundaries)] of the data's type."""
    if not _known(shapes, 0, 1, 2):
        return _unknown(op)
    width = int(shapes[1][0]) + int(shapes[2][0])
    return [((int(shapes[0][0]), width), types[0] or FLOAT)]


def sparse_to_dense_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                          ) -> ShapeResult:
    """[len(data_to_infer_dim), *values.shape[1:]] of the values' type; unknown without the
    3rd input (the first dim is then the largest index + 1: data)."""
    if len(op.input) < 3 or not _known(shapes, 1, 2):
        return _unknown(op)
    return [((int(shapes[2][0]), *shapes[1][1:]), types[1] or FLOAT)]


def after_common_world_shape(op: Any, shapes: Sequence[Any], types: Sequence[Any]
                             ) -> ShapeResult:
    """[common_world, X1, X2, ...] -> [Y1, Y2, ...] in place: Yi like Xi.  (Caffe2's schema
    copied input 0, the common world, which has no shape.)"""
    return [None if shape is None else (tuple(shape), types[i + 1] or FLOAT)
            for i, shape in enumerate(shapes[1:len(op.output) + 1])]


# --- attachment ------------------------------------------------------------------------------
#: Ops whose module registered no shape function.
ADDED: dict[str, ShapeFunction] = {
    "Split": split_shape, "DepthSplit": split_shape,
    "PadImage": pad_image_shape,
    "DotProductWithPadding": first_dim_shape,
    "Slice": slice_shape, "Tile": tile_shape, "Unique": unique_shape,
    "LengthsPad": lengths_pad_shape, "LengthsToRanges": lengths_to_ranges_shape,
    "LengthsToOffsets": lengths_to_offsets_shape, "Shape": shape_op_shape,
    "GatherRanges": gather_ranges_shape, "GatherRangesToDense": gather_ranges_to_dense_shape,
    "AddPadding": add_padding_shape, "BatchOneHot": batch_one_hot_shape,
    "BatchBucketOneHot": batch_bucket_one_hot_shape, "SparseToDense": sparse_to_dense_shape,
    "Allreduce": after_common_world_shape, "Broadcast": after_common_world_shape,
    "Reduce": after_common_world_shape, "ReduceScatter": after_common_world_shape,
}

#: Ops whose module's shape function disagreed with Caffe2's (see the module docstring).
REPLACED: dict[str, ShapeFunction] = {
    "Concat": concat_shape, "DepthConcat": concat_shape,  # order NHWC means axis 3
}


def attach(functions: dict[str, ShapeFunction], replace: bool) -> list[str]:
    """Set each named op's shape function (only where it has none unless ``replace``);
    returns the names not registered (skipped: a missing op must not break ``import
    dpgraph``; the tests require the list to be empty)."""
    missing = []
    for op_type, function in functions.items():
        schema = OPERATORS.get(op_type)
        if schema is None:
            missing.append(op_type)
        elif replace or schema.shape_fn is None:
            schema.shape_fn = function
    return missing


#: Named ops that no family registered (should stay empty).
UNREGISTERED = attach(ADDED, replace=False) + attach(REPLACED, replace=True)
