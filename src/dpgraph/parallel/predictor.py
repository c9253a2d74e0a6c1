"""Export and net-conversion helpers: ExtractPredictorNet, ConvertNetForDevice,
GetLearningRateBlobNames."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from dpgraph.errors import NotSupportedError, ParallelizeError
from dpgraph.ir import scope
from dpgraph.ir.device import IsGPUDeviceType
from dpgraph.ir.net import Net
from dpgraph.modeling.model_helper import ExtractPredictorNet as extract_predictor_net
from dpgraph.parallel._emit import walk_ops
from dpgraph.proto import caffe2_pb2


def ExtractPredictorNet(model: Any, inputs: Sequence[Any], outputs: Sequence[Any],
                        device: caffe2_pb2.DeviceOption | None) -> tuple[Any, list[Any]]:
    """``(predict net, parameter blobs)`` of the first device, with the device prefix
    stripped from the inputs and outputs."""
    prefix = f"{model._device_prefix}_{model._devices[0]}/"
    prefix_inputs = [prefix + str(b) for b in inputs]
    prefix_outputs = [prefix + str(b) for b in outputs]
    renames = dict(zip(prefix_inputs + prefix_outputs,
                       [str(b) for b in list(inputs) + list(outputs)]))
    return extract_predictor_net(
        net_proto=model.net.Proto(), input_blobs=prefix_inputs, output_blobs=prefix_outputs,
        device=device, renames=renames,
    )


def _prefix_for(device: caffe2_pb2.DeviceOption) -> str:
    if IsGPUDeviceType(device.device_type):
        return "gpu"
    if device.device_type == caffe2_pb2.PROTO_IDEEP:
        return "ideep"
    return "cpu"


def ConvertNetForDevice(net: Net, device: caffe2_pb2.DeviceOption | None = None) -> Net:
    """A copy of ``net`` with every blob under ``<prefix>_<id>/`` and every op on ``device``
    (default: the current device scope)."""
    if device is None:
        device = scope.CurrentDeviceScope()
    if device is None:
        raise ParallelizeError(
            "ConvertNetForDevice needs a device: pass one or call it inside a DeviceScope."
        )
    converted = copy.deepcopy(net)
    proto = converted.Proto()
    namescope = f"{_prefix_for(device)}_{device.device_id}/"
    for op in proto.op:
        if "RecurrentNetwork" in op.type:
            raise NotSupportedError(
                f"RecurrentNetwork conversion not yet supported (op {op.type} in net "
                f"{proto.name!r})."
            )
        for field in ("input", "output", "control_input"):
            blobs = getattr(op, field)
            for i, blob in enumerate(blobs):
                blobs[i] = namescope + blob
        op.device_option.CopyFrom(device)
    for field in ("external_input", "external_output"):
        blobs = getattr(proto, field)
        for i, blob in enumerate(blobs):
            blobs[i] = namescope + blob
    return converted


def GetLearningRateBlobNames(model: Any) -> list[str]:
    """The learning-rate blobs: from the optimizer, else every LearningRate output."""
    optimizer = getattr(model, "_optimizer", None)
    if optimizer is not None:
        if model._device_type in (caffe2_pb2.PROTO_CPU, caffe2_pb2.PROTO_IDEEP):
            return [optimizer.get_cpu_blob_name("lr")]
        if IsGPUDeviceType(model._device_type):
            return [optimizer.get_gpu_blob_name("lr", gpu, "") for gpu in model._devices]
        raise ParallelizeError(f"Unsupported device type : {model._device_type}")
    return [op.output[0] for op in walk_ops(model.net.Proto()) if op.type == "LearningRate"]
