"""Single-host gradient all-reduce and master-to-replica broadcast.

Before (2 CPU devices, one gradient)::

    cpu_0/fc_w_grad, cpu_1/fc_w_grad      (produced by the backward pass)

After::

    Sum([cpu_0/fc_w_grad, cpu_1/fc_w_grad]) -> cpu_0/fc_w_grad      (on cpu 0)
    Copy(cpu_0/fc_w_grad) -> cpu_1/fc_w_grad                         (on cpu 0)

On GPUs the sum follows Caffe2's pairwise trees for 4, 8 and 16 devices (a flat Sum named
``dpm`` otherwise), with a Copy to the reducing device where there is no peer access;
``use_nccl`` emits one ``NCCLAllreduce`` per gradient instead.  Sparse (GradientSlice)
gradients are all-gathered with Concat and copied back to every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ParallelizeError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.device import IsGPUDeviceType
from dpgraph.parallel._emit import device_option, emit_copies, emit_op
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

CPU, IDEEP = caffe2_pb2.PROTO_CPU, caffe2_pb2.PROTO_IDEEP
#: The device options of host copies (device 0), shared: ops copy them, nobody changes them.
_HOST_OPTIONS = {CPU: device_option(CPU, 0), IDEEP: device_option(IDEEP, 0)}


class GradientSliceSyncError(ParallelizeError):
    """Sparse gradients cannot be all-reduced on CPU devices (as in Caffe2)."""


def peer_access_pattern(state: ParallelState) -> np.ndarray | None:
    """The GPU peer-access pattern the facade read when Parallelize was called (Caffe2's
    ``workspace.GetGpuPeerAccessPattern()``); ``None`` when it was not needed."""
    pattern = state.config.peer_access
    return None if pattern is None else np.asarray(pattern, dtype=bool)


def broadcast(state: ParallelState, net: Any, name: str, use_nccl: bool = False) -> None:
    """Caffe2's ``_Broadcast``: copy the master device's blob ``name`` to the others."""
    group = state.grouped[name]
    master = state.master
    blob_type = state.blob_device_type(name)
    gpu = IsGPUDeviceType(blob_type)
    if use_nccl and gpu:
        blobs = list(group.values())
        # no ``root`` argument, as in Caffe2 (the op's default root is input 0)
        emit_op(net, "NCCLBroadcast", blobs, blobs,
                device_option(state.config.device_type, master))
        return
    replicas = state.devices[1:]
    if not replicas:
        return
    outputs = [[str(group[device])] for device in replicas]
    if gpu:  # each copy on its target device
        emit_copies(net, "Copy", [group[master]], outputs,
                    device_option(state.config.device_type, replicas[0]), list(replicas))
    else:
        option = _HOST_OPTIONS[IDEEP if blob_type == IDEEP else CPU]  # (only copied from)
        emit_copies(net, "Copy", [group[master]], outputs, option)


def broadcast_computed_params(state: ParallelState) -> None:
    """Copy every computed param (e.g. SpatialBN running stats) from the first device."""
    if len(state.devices) == 1:
        return
    for name in state.computed_param_names:
        broadcast(state, state.model.net, name, state.config.use_nccl)


def sum_tree(count: int) -> list[tuple[int, ...]]:
    """Index groups of the Sum ops, in order: pairwise trees for 4/8/16, else flat."""
    if count in (4, 8, 16):
        steps: list[tuple[int, ...]] = []
        width = 1
        while width < count:
            steps.extend((j, j + width) for j in range(0, count, 2 * width))
            width *= 2
        return steps
    return [tuple(range(count))]


def _dense_gpu(state: ParallelState, net: Any, name: str, control: Any,
               pattern: np.ndarray | None) -> None:
    group = state.grouped[name]
    blobs = [group[d] for d in state.devices]
    dtype = state.config.device_type
    if state.config.use_nccl and dtype != IDEEP:
        emit_op(net, "NCCLAllreduce", blobs, blobs, device_option(dtype, state.master),
                control_input=[control] if control is not None else None)
        return
    for indices in sum_tree(len(blobs)):
        devices = [state.devices[i] for i in indices]
        inputs = [blobs[i] for i in indices]
        option = device_option(dtype, devices[0])
        for i, peer in enumerate(devices[1:], start=1):
            if pattern is not None and pattern.size and not pattern[devices[0], peer]:
                copy = f"gpu_{devices[0]}/{name}_gpu{peer}_copy"
                emit_op(net, "Copy", [inputs[i]], [copy], option)
                inputs[i] = copy
        emit_op(net, "Sum", inputs, [inputs[0]], option, name="dpm")
    broadcast(state, net, name)


def _sparse_gpu(state: ParallelState, net: Any, name: str, concatenated: set[str]) -> None:
    group = state.grouped[name]
    slices = [group[d] for d in state.devices]
    master_ns = state.namescope(state.master)
    dtype = state.config.device_type
    master_opt = device_option(dtype, state.master)
    if not any(str(g.indices) in concatenated for g in slices):
        index_concat = f"{master_ns}/{name}_index_concat"
        emit_op(net, "Concat", [g.indices for g in slices],
                [index_concat, f"{master_ns}/{name}_index_splitinfo"], master_opt,
                name="note:data_parallel_model", axis=0)
        for device, g in group.items():
            emit_op(net, "Copy", [index_concat], [g.indices], device_option(dtype, device))
            concatenated.add(str(g.indices))
    value_concat = f"{master_ns}/{name}_val_concat"
    emit_op(net, "Concat", [g.values for g in slices],
            [value_concat, f"{master_ns}/{name}_val_splitinfo"], master_opt,
            name="note:data_parallel_model", axis=0)
    for device, g in group.items():
        emit_op(net, "Copy", [value_concat], [g.values], device_option(dtype, device))


def _cpu_like(state: ParallelState, net: Any, name: str, device_type: int) -> None:
    group = state.grouped[name]
    blobs = list(group.values())
    if isinstance(blobs[0], GradientSlice):
        raise GradientSliceSyncError(
            f"Synchronizing gradient slices not supported: gradient {name} is sparse "
            "(a GradientSlice, e.g. from Gather) on CPU devices; use GPU devices or a dense "
            "gradient."
        )
    emit_op(net, "Sum", blobs, [blobs[0]], device_option(device_type, 0))
    if not state.config.shared_model:
        broadcast(state, net, name)


def allreduce_single_host(state: ParallelState, names: Sequence[str], net: Any) -> None:
    """Caffe2's ``_AllReduceBlobsSingleHost`` over ``names`` (already in reverse order)."""
    if len(state.devices) == 1:
        return
    pattern = None
    if state.config.is_gpu and not state.config.use_nccl:
        pattern = peer_access_pattern(state)
    last_out: Any = None
    concatenated: set[str] = set()
    for name in names:
        group = state.grouped[name]
        if len(group) == 1:
            continue
        if len(group) != len(state.devices):
            raise ParallelizeError(
                f"Each device of {list(state.devices)} should have a copy of {name}; found "
                f"it on {sorted(group)}."
            )
        blob_type = state.blob_device_type(name)
        if IsGPUDeviceType(blob_type):
            first = group[state.master]
            if isinstance(first, GradientSlice):
                _sparse_gpu(state, net, name, concatenated)
            else:
                _dense_gpu(state, net, name, last_out, pattern)
                last_out = first
        else:
            _cpu_like(state, net, name, IDEEP if blob_type == IDEEP else CPU)
