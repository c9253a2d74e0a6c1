"""Caffe2's ``utils`` module: argument encoding and small helpers."""

import threading
from typing import Any

import numpy as np

from dpgraph.ir.arguments import MakeArgument, argument_value
from dpgraph.ir.blob_serde import numpy_to_tensor_proto, tensor_proto_to_numpy
from dpgraph.runtime import devices as _devices
from dpgraph.runtime.api import current as _current_workspace

OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
ITERATION_MUTEX_NAME = "iteration_mutex"


def ArgsToDict(args: Any) -> dict[str, Any]:
    """``{name: value}`` for a list of Argument protos."""
    return {a.name: argument_value(a) for a in args}


def BuildUniqueMutexIter(init_net: Any, net: Any, iter: Any = None, iter_mutex: Any = None,
                         iter_val: int = 0) -> Any:
    """The shared int64 iteration counter and its AtomicIter (see dpgraph.optimizer)."""
    from dpgraph.modeling.optimizer.base import BuildUniqueMutexIter as build

    return build(init_net, net, iter, iter_mutex, iter_val)


def CaffeBlobToNumpyArray(blob: Any) -> np.ndarray:
    """A Caffe 1 ``BlobProto`` as a float32 array (legacy num/channels/height/width, or
    ``shape.dim``)."""
    data = np.asarray(blob.data, dtype=np.float32)
    if blob.num != 0:
        return data.reshape(blob.num, blob.channels, blob.height, blob.width)
    return data.reshape(tuple(blob.shape.dim))


def Caffe2TensorToNumpyArray(tensor: Any) -> np.ndarray:
    """A ``TensorProto`` as a numpy array of its data type."""
    return tensor_proto_to_numpy(tensor)


def NumpyArrayToCaffe2Tensor(arr: Any, name: str | None = None) -> Any:
    """A numpy array as a ``TensorProto`` (dims, data_type, data, and ``name`` if given)."""
    return numpy_to_tensor_proto(np.asarray(arr), name)


_peak_lock = threading.Lock()
_peak_bytes: dict[str, np.ndarray] = {}


def _bytes_by_gpu(count: int) -> np.ndarray:
    """Bytes held by the current workspace's tensors on each GPU (virtual or real)."""
    ws = _current_workspace()
    held = np.zeros(count, dtype=np.int64)
    for name in ws.blobs():
        key = ws.placement(name)
        if key is None or not _devices.is_gpu(key) or not 0 <= key[1] < count:
            continue
        held[key[1]] += int(getattr(ws.get_blob(name), "nbytes", 0))
    return held


def GetGPUMemoryUsageStats() -> dict[str, Any]:
    """Caffe2's per-GPU memory report: ``total_by_gpu`` (bytes held now, one entry per GPU),
    ``max_by_gpu`` (the most seen by any call so far in this workspace), ``total`` and
    ``max_total``.  dpgraph counts the bytes of the tensors each device's blobs hold."""
    count = _devices.NumGpuDevices()
    held = _bytes_by_gpu(count)
    with _peak_lock:
        name = _current_workspace().name
        peak = _peak_bytes.get(name)
        peak = held.copy() if peak is None or peak.size != count else np.maximum(peak, held)
        _peak_bytes[name] = peak
    return {"total_by_gpu": held, "max_by_gpu": peak.copy(), "total": int(held.sum()),
            "max_total": int(peak.sum())}


__all__ = ["ArgsToDict", "BuildUniqueMutexIter", "Caffe2TensorToNumpyArray",
           "CaffeBlobToNumpyArray", "GetGPUMemoryUsageStats", "ITERATION_MUTEX_NAME",
           "MakeArgument", "NumpyArrayToCaffe2Tensor", "OPTIMIZER_ITERATION_NAME"]
