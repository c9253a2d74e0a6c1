"""Training helpers: iter, accuracy, add_weight_decay."""

from __future__ import annotations

from typing import Any

from dpgraph.ir import scope
from dpgraph.ir.device import CPU, DeviceOption
from dpgraph.proto import caffe2_pb2

INT64 = caffe2_pb2.TensorProto.INT64


def iter(model: Any, blob_out: Any, **kwargs: Any) -> Any:  # noqa: A001
    """An int64 counter: CPU ConstantFill 0 in param_init_net, ``Iter`` in net."""
    kwargs.pop("device_option", None)
    model.param_init_net.ConstantFill([], blob_out, shape=[1], value=0, dtype=INT64,
                                      device_option=DeviceOption(CPU, 0), **kwargs)
    return model.net.Iter(blob_out, blob_out, **kwargs)


def accuracy(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Accuracy; top_k > 1 on a GPU copies prediction and label to the host first."""
    dev = kwargs.get("device_option", scope.CurrentDeviceScope())
    is_cpu = dev is None or dev.device_type == CPU
    if not is_cpu and kwargs.get("top_k", 1) > 1:
        pred_host = model.net.CopyGPUToCPU(blob_in[0], blob_in[0] + "_host")
        label_host = model.net.CopyGPUToCPU(blob_in[1], blob_in[1] + "_host")
        kwargs.pop("device_option", None)
        return model.net.Accuracy([pred_host, label_host], blob_out,
                                  device_option=DeviceOption(CPU, 0), **kwargs)
    return model.net.Accuracy(blob_in, blob_out)


def _get_weights(model: Any, namescope: str | None = None) -> list[Any]:
    if namescope is None:
        namescope = scope.CurrentNameScope()
    if namescope == "":
        return model.weights[:]
    return [w for w in model.weights if w.GetNameScope() == namescope]


def add_weight_decay(model: Any, weight_decay: float) -> None:
    """``grad += weight_decay * param`` for every weight (L2 regularisation)."""
    if weight_decay <= 0.0:
        return
    wd = model.param_init_net.ConstantFill([], "wd", shape=[1], value=weight_decay)
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in _get_weights(model):
        grad = model.param_to_grad[param]
        model.net.WeightedSum([grad, one, param, wd], grad)
