"""Blob grouping by device, parameter validation and blob device inference.

``"gpu_3/fc_w"`` is grouped under ``"fc_w"`` with key ``3``; a GradientSlice is grouped
under ``"<indices>:<values>"`` (both stripped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir.analysis import may_name_other_devices
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.device import IsGPUDeviceType, device_name
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

_SEP = "/"


def stripBlobName(param: Any) -> str:
    """``"a/b/c"`` -> ``"b/c"``; a GradientSlice gives ``"<indices>:<values>"``."""
    if isinstance(param, GradientSlice):
        return stripBlobName(param.indices) + ":" + stripBlobName(param.values)
    name = str(param)
    return name[name.find(_SEP) + 1:]  # (find gives -1 without a separator: all of it)


def _device_of(blob: Any, prefix: str, what: str) -> int:
    name = str(blob)
    cut = name.find(_SEP)
    head = name[:cut] if cut >= 0 else ""  # the first part of the name scope
    if not head.startswith(prefix + "_"):
        raise ParallelizeError(
            f"{what} {blob} is expected to have name scope '{prefix}_<device>/'; create it "
            "inside the builder functions Parallelize calls per device."
        )
    try:
        return int(head[len(prefix) + 1:])
    except ValueError:
        scope = name[:name.rfind(_SEP) + 1]
        raise ParallelizeError(
            f"{what} {blob}: cannot read a device id from name scope {scope!r}."
        ) from None


def group_by_device(state: ParallelState, blobs: Sequence[Any],
                    non_data_blobs: Sequence[Any]) -> OrderedDict[str, dict[int, Any]]:
    """Caffe2's ``_GroupByDevice``: the data-parallel blobs by stripped name and device.

    The first ``len(non_data_blobs)`` entries of ``blobs`` existed before Parallelize and
    are not data parallel.
    """
    prefix = state.config.device_prefix
    scoped = prefix + "_"
    grouped: OrderedDict[str, dict[int, Any]] = OrderedDict()
    for blob in list(blobs)[len(non_data_blobs):]:
        if type(blob) is BlobReference:  # the common case, read in one go
            name = blob._name
            cut = name.find(_SEP)
            head = name[:cut] if cut >= 0 else ""
            device_text = head[len(scoped):]
            if head.startswith(scoped) and device_text.isdigit() and device_text.isascii():
                grouped.setdefault(name[cut + 1:], {})[int(device_text)] = blob
                continue
        if isinstance(blob, GradientSlice):
            device = _device_of(blob.indices, prefix, "Gradient indices")
            if _device_of(blob.values, prefix, "Gradient values") != device:
                raise ParallelizeError(
                    f"GradientSlice {blob} has indices and values on different devices."
                )
        elif isinstance(blob, BlobReference):
            device = _device_of(blob, prefix, "Blob")
        else:
            raise ParallelizeError(
                f"Param {blob!r} is not a BlobReference or GradientSlice."
            )
        grouped.setdefault(stripBlobName(blob), {})[device] = blob
    return grouped


def validate_params(params: Sequence[Any]) -> None:
    """Params must be unique; the error lists the duplicates."""
    seen: set[str] = set()
    dupes: list[str] = []
    for p in params:
        name = str(p)
        if name in seen:
            dupes.append(name)
        seen.add(name)
    if dupes:
        raise ParallelizeError(
            f"Duplicate entries in params: {sorted(set(dupes))}; each param must be created "
            "once per device (use model.create_param / brew helpers)."
        )


def _map_ops(ops: Sequence[caffe2_pb2.OperatorDef], mapping: dict[str, Any]) -> None:
    """Each blob not in ``mapping`` yet takes the device option of the first op (in order)
    that reads or writes it (``Iter`` counts as CPU); a RecurrentNetwork op's step nets
    come right after its own blobs, the last step net first."""
    cpu = caffe2_pb2.DeviceOption()
    cpu.device_type = caffe2_pb2.PROTO_CPU
    for op in ops:
        # (read as slices, which protobuf makes twice as fast as iterating; the device
        # option only for an op that names a new blob: most name none)
        op_type, option = op.type, None
        for blob in op.input[:]:
            if blob not in mapping:
                if option is None:
                    option = cpu if op_type == "Iter" else op.device_option
                mapping[blob] = option
        for blob in op.output[:]:
            if blob not in mapping:
                if option is None:
                    option = cpu if op_type == "Iter" else op.device_option
                mapping[blob] = option
        if op_type.startswith("RecurrentNetwork"):
            for arg in reversed([a for a in op.arg if a.name.endswith("step_net")]):
                _map_ops(arg.n.op, mapping)


def infer_blob_device(state: ParallelState) -> None:
    """Caffe2's ``_InferBlobDevice``: each blob takes the device of its first op."""
    mapping: dict[str, Any] = {}
    _map_ops(state.model.param_init_net.proto_for_reading().op, mapping)
    _map_ops(state.model.net.proto_for_reading().op, mapping)
    state.blob_to_device = mapping


def analyze_operators(state: ParallelState) -> None:
    """No GPU op may touch another device's blobs, except the ops whose schema says they may
    (copies, collectives, peer readers such as Concat, and Parallelize's ``dpm`` Sum)."""
    prefix = state.config.device_prefix + "_"
    for index, op in enumerate(state.model.net.proto_for_reading().op):
        if not IsGPUDeviceType(op.device_option.device_type) or may_name_other_devices(op):
            continue
        namescope = f"{prefix}{op.device_option.device_id}/"
        for blob in op.input[:] + op.output[:]:
            if blob.startswith(prefix) and not blob.startswith(namescope):
                raise ParallelizeError(
                    f"Blob {blob} of op #{index} {op.type} (on "
                    f"{device_name(op.device_option)}) should have namescope {namescope}; "
                    "an op may only use blobs of its own device (use Copy to move data)."
                )


def compute_blobs_to_sync(state: ParallelState) -> tuple[list[BlobReference], list[str]]:
    """Caffe2's ``_ComputeBlobsToSync``: data-parallel param-init outputs (sorted by
    device, then name) and their stripped names."""
    model, prefix = state.model, state.config.device_prefix
    if state.config.shared_model:
        blobs = [str(p) for p in model.GetComputedParams("")]
        names = sorted({stripBlobName(b) for b in blobs})
    else:
        scoped = prefix + "_"
        ops = model.param_init_net.proto_for_reading().op
        blobs = [out for op in ops for out in op.output[:] if out.startswith(scoped)]
        name_set = {out[out.find(_SEP) + 1:] for out in blobs}  # stripBlobName
        missing = sorted(set(state.param_names) - name_set)
        if missing:
            raise ParallelizeError(
                f"Some params not instantiated in param init net: {missing}; create every "
                "param with an init op in model.param_init_net inside the device scope."
            )
        names = sorted(name_set)
    start = len(prefix) + 1

    def sort_key(b: str) -> tuple[int, str]:
        return (int(b[start:b.index(_SEP)]), b)

    return [BlobReference(b) for b in sorted(set(blobs), key=sort_key)], names
