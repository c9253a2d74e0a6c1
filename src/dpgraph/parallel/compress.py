"""Compressed gradients: cast before the collective, cast back after.

``Parallelize(..., gradient_dtype="float16")`` wraps the per-blob reducer of the
configuration (single host or across hosts, per gradient or per bucket)::

    before:  Sum([cpu_0/fc_w_grad, cpu_1/fc_w_grad]) -> cpu_0/fc_w_grad; Copy -> cpu_1/...
    after:   GradientCompress(cpu_d/fc_w_grad) -> cpu_d/fc_w_grad_float16      (each device)
             Sum([cpu_0/fc_w_grad_float16, cpu_1/fc_w_grad_float16]) -> cpu_0/...; Copy
             GradientDecompress(cpu_d/fc_w_grad_float16) -> cpu_d/fc_w_grad   (each device)

With buckets the reducer sees bucket names, so each bucket is compressed once.  Across
hosts, float16 blobs and (marked ``wire_dtype="bfloat16"``) bfloat16 ones cross ranks as
16-bit words, summed in float32 (``dpgraph.collectives.halfsum``).  With
``gradient_error_feedback`` each device keeps ``<blob>_<dtype>_error`` (made empty by the
init net) and adds it to its next gradient.  Sparse gradients are reduced uncompressed.
Parameters and optimizer state are untouched (float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.buckets import Reducer
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2


def _compressible(state: ParallelState, name: str) -> bool:
    group = state.grouped[name]
    return len(group) == len(state.devices) and not any(
        isinstance(b, GradientSlice) for b in group.values())


def _option(state: ParallelState, device: int, blob: str) -> caffe2_pb2.DeviceOption:
    option = state.blob_to_device.get(blob)
    return option if option is not None else device_option(state.config.device_type, device)


def _init_error(state: ParallelState, blob: str, option: caffe2_pb2.DeviceOption) -> None:
    emit(state.model.param_init_net, make_op(
        "ConstantFill", [], [blob], option, shape=[0], value=0.0))


def _compress(state: ParallelState, net: Any, name: str, wire: str) -> list[str]:
    """Emit the casts of ``name`` into ``wire`` on every device and group ``wire`` like
    ``name`` so the reducer handles it; returns the full names placed in blob_to_device."""
    dtype = state.config.gradient_dtype
    feedback = state.config.gradient_error_feedback
    group: dict[int, Any] = {}
    ops = []
    for device, blob in state.grouped[name].items():
        full = f"{state.namescope(device)}/{wire}"
        option = _option(state, device, str(blob))
        group[device] = BlobReference(full)
        state.blob_to_device[full] = option
        inputs, outputs = [str(blob)], [full]
        if feedback:
            error = f"{full}_error"
            _init_error(state, error, option)
            inputs.append(error)
            outputs.append(error)
        ops.append(make_op("GradientCompress", inputs, outputs, option, dtype=dtype))
    state.grouped[wire] = group
    emit(net, *ops)
    return [str(b) for b in group.values()]


def _decompress(state: ParallelState, net: Any, name: str, wire: str) -> None:
    ops = []
    for device, blob in state.grouped[name].items():
        full = str(state.grouped[wire][device])
        ops.append(make_op("GradientDecompress", [full], [str(blob)],
                           _option(state, device, full), dtype=state.config.gradient_dtype))
    emit(net, *ops)


def _mark_bfloat16_wire(ops: Sequence[caffe2_pb2.OperatorDef], wire: set[str]) -> None:
    """Cross-rank ``Allreduce`` ops of compressed bfloat16 blobs (or of their staged
    ``_red`` copies) get ``wire_dtype="bfloat16"``: their values then cross ranks as 16-bit
    words instead of float32 ones (``dpgraph.collectives.halfsum``)."""
    for op in ops:
        blobs = op.input[1:]
        if op.type == "Allreduce" and blobs and all(
                b in wire or (b.endswith("_red") and b[:-4] in wire) for b in blobs):
            op.arg.add(name="wire_dtype", s=b"bfloat16")


def compressing(reduce: Reducer) -> Reducer:
    """``reduce`` with every dense name cast to ``config.gradient_dtype`` before it and cast
    back after; the compressed blob of ``x`` is ``x_<dtype>``."""
    def reduce_compressed(state: ParallelState, names: Sequence[str], net: Any) -> None:
        dtype = state.config.gradient_dtype
        wire_names: list[str] = []
        pairs: list[tuple[str, str]] = []
        placed: list[str] = []
        try:
            for name in names:
                if not _compressible(state, name) or len(state.devices) * max(
                        state.config.num_shards, 1) == 1:
                    wire_names.append(name)
                    continue
                wire = f"{name}_{dtype}"
                placed += _compress(state, net, name, wire)
                pairs.append((name, wire))
                wire_names.append(wire)
            first = len(net.Proto().op)
            reduce(state, wire_names, net)
            if dtype == "bfloat16":
                _mark_bfloat16_wire(net.Proto().op[first:], set(placed))
            for name, wire in pairs:
                _decompress(state, net, name, wire)
        finally:  # compressed blobs are not Caffe2 blobs: keep them out of the groups
            for _, wire in pairs:
                state.grouped.pop(wire, None)
            for blob in placed:
                state.blob_to_device.pop(blob, None)
    return reduce_compressed
