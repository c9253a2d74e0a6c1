"""Device copies: Copy, CopyGPUToCPU, CopyCPUToGPU, CopyFromCPUInput, EnsureCPUOutput,
CopyOnDeviceLike.

These ops are ``cross_device``: they may read a blob on any device.  Their output lives on
the op's device, except CopyGPUToCPU and EnsureCPUOutput whose output lives on the CPU and
CopyOnDeviceLike whose output lives where its second input does
(declared through ``schema.extra["output_placement"]``, read by the runtime).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import is_array, to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

DeviceKey = tuple[int, int]
#: Key of ``OpSchema.extra`` the runtime reads: ``fn(op_key, input_keys, args) -> [key, ...]``
#: gives the device of each output (default: the op's own device).
OUTPUT_PLACEMENT = "output_placement"
CPU_KEY: DeviceKey = (0, 0)


def _same_shape(op: Any, in_shapes: list[Any], in_types: list[Any]) -> list[Any]:
    return [None if in_shapes[0] is None else (in_shapes[0], in_types[0])]


def _on_op_device(ctx: OpContext, value: Any) -> Any:
    """A new copy of ``value`` on the op's device (host numpy or the current GPU)."""
    if not is_array(value):
        return value  # strings and opaque objects are shared
    if ctx.xp is np:
        return np.array(to_host(value), copy=True)
    return ctx.xp.array(value, copy=True)


def _on_host(value: Any) -> Any:
    if not is_array(value):
        return value
    return np.array(to_host(value), copy=True)


@register_op("Copy", inputs=1, outputs=1, inplace=[(0, 0)], cross_device=True,
             shape=_same_shape)
def copy(ctx: OpContext) -> Outputs:
    """Y = X, copied onto the op's device."""
    return (_on_op_device(ctx, ctx.inputs[0]),)


@register_op("CopyCPUToGPU", inputs=1, outputs=1, cross_device=True, shape=_same_shape)
def copy_cpu_to_gpu(ctx: OpContext) -> Outputs:
    """Copy a CPU blob onto the op's GPU."""
    return (_on_op_device(ctx, ctx.inputs[0]),)


@register_op("CopyGPUToCPU", inputs=1, outputs=1, cross_device=True, shape=_same_shape)
def copy_gpu_to_cpu(ctx: OpContext) -> Outputs:
    """Copy a GPU blob to the CPU (the op itself carries the GPU device option)."""
    return (_on_host(ctx.inputs[0]),)


@register_op("CopyFromCPUInput", inputs=1, outputs=1, cross_device=True, shape=_same_shape)
def copy_from_cpu_input(ctx: OpContext) -> Outputs:
    """Copy a CPU input onto the op's device (identity on the CPU)."""
    return (_on_op_device(ctx, ctx.inputs[0]),)


@register_op("EnsureCPUOutput", inputs=1, outputs=1, inplace=[(0, 0)], cross_device=True,
             shape=_same_shape)
def ensure_cpu_output(ctx: OpContext) -> Outputs:
    """The input, on the CPU (identity for CPU inputs)."""
    return (_on_host(ctx.inputs[0]),)


@register_op("CopyOnDeviceLike", inputs=2, outputs=1, cross_device=True, shape=_same_shape)
def copy_on_device_like(ctx: OpContext) -> Outputs:
    """Copy X onto the device where the second input lives."""
    value, like = ctx.inputs
    if isinstance(like, np.ndarray) or not is_array(like):
        return (_on_host(value),)
    with like.device:
        return (sys.modules["cupy"].array(value, copy=True),)


def _outputs_on_cpu(op_key: DeviceKey, input_keys: Sequence[Any], args: Any) -> list[DeviceKey]:
    return [CPU_KEY]


def _output_like_input_1(op_key: DeviceKey, input_keys: Sequence[Any], args: Any
                         ) -> list[DeviceKey]:
    return [input_keys[1] if input_keys[1] is not None else op_key]


for _type in ("CopyGPUToCPU", "EnsureCPUOutput"):
    OPERATORS.lookup(_type).extra[OUTPUT_PLACEMENT] = _outputs_on_cpu
OPERATORS.lookup("CopyOnDeviceLike").extra[OUTPUT_PLACEMENT] = _output_like_input_1


def _copy_like(op_type: str, g: GradientBuilder) -> None:
    if g.go_is_sparse(0):
        g.add(op_type, [g.GO_I(0)], [g.GI_I(0)])
        g.add(op_type, [g.GO_V(0)], [g.GI_V(0)])
    else:
        g.add(op_type, [g.GO(0)], [g.GI(0)])


@register_gradient("Copy")
def copy_gradient(g: GradientBuilder) -> None:
    _copy_like("Copy", g)


@register_gradient("CopyGPUToCPU")
def copy_gpu_to_cpu_gradient(g: GradientBuilder) -> None:
    _copy_like("CopyCPUToGPU", g)


@register_gradient("CopyCPUToGPU")
def copy_cpu_to_gpu_gradient(g: GradientBuilder) -> None:
    _copy_like("CopyGPUToCPU", g)
