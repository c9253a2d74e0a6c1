"""Ops the blob-monitoring net modifiers use: ``AccumulateHistogram`` (this run's and the
accumulated bucket counts) and ``NormalizeL1`` (x / Σ|x| along an axis)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import same_as_input, to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.proto import caffe2_pb2


def _hist_shape(op: Any, shapes: list, types: list) -> list:
    buckets = next((a.i for a in op.arg if a.name == "num_buckets"), 1)
    return [((buckets + 2,), caffe2_pb2.TensorProto.INT64)] * 2


@register_op("AccumulateHistogram", inputs=1, outputs=2, shape=_hist_shape)
def accumulate_histogram(ctx: OpContext) -> Outputs:
    """X -> [cur_hist, acc_hist] (int64, num_buckets + 2): bucket 0 counts x < lower_bound,
    the last x >= upper_bound, bucket k the k-th of num_buckets equal segments between;
    acc_hist adds this run's counts to the previous run's."""
    lower, upper = ctx.float_arg("lower_bound", 0.0), ctx.float_arg("upper_bound", 1.0)
    buckets = ctx.int_arg("num_buckets", 1)
    if buckets <= 0 or not upper > lower:
        raise ctx.fail(f"need num_buckets > 0 and upper_bound > lower_bound, got "
                       f"{buckets}, [{lower}, {upper})")
    x = np.asarray(to_host(ctx.inputs[0]), dtype=np.float32).reshape(-1)
    segment = np.float32((upper - lower) / buckets)
    inner = ((x - np.float32(lower)) / segment + 1).astype(np.int64)
    ids = np.where(x < lower, 0, np.where(x >= upper, buckets + 1,
                                          np.clip(inner, 1, buckets)))
    current = np.bincount(ids, minlength=buckets + 2).astype(np.int64)
    previous = ctx.prev_output(1)
    accumulated = current.copy()
    if isinstance(previous, np.ndarray) and previous.shape == current.shape:
        accumulated += previous.astype(np.int64)
    return current, accumulated


@register_op("NormalizeL1", inputs=1, outputs=1, shape=same_as_input())
def normalize_l1(ctx: OpContext) -> Outputs:
    """X -> X / Σ|X| along ``axis`` (default the last); all-zero slices stay zero."""
    x = ctx.xp.asarray(ctx.inputs[0])
    axis = ctx.int_arg("axis", -1)
    if x.ndim and not -x.ndim <= axis < x.ndim:
        raise ctx.fail(f"axis {axis} is out of range for an input of {x.ndim} dimensions")
    norm = ctx.xp.abs(x).sum(axis=axis if x.ndim else None, keepdims=True)
    safe = ctx.xp.where(norm > 0, norm, 1)
    return ((x / safe).astype(x.dtype, copy=False),)
