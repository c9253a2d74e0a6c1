"""Gradient buckets: pack many dense blobs into one contiguous buffer and back.

dpgraph's own ops (not Caffe2's), emitted by the bucketing pass of ``Parallelize(...,
gradient_bucket_mb=...)`` so that one collective moves many gradients::

    GradientBucketPack([gpu_0/fc_w_grad, gpu_0/fc_b_grad], [gpu_0/grad_bucket_0])
    NCCLAllreduce / Sum / Allreduce on gpu_*/grad_bucket_0
    GradientBucketUnpack([gpu_0/grad_bucket_0, gpu_0/fc_w_grad, gpu_0/fc_b_grad],
                         [gpu_0/fc_w_grad, gpu_0/fc_b_grad])

The bucket is the raveled inputs, concatenated in input order (one copy, into the bucket's
array of the previous run when the runtime allows it, so no page is faulted in again; no copy
at all when every input already is its slice of that array, as the unpacked views are: the
collective then reduces those gradients' memory in place, so they hold the reduced values as
soon as it ran, as they would after the unpack).
Unpacking makes each output a *view* of the bucket with the shape of the matching template
input, so no copy is made (``copy=1`` copies instead).  Every element is moved, never combined, so a
reduction over buckets gives bitwise the values of the same reduction blob by blob.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops.context import OpContext, Outputs

_MAX = 4096
_UNPACK_INPLACE = [(i + 1, i) for i in range(_MAX)]


def _pack_shape(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    if any(s is None for s in in_shapes) or not in_types:
        return [None]
    total = 0
    for shape in in_shapes:
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count
    return [((total,), in_types[0])]


def _unpack_shape(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    return [None if s is None else (s, t) for s, t in zip(in_shapes[1:], in_types[1:])]


def _check_dtypes(ctx: OpContext, values: list[Any], first: int) -> None:
    dtype = values[0].dtype
    for index, value in enumerate(values):
        if getattr(value, "dtype", None) != dtype:
            raise ctx.fail(
                f"every gradient in a bucket must have one dtype; {ctx.input_name(index + first)!r}"
                f" is {getattr(value, 'dtype', type(value).__name__)}, "
                f"{ctx.input_name(first)!r} is {dtype}. Rebuild with Parallelize(...) so the "
                "bucketing pass groups gradients by dtype, or gradient_bucket_mb=None.")


@register_op("GradientBucketPack", inputs=(1, _MAX), outputs=1, shape=_pack_shape)
def gradient_bucket_pack(ctx: OpContext) -> Outputs:
    """Y = concat(ravel(X_0), ravel(X_1), ...): one contiguous 1-D buffer."""
    values = list(ctx.inputs)
    for index, value in enumerate(values):
        if not hasattr(value, "dtype"):
            raise ctx.fail(f"input {ctx.input_name(index)!r} is a {type(value).__name__}, not "
                           "a dense tensor; sparse gradients cannot go into a bucket.")
    _check_dtypes(ctx, values, 0)
    if ctx.xp is not np or not all(type(v) is np.ndarray for v in values):
        return (ctx.xp.concatenate([v.reshape(-1) for v in values]),)
    total = sum(int(v.size) for v in values)
    previous = ctx.prev_output(0)
    if _packed_in(previous, values, total):
        _share(previous)
        return (previous,)  # every gradient already is its slice of the bucket: no copy
    del previous  # the runtime's check counts the references to the array
    out = reusable_output(ctx, 0, (total,), values[0].dtype)
    if out is None:
        out = np.empty(total, values[0].dtype)
    offset = 0
    for value in values:
        np.copyto(out[offset:offset + value.size], value.reshape(-1))
        offset += value.size
    return (out,)


def reusable_output(ctx: OpContext, index: int, shape: tuple[int, ...],
                    dtype: Any) -> np.ndarray | None:
    """Output ``index``'s array from the previous run when the runtime lets the kernel
    write this run's value into it (``RuntimeOpContext.reusable_output``: nothing else
    references it), else None.  Call it only after every check passed, holding no reference
    to that array (the runtime counts them)."""
    reuse = getattr(ctx, "reusable_output", None)
    return None if reuse is None else reuse(index, shape, np.dtype(dtype))


#: Buckets a GradientBucketPack returned without copying (their gradients are views of
#: them): ``id -> weakref``.
_SHARED: dict[int, weakref.ref[np.ndarray]] = {}


def _share(bucket: np.ndarray) -> None:
    key = id(bucket)

    def forget(_: object) -> None:
        _SHARED.pop(key, None)

    _SHARED[key] = weakref.ref(bucket, forget)


def shared_bucket(value: Any) -> bool:
    """Whether ``value`` is a bucket whose gradients are views of it (packed without a
    copy): the synchronisation may then write the reduced values into it in place, as the
    in-place collective on it already does."""
    ref = _SHARED.get(id(value))
    return ref is not None and ref() is value


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _packed_in(bucket: Any, values: list[np.ndarray], total: int) -> bool:
    """Whether ``bucket`` (the output's previous value) is a 1-D array of ``total`` values
    of which every input is, in order, the contiguous slice at its own offset: then the
    concatenation is ``bucket`` itself (the unpacked views came back unchanged)."""
    if type(bucket) is not np.ndarray or bucket.ndim != 1 or bucket.size != total or \
            bucket.dtype != values[0].dtype or not bucket.flags.c_contiguous:
        return False
    start, itemsize = _address(bucket), bucket.itemsize
    offset = 0
    for value in values:
        if value.size and (not value.flags.c_contiguous or
                           _address(value) != start + offset * itemsize):
            return False
        offset += value.size
    return True


@register_op("GradientBucketUnpack", inputs=(2, _MAX + 1), outputs=(1, _MAX),
             inplace=_UNPACK_INPLACE, shape=_unpack_shape)
def gradient_bucket_unpack(ctx: OpContext) -> Outputs:
    """Output k = the k-th slice of the bucket (input 0), shaped like input k + 1: a view of
    the bucket (``copy=0``, default) or a fresh array (``copy=1``)."""
    bucket = ctx.inputs[0]
    templates = ctx.inputs[1:]
    if ctx.num_outputs != len(templates):
        raise ctx.fail("GradientBucketUnpack needs one output per template input.")
    if getattr(bucket, "ndim", 0) != 1:
        raise ctx.fail(f"the bucket {ctx.input_name(0)!r} must be 1-D, got shape "
                       f"{list(getattr(bucket, 'shape', []))}.")
    _check_dtypes(ctx, [bucket, *templates], 0)
    total = sum(int(t.size) for t in templates)
    if total != bucket.shape[0]:
        raise ctx.fail(
            f"the bucket {ctx.input_name(0)!r} holds {bucket.shape[0]} values but its "
            f"gradients need {total}; a gradient changed shape since it was packed.")
    copy = bool(ctx.int_arg("copy", 0))
    outputs, offset = [], 0
    for template in templates:
        piece = bucket[offset:offset + template.size].reshape(template.shape)
        outputs.append(piece.copy() if copy else piece)
        offset += template.size
    return tuple(outputs)
