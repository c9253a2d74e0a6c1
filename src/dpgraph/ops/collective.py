"""One-process collectives across local devices: NCCLAllreduce, NCCLBroadcast, NCCLReduce,
NCCLAllGather.

Inputs are the per-device copies (input ``k`` lives on device ``k``); output ``k`` is written
on the device of input ``k`` (NCCLReduce: on the root's device).  These ops are
``cross_device`` and ``collective`` and have side effects.  Reductions add the inputs in
input order, so the result does not depend on the executor.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.ir.arrays import is_cupy_array, to_host
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.device_copy import OUTPUT_PLACEMENT

DeviceKey = tuple[int, int]
_MAX = 1024


def _like(value: Any, like: Any) -> Any:
    """A new copy of ``value`` on the device where ``like`` lives."""
    if isinstance(like, np.ndarray):
        return np.array(to_host(value), copy=True)
    cupy = sys.modules["cupy"]
    with like.device:
        return cupy.array(value, copy=True)


def _check_same(ctx: OpContext) -> None:
    first = ctx.inputs[0]
    for name, value in zip(ctx.op.input, ctx.inputs):
        if getattr(value, "shape", None) != first.shape or value.dtype != first.dtype:
            raise ctx.fail(
                f"every input must have the shape and dtype of {ctx.input_name(0)!r} "
                f"({list(first.shape)} {first.dtype}); {name!r} is "
                f"{list(getattr(value, 'shape', []))} {getattr(value, 'dtype', '?')}.")


def _root(ctx: OpContext) -> int:
    root = ctx.int_arg("root", 0)
    if not 0 <= root < ctx.num_inputs:
        raise ctx.fail(f"root {root} is out of range for {ctx.num_inputs} inputs.")
    return root


def _sum(ctx: OpContext) -> Any:
    _check_same(ctx)
    total = _like(ctx.inputs[0], ctx.inputs[0])
    for value in ctx.inputs[1:]:
        total += _like(value, total) if not isinstance(total, np.ndarray) else value
    return total


def _same_as_inputs(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    return [None if s is None else (s, t) for s, t in zip(in_shapes, in_types)]


@register_op("NCCLAllreduce", inputs=(1, _MAX), outputs=(1, _MAX), inplace="any",
             side_effects=True, cross_device=True, collective=True, shape=_same_as_inputs)
def nccl_allreduce(ctx: OpContext) -> Outputs:
    """Every output k = sum of all inputs, on the device of input k."""
    if ctx.num_outputs != ctx.num_inputs:
        raise ctx.fail("NCCLAllreduce needs one output per input.")
    total = _sum(ctx)
    return tuple(_like(total, x) for x in ctx.inputs)


@register_op("NCCLBroadcast", inputs=(1, _MAX), outputs=(1, _MAX), inplace="any",
             side_effects=True, cross_device=True, collective=True, shape=_same_as_inputs)
def nccl_broadcast(ctx: OpContext) -> Outputs:
    """Every output k = input[root] (arg root, default 0), on the device of input k."""
    if ctx.num_outputs != ctx.num_inputs:
        raise ctx.fail("NCCLBroadcast needs one output per input.")
    _check_same(ctx)
    source = ctx.inputs[_root(ctx)]
    return tuple(_like(source, x) for x in ctx.inputs)


@register_op("NCCLReduce", inputs=(1, _MAX), outputs=1, inplace=[(0, 0)],
             side_effects=True, cross_device=True, collective=True)
def nccl_reduce(ctx: OpContext) -> Outputs:
    """The sum of all inputs, on the device of input[root]."""
    total = _sum(ctx)
    return (_like(total, ctx.inputs[_root(ctx)]),)


@register_op("NCCLAllGather", inputs=(1, _MAX), outputs=(1, _MAX), side_effects=True,
             cross_device=True, collective=True)
def nccl_all_gather(ctx: OpContext) -> Outputs:
    """Every output k = the inputs stacked along a new leading axis, on input k's device."""
    if ctx.num_outputs != ctx.num_inputs:
        raise ctx.fail("NCCLAllGather needs one output per input.")
    _check_same(ctx)
    first = ctx.inputs[0]
    parts = [_like(x, first) for x in ctx.inputs]
    xp = sys.modules["cupy"] if is_cupy_array(first) else np
    gathered = xp.stack(parts)
    return tuple(_like(gathered, x) for x in ctx.inputs)


def _reduce_shape(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    return [None if in_shapes[0] is None else (in_shapes[0], in_types[0])]


def _gather_shape(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    if in_shapes[0] is None:
        return [None] * len(op.output)
    return [((len(in_shapes), *in_shapes[0]), in_types[0])] * len(op.output)


def _per_input(op_key: DeviceKey, input_keys: Sequence[Any], args: Any) -> list[DeviceKey]:
    return [k if k is not None else op_key for k in input_keys]


def _at_root(op_key: DeviceKey, input_keys: Sequence[Any], args: Any) -> list[DeviceKey]:
    root = int(args.get("root", 0))
    key = input_keys[root] if 0 <= root < len(input_keys) else None
    return [key if key is not None else op_key]


OPERATORS.lookup("NCCLReduce").shape_fn = _reduce_shape
OPERATORS.lookup("NCCLAllGather").shape_fn = _gather_shape
for _type in ("NCCLAllreduce", "NCCLBroadcast", "NCCLAllGather"):
    OPERATORS.lookup(_type).extra[OUTPUT_PLACEMENT] = _per_input
OPERATORS.lookup("NCCLReduce").extra[OUTPUT_PLACEMENT] = _at_root
