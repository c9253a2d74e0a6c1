"""TensorProto and BlobProto <-> numpy conversion (Caffe2's wire format)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import ProtoError
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto

#: numpy dtype -> (TensorProto.DataType, field holding the values)
_TO_PROTO: dict[np.dtype, tuple[Any, str]] = {
    np.dtype(np.float32): (DT.FLOAT, "float_data"),
    np.dtype(np.float64): (DT.DOUBLE, "double_data"),
    np.dtype(np.int32): (DT.INT32, "int32_data"),
    np.dtype(np.int64): (DT.INT64, "int64_data"),
    np.dtype(np.bool_): (DT.BOOL, "int32_data"),
    np.dtype(np.uint8): (DT.UINT8, "int32_data"),
    np.dtype(np.int8): (DT.INT8, "int32_data"),
    np.dtype(np.uint16): (DT.UINT16, "int32_data"),
    np.dtype(np.int16): (DT.INT16, "int32_data"),
    np.dtype(np.float16): (DT.FLOAT16, "int32_data"),
}

#: TensorProto.DataType -> numpy dtype (STRING maps to object)
DATA_TYPE_TO_NUMPY: dict[int, np.dtype] = {
    DT.FLOAT: np.dtype(np.float32), DT.DOUBLE: np.dtype(np.float64),
    DT.INT32: np.dtype(np.int32), DT.INT64: np.dtype(np.int64), DT.BOOL: np.dtype(np.bool_),
    DT.UINT8: np.dtype(np.uint8), DT.INT8: np.dtype(np.int8), DT.UINT16: np.dtype(np.uint16),
    DT.INT16: np.dtype(np.int16), DT.FLOAT16: np.dtype(np.float16), DT.BYTE: np.dtype(np.uint8),
    DT.STRING: np.dtype(object),
}


def numpy_to_data_type(dtype: Any) -> int:
    """The TensorProto.DataType of a numpy dtype (object/str/bytes -> STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return DT.STRING
    if dtype not in _TO_PROTO:
        raise ProtoError(f"numpy dtype {dtype} has no Caffe2 TensorProto data type; convert "
                         "the array to a supported dtype (e.g. float32, int64) first.")
    return _TO_PROTO[dtype][0]


def value_data_type(value: Any) -> int | None:
    """The DataType of a blob value, or ``None`` for non-tensors."""
    if isinstance(value, (bytes, str)):
        return DT.STRING
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return None
    try:
        return numpy_to_data_type(dtype)
    except ProtoError:
        return None


def _as_bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def numpy_to_tensor_proto(array: Any, name: str | None = None) -> caffe2_pb2.TensorProto:
    """Serialise an array (or string) into a TensorProto."""
    array = np.asarray(array)
    proto = caffe2_pb2.TensorProto()
    proto.dims.extend(array.shape)
    if name is not None:
        proto.name = name
    if array.dtype.kind in "OSU":
        proto.data_type = DT.STRING
        proto.string_data.extend(_as_bytes(v) for v in array.reshape(-1))
        return proto
    data_type, field = _TO_PROTO.get(array.dtype, (None, ""))
    if data_type is None:
        raise ProtoError(f"Cannot serialise an array of dtype {array.dtype} to a TensorProto; "
                         "convert it to a supported dtype (e.g. float32, int64) first.")
    proto.data_type = data_type
    flat = array.reshape(-1)
    if data_type == DT.FLOAT16:
        flat = flat.view(np.uint16)
    elif data_type == DT.BOOL:
        flat = flat.astype(np.int32)
    getattr(proto, field).extend(flat.tolist())
    return proto


def tensor_proto_to_numpy(proto: caffe2_pb2.TensorProto) -> np.ndarray:
    """Deserialise a TensorProto into a numpy array (raw_data and typed fields)."""
    dims = tuple(proto.dims)
    data_type = proto.data_type
    dtype = DATA_TYPE_TO_NUMPY.get(data_type)
    if dtype is None:
        raise ProtoError(f"TensorProto {proto.name!r}: unsupported data_type {data_type}.")
    if data_type == DT.STRING:
        values = np.empty(len(proto.string_data), dtype=object)
        values[:] = list(proto.string_data)
        return values.reshape(dims)
    if proto.HasField("raw_data"):
        values = np.frombuffer(proto.raw_data, dtype=dtype.newbyteorder("<")).astype(dtype)
    elif data_type == DT.BYTE:
        values = np.frombuffer(proto.byte_data, dtype=np.uint8).copy()
    elif data_type == DT.FLOAT16:
        values = np.array(proto.int32_data, dtype=np.uint16).view(np.float16)
    else:
        field = _TO_PROTO[dtype][1]
        values = np.array(getattr(proto, field), dtype=dtype)
    size = int(np.prod(dims)) if dims else 1
    if values.size != size:
        raise ProtoError(f"TensorProto {proto.name!r}: dims {list(dims)} need {size} values, "
                         f"found {values.size}.")
    return values.reshape(dims)


def serialize_blob(name: str, value: Any) -> bytes:
    """A BlobProto (bytes) holding ``value``: a tensor, or a string as ``std::string``."""
    from dpgraph.runtime.devices import to_host

    proto = caffe2_pb2.BlobProto(name=name)
    if isinstance(value, (bytes, str)):
        proto.type = "std::string"
        proto.content = _as_bytes(value)
    elif value is None:
        raise ProtoError(f"Blob {name!r} is empty and cannot be serialised; feed it a value "
                         "(or run the net that produces it) first.")
    else:
        proto.type = "Tensor"
        proto.tensor.CopyFrom(numpy_to_tensor_proto(to_host(value)))
        proto.tensor.device_detail.device_type = caffe2_pb2.PROTO_CPU
    return proto.SerializeToString()


def deserialize_blob(data: bytes) -> tuple[str, Any]:
    """``(name, value)`` from BlobProto bytes."""
    proto = caffe2_pb2.BlobProto()
    try:
        proto.ParseFromString(data)
    except Exception as error:
        raise ProtoError(f"Cannot parse BlobProto bytes: {error}") from error
    if proto.HasField("tensor"):
        return proto.name, tensor_proto_to_numpy(proto.tensor)
    if proto.type == "std::string" or proto.HasField("content"):
        return proto.name, proto.content
    raise ProtoError(f"BlobProto {proto.name!r} of type {proto.type!r} holds no tensor or string.")
