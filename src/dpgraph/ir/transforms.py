"""Graph rewrites that keep a net's meaning: cross-device copy injection."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ArgumentError
from dpgraph.ir.analysis import InferBlobDevices
from dpgraph.ir.device import CPU, IsGPUDeviceType, device_equal, effective_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2


def _copy_name(blob: str, device: caffe2_pb2.DeviceOption) -> str:
    if IsGPUDeviceType(device.device_type):
        return f"{blob}_gpu_{device.device_id}"
    return f"{blob}_cpu"


def _copy_type(src: caffe2_pb2.DeviceOption, dst: caffe2_pb2.DeviceOption) -> str:
    if src.device_type == CPU and IsGPUDeviceType(dst.device_type):
        return "CopyCPUToGPU"
    if IsGPUDeviceType(src.device_type) and dst.device_type == CPU:
        return "CopyGPUToCPU"
    return "Copy"


def InjectCrossDeviceCopies(
    net: Any,
    blob_to_device: dict[str, caffe2_pb2.DeviceOption] | None = None,
    blob_remap: dict[str, str] | None = None,
    placeHolderOps: Any = None,
) -> tuple[Any, dict[str, caffe2_pb2.DeviceOption]]:
    """Insert a copy wherever an op reads a blob living on another device.

    Copies are named ``<blob>_cpu`` / ``<blob>_gpu_<id>`` and made once per blob version and
    device; the reading op is rewired to the copy.  Returns ``(new_net, blob_to_device)``
    where ``new_net`` is a new :class:`~dpgraph.ir.net.Net` (the input is not changed).
    """
    from dpgraph.ir.net import Net

    source = proto_of(net)
    devices = dict(blob_to_device or {})
    remap = dict(blob_remap or {})
    proto = caffe2_pb2.NetDef()
    proto.CopyFrom(source)
    del proto.op[:]
    default = source.device_option if source.HasField("device_option") else None
    copies: dict[tuple[str, int, int], str] = {}
    for op in source.op:
        device = effective_device(op, default)
        new_op = caffe2_pb2.OperatorDef()
        new_op.CopyFrom(op)
        for position, blob in enumerate(op.input):
            blob = remap.get(blob, blob)
            home = devices.get(blob)
            if home is not None and not device_equal(home, device):
                key = (blob, device.device_type, device.device_id)
                if key not in copies:
                    copies[key] = _copy_name(blob, device)
                    copy = proto.op.add(type=_copy_type(home, device), input=[blob],
                                        output=[copies[key]])
                    copy.device_option.CopyFrom(device)
                    devices[copies[key]] = device
                blob = copies[key]
            new_op.input[position] = blob
        for blob in op.output:
            devices[blob] = device
            copies = {k: v for k, v in copies.items() if k[0] != blob}
        proto.op.append(new_op)
    for blob, option in InferBlobDevices(proto).items():
        devices.setdefault(blob, option)
    return Net(proto, inplace=True), devices


def InjectDeviceCopiesAmongNets(
    nets: list[Any], blob_to_device_init: dict[str, caffe2_pb2.DeviceOption] | None = None,
) -> tuple[list[Any], dict[str, caffe2_pb2.DeviceOption]]:
    """:func:`InjectCrossDeviceCopies` over ``nets`` in order, threading the blob placement
    (and the copies already made) from one net to the next; returns ``(new_nets, b2d)``."""
    if not isinstance(nets, list):
        raise ArgumentError("InjectDeviceCopiesAmongNets: nets must be a list of Net or NetDef, "
                            f"got {type(nets).__name__}.")
    blob_to_device = dict(blob_to_device_init or {})
    blob_remap: dict[str, str] = {}
    new_nets = []
    for net in nets:
        new_net, blob_to_device = InjectCrossDeviceCopies(
            net, blob_to_device=blob_to_device, blob_remap=blob_remap)
        new_nets.append(new_net)
    return new_nets, blob_to_device


def InjectDeviceCopiesAmongNetsWithoutB2D(
    nets: list[Any], blob_to_device_init: dict[str, caffe2_pb2.DeviceOption] | None = None,
) -> list[Any]:
    """:func:`InjectDeviceCopiesAmongNets` returning only the new nets."""
    return InjectDeviceCopiesAmongNets(nets, blob_to_device_init)[0]
