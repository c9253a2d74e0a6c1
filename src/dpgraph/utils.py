"""Caffe2's ``utils`` module: argument encoding and small helpers."""

import threading
from typing import Any

import numpy as np

from dpgraph.errors import ShapeError
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.blob_serde import numpy_to_tensor_proto, tensor_proto_to_numpy
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices as _devices
from dpgraph.runtime.api import RunOperatorOnce
from dpgraph.runtime.api import current as _current_workspace

OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
OPTIMIZER_ITERATION_LR_NAME = "optimizer_iteration_lr"
ITERATION_MUTEX_NAME = "iteration_mutex"
ITERATION_MUTEX_LR_NAME = "iteration_mutex_lr"


def ArgsToDict(args: Any) -> dict[str, Any]:
    """``{name: value}`` for a list of Argument protos, as Caffe2 gives it: strings stay
    bytes, lists are lists, an argument with no value maps to ``None`` and an unnamed one
    is skipped."""
    return {a.name: _raw_value(a) for a in args if a.HasField("name")}


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; ``label`` before
    return bool(field.label == field.LABEL_REPEATED if repeated is None else repeated)


def _raw_value(argument: Any) -> Any:
    for field in argument.DESCRIPTOR.fields:
        if field.name == "name":
            continue
        if _is_repeated(field):
            values = getattr(argument, field.name)
            if values:
                return list(values)
        elif argument.HasField(field.name):
            return getattr(argument, field.name)
    return None


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


def raiseIfNotEqual(a: Any, b: Any, msg: str) -> None:
    """Caffe2's check: raise ``Exception("<msg>. a != b")`` when ``a != b``."""
    if a != b:
        raise Exception(f"{msg}. {a} != {b}")


def debug(f: Any) -> Any:
    """Caffe2's decorator: on an exception print the traceback, enter ``pdb.post_mortem``,
    then exit with status 1."""
    import functools
    import pdb
    import sys
    import traceback

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except Exception:
            traceback.print_exc()
            pdb.post_mortem(sys.exc_info()[2])
            sys.exit(1)

    return wrapper


class DebugMode:
    """``DebugMode.run(main)``: run ``main()``; on an unhandled exception (not Ctrl-C)
    print it, enter ``pdb.post_mortem`` and exit with status 1."""

    @classmethod
    def run(cls, func: Any) -> Any:
        import pdb
        import sys

        try:
            return func()
        except KeyboardInterrupt:
            raise
        except Exception:
            print('Entering interactive debugger. Type "bt" to print the full stacktrace. '
                  'Type "help" to see command listing.')
            print(sys.exc_info()[1])
            pdb.post_mortem()
            sys.exit(1)


def ResetBlobs(blobs: Any) -> None:
    """Free ``blobs`` (a CPU ``Free`` op over them): they stay in the workspace, empty."""
    names = [str(b) for b in blobs]
    RunOperatorOnce(CreateOperator("Free", names, names,
                                   device_option=caffe2_pb2.DeviceOption()))


def NHWC2NCHW(tensor: Any) -> Any:
    """An NHWC (channels-last) array as NCHW: a transposed view."""
    _check_ndim(tensor, 1, "NHWC2NCHW")
    return tensor.transpose((0, tensor.ndim - 1) + tuple(range(1, tensor.ndim - 1)))


def NCHW2NHWC(tensor: Any) -> Any:
    """An NCHW array as NHWC (channels-last): a transposed view."""
    _check_ndim(tensor, 2, "NCHW2NHWC")
    return tensor.transpose((0,) + tuple(range(2, tensor.ndim)) + (1,))


def _check_ndim(tensor: Any, least: int, what: str) -> None:
    if np.ndim(tensor) < least:
        raise ShapeError(f"{what} needs an array of at least {least} dimensions, got shape "
                         f"{np.shape(tensor)}.")


def OpAlmostEqual(op_a: Any, op_b: Any, ignore_fields: Any = None) -> bool:
    """Whether two OperatorDefs are equal once the ``ignore_fields`` are cleared on both."""
    fields = ignore_fields or []
    fields = fields if isinstance(fields, list) else [fields]
    if not all(isinstance(f, str) for f in fields):
        raise TypeError(f"OpAlmostEqual: ignore_fields must be field names, got {fields!r}")
    if not fields:
        return bool(op_a == op_b)
    op_a, op_b = type(op_a).FromString(op_a.SerializeToString()), \
        type(op_b).FromString(op_b.SerializeToString())
    for field in fields:
        op_a.ClearField(field)
        op_b.ClearField(field)
    return bool(op_a == op_b)


def TryReadProtoWithClass(cls: Any, s: Any) -> Any:
    """Parse ``s`` as a ``cls`` message: text format first, then binary."""
    from google.protobuf import text_format
    from google.protobuf.message import DecodeError

    obj = cls()
    try:
        text = s.decode("utf-8") if isinstance(s, bytes) else s
        text_format.Parse(text, obj)
        return obj
    except (text_format.ParseError, UnicodeDecodeError):
        obj = cls()
        try:
            obj.ParseFromString(s.encode("latin-1") if isinstance(s, str) else s)
        except (DecodeError, RuntimeWarning) as exc:
            raise DecodeError(f"Cannot read {s[:40]!r}... as a {cls.__name__} "
                              f"(neither text nor binary protobuf): {exc}") from exc
        return obj


def GetContentFromProto(obj: Any, function_map: dict[Any, Any]) -> Any:
    """``function_map[type(obj)](obj)`` (None when no class matches)."""
    for cls, func in function_map.items():
        if type(obj) is cls:
            return func(obj)
    return None


def GetContentFromProtoString(s: Any, function_map: dict[Any, Any]) -> Any:
    """Parse ``s`` with the first class of ``function_map`` that fits and apply its function."""
    from google.protobuf.message import DecodeError

    for cls, func in function_map.items():
        try:
            return func(TryReadProtoWithClass(cls, s))
        except DecodeError:
            continue
    raise DecodeError("Cannot find a fit protobuffer class.")


def ConvertProtoToBinary(proto_class: Any, filename: str, out_filename: str) -> None:
    """Read a text or binary ``proto_class`` file and write it in binary."""
    with open(filename, "rb") as f:
        proto = TryReadProtoWithClass(proto_class, f.read())
    with open(out_filename, "wb") as f:
        f.write(proto.SerializeToString())


def EnumClassKeyVals(cls: type) -> dict[str, str]:
    """The upper-case string attributes of ``cls`` (a class used as an enum)."""
    enum: dict[str, str] = {}
    for key in dir(cls):
        value = getattr(cls, key)
        if key == key.upper() and isinstance(value, str):
            if value in enum.values():
                raise ValueError(f"Failed to resolve {cls} as Enum: duplicate value {value!r} "
                                 f"for {key}")
            enum[key] = value
    return enum


__all__ = ["ArgsToDict", "BuildUniqueMutexIter", "Caffe2TensorToNumpyArray",
           "ConvertProtoToBinary", "EnumClassKeyVals", "GetContentFromProto",
           "GetContentFromProtoString", "OpAlmostEqual", "TryReadProtoWithClass", "debug",
           "raiseIfNotEqual",
           "CaffeBlobToNumpyArray", "GetGPUMemoryUsageStats", "ITERATION_MUTEX_NAME",
           "ITERATION_MUTEX_LR_NAME", "MakeArgument", "NumpyArrayToCaffe2Tensor",
           "OPTIMIZER_ITERATION_LR_NAME", "OPTIMIZER_ITERATION_NAME", "DebugMode",
           "NCHW2NHWC", "NHWC2NCHW", "ResetBlobs"]
