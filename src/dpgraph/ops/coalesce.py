"""``AsyncNetBarrier`` and ``UnsafeCoalesce`` (Caffe2's async_net_barrier_op and
unsafe_coalesce).

* ``AsyncNetBarrier`` [X_0..X_n-1] -> [X_0..X_n-1]: a no-op that only orders scheduling; its
  inputs may live on different devices (``cross_device``).  No gradient may flow through it.
* ``UnsafeCoalesce`` [X_0..X_n-1] -> [X_0..X_n-1, coalesced]: copies the float32 inputs, in
  order and flattened, into one new buffer and makes every output ``i`` a view of its slice
  (same shape as ``X_i``), so ops on the coalesced blob act on all of them at once, and
  feeding any of these blobs an array of its shape and dtype writes into the shared buffer.
"""

from __future__ import annotations

import numpy as np

from dpgraph.errors import GradientError
from dpgraph.ir.arrays import mark_shared_storage
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

#: UnsafeCoalesce allows input i in place on output i only; the schema lists the pairs.
_MAX_COALESCED = 4096


def _identical_shapes(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    return [None if s is None else (tuple(s), t or caffe2_pb2.TensorProto.FLOAT)
            for s, t in zip(shapes, types)]


@register_op("AsyncNetBarrier", inputs=(1, None), outputs=(1, None), inplace="any",
             side_effects=True, cross_device=True, shape=_identical_shapes)
def async_net_barrier(ctx: OpContext) -> Outputs:
    """Pass every input through unchanged (output i is input i)."""
    if ctx.num_outputs != ctx.num_inputs:
        raise ctx.fail(f"needs as many outputs as inputs, got {ctx.num_inputs} inputs and "
                       f"{ctx.num_outputs} outputs")
    return tuple(x if ctx.input_name(i) == ctx.output_name(i) else x.copy()
                 for i, x in enumerate(ctx.inputs))


@register_gradient("AsyncNetBarrier")
def _async_net_barrier_grad(g: GradientBuilder) -> None:
    if any(g.has_go(i) for i in range(len(g.op.output))):
        raise GradientError(f"AsyncNetBarrier {list(g.op.input)} should not have a gradient "
                            "(Caffe2's SHOULD_NOT_DO_GRADIENT); stop the gradient before it")


def _coalesce_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    out = [None if s is None else (tuple(s), caffe2_pb2.TensorProto.FLOAT) for s in shapes]
    total = None if any(s is None for s in shapes) else sum(int(np.prod(s)) for s in shapes)
    return out + [None if total is None else ((total,), caffe2_pb2.TensorProto.FLOAT)]


@register_op("UnsafeCoalesce", inputs=(1, None), outputs=(2, None),
             inplace=[(i, i) for i in range(_MAX_COALESCED)], shape=_coalesce_shape)
def unsafe_coalesce(ctx: OpContext) -> Outputs:
    """[X_0..X_n-1] -> [views of the coalesced buffer shaped like X_i..., the buffer]."""
    if ctx.num_outputs != ctx.num_inputs + 1:
        raise ctx.fail(f"needs one output per input plus the coalesced blob, got "
                       f"{ctx.num_inputs} inputs and {ctx.num_outputs} outputs")
    for i, x in enumerate(ctx.inputs):
        if getattr(x, "dtype", None) != np.float32:
            raise ctx.fail(f"must only coalesce float32 tensors; input {i} "
                           f"({ctx.input_name(i)}) is {getattr(x, 'dtype', type(x).__name__)}")
    xp = ctx.xp
    sizes = [int(x.size) for x in ctx.inputs]
    coalesced = xp.empty(sum(sizes), dtype=np.float32)
    views, offset = [], 0
    for x, size in zip(ctx.inputs, sizes):
        coalesced[offset:offset + size] = x.reshape(-1)
        views.append(coalesced[offset:offset + size].reshape(x.shape))
        offset += size
    mark_shared_storage(coalesced, *views)
    return (*views, coalesced)
