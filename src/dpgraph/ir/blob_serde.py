"""The one blob (de)serializer: numpy/strings <-> Caffe2's TensorProto and BlobProto.

Used by ``workspace.SerializeBlob``, the Save/Load/Checkpoint ops, the DB input ops,
checkpoints and the exporters, so every byte dpgraph writes has Caffe2's layout:

* a tensor chunk is a ``BlobProto{name, type="Tensor", tensor}`` whose TensorProto carries the
  *full* dims, an explicit ``data_type``, only the chunk's elements in the dtype's field,
  ``name``, ``device_detail``, ``segment{begin,end}`` and (FLOAT only) ``data_format=0``;
* chunk ``k`` of blob ``W`` is stored under the DB key ``W#%k`` (no padding);
* a string blob is ``BlobProto{name, type="std::string", content}`` under its plain name.

Other blob types (the DB reader) register a serializer with :func:`register_type`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from dpgraph.errors import CorruptDataError, ProtoError, ResourceLimitError, SerializationError
from dpgraph.ir.arrays import host, is_array
from dpgraph.ir.proto_io import check_tensor_size
from dpgraph.proto import caffe2_pb2


class TensorProtoError(SerializationError, ProtoError):
    """A tensor or blob proto cannot be (de)serialized: a SerializationError that is also
    the ProtoError that callers of the older ``runtime.serialization`` API catch."""


DT = caffe2_pb2.TensorProto
DeviceKey = tuple[int, int]

KEY_SEPARATOR = "#%"
DEFAULT_CHUNK_SIZE = 1_000_000
#: Largest element count a TensorProto may declare before anything is allocated.
FLOAT_DEFAULT, FLOAT_PROTOBUF, FLOAT_BFLOAT16 = 0, 1, 2

#: numpy dtype -> (TensorProto.DataType, field holding the values by default)
_TO_PROTO: dict[np.dtype, tuple[int, str]] = {
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
#: types that may come as raw little-endian ``byte_data`` instead of ``int32_data``
BYTE_HOLDER_TYPES = {DT.BOOL, DT.UINT8, DT.INT8, DT.UINT16, DT.INT16, DT.FLOAT16, DT.BYTE}


# --- dtypes ----------------------------------------------------------------------------------
def numpy_to_data_type(dtype: Any) -> int:
    """The TensorProto.DataType of a numpy dtype (object/str/bytes -> STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return DT.STRING
    if dtype not in _TO_PROTO:
        raise TensorProtoError(
            f"numpy dtype {dtype} has no Caffe2 TensorProto data type; convert the array to a "
            "supported dtype (float16/32/64, int8/16/32/64, uint8/16, bool or strings) first.")
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
    except SerializationError:
        return None


def _as_bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _device_detail(proto: Any, device: Any) -> None:
    """Fill ``proto`` (a DeviceOption) from a DeviceOption or a ``(type, id)`` key."""
    if isinstance(device, caffe2_pb2.DeviceOption):
        proto.CopyFrom(device)
        proto.device_type = device.device_type  # explicitly present, as Caffe2 writes it
        return
    device_type, device_id = device if device is not None else (0, 0)
    proto.device_type = int(device_type)
    if device_type != 0:
        proto.device_id = int(device_id)


# --- tensors ---------------------------------------------------------------------------------
def _to_bfloat16(flat: np.ndarray) -> bytes:
    bits = flat.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype("<u2").tobytes()


def _fill_values(proto: Any, flat: np.ndarray, data_type: int, *, raw: bool,
                 float_format: int) -> None:
    """Write ``flat`` (already this chunk's elements) into ``proto``'s data field."""
    if data_type == DT.STRING:
        try:
            proto.string_data.extend(_as_bytes(v) for v in flat.tolist())
        except TypeError as error:
            raise TensorProtoError(f"an object array must hold only bytes or str to be "
                                   f"serialized as a string tensor ({error}).") from None
        return
    if data_type == DT.FLOAT and float_format == FLOAT_BFLOAT16:
        proto.raw_data = _to_bfloat16(flat)
        proto.data_format = DT.FMT_BFLOAT16
        return
    if raw:
        proto.raw_data = np.ascontiguousarray(flat).astype(
            flat.dtype.newbyteorder("<"), copy=False).tobytes()
        return
    field_name = _TO_PROTO[flat.dtype][1]
    if data_type == DT.FLOAT16:
        flat = flat.view(np.uint16)
    if flat.size:
        getattr(proto, field_name).extend(flat.astype(
            np.int32 if field_name == "int32_data" else flat.dtype, copy=False).tolist())


def tensor_chunk(array: Any, name: str | None, begin: int, end: int, device: Any = None,
                 *, float_format: int = FLOAT_DEFAULT, raw: bool = False,
                 segment: bool = True) -> caffe2_pb2.TensorProto:
    """The TensorProto of elements ``[begin, end)`` of ``array`` (Caffe2's field order)."""
    array = host(array)
    data_type = numpy_to_data_type(array.dtype)
    proto = DT()
    proto.dims.extend(array.shape)
    proto.data_type = data_type  # type: ignore[assignment]
    _fill_values(proto, array.reshape(-1)[begin:end], data_type, raw=raw,
                 float_format=float_format)
    if name is not None:
        proto.name = name
    if device is not False:
        _device_detail(proto.device_detail, device)
    if segment:
        proto.segment.begin, proto.segment.end = begin, end
    if data_type == DT.FLOAT and not proto.HasField("data_format"):
        proto.data_format = DT.FMT_PROTOBUF
    return proto


def numpy_to_tensor_proto(array: Any, name: str | None = None, *,
                          raw: bool = False) -> caffe2_pb2.TensorProto:
    """A whole array as a plain TensorProto (dims, data_type, data, name) — the form
    ``TensorProtos`` DB records and ``FeedBlob(TensorProto)`` use."""
    array = host(array)
    if array.dtype.kind in "SU":
        array = np.array([_as_bytes(v) for v in array.reshape(-1).tolist()],
                         dtype=object).reshape(array.shape)
    proto = tensor_chunk(array, name, 0, array.size, False, raw=raw, segment=False)
    proto.ClearField("data_format")
    return proto


def _numel(proto: Any, where: str) -> int:
    """The element count ``proto`` declares, refused before allocation when it exceeds the
    configurable tensor size limit (``dpgraph.ir.proto_io.max_tensor_bytes``)."""
    dims = list(proto.dims)
    if any(d < 0 for d in dims):
        raise CorruptDataError(f"{where}: TensorProto has negative dims {dims}; the record is "
                               "corrupt.")
    dtype = DATA_TYPE_TO_NUMPY.get(proto.data_type, np.dtype(np.float32))
    itemsize = dtype.itemsize if dtype.kind != "O" else 1
    return check_tensor_size(dims, itemsize, f"{where}: TensorProto")


def _values(proto: Any, data_type: int, count: int, where: str) -> np.ndarray:
    """The ``count`` elements held by ``proto``'s data field, as a flat array."""
    if data_type == DT.STRING:
        values = np.empty(len(proto.string_data), dtype=object)
        values[:] = list(proto.string_data)
    elif data_type == DT.FLOAT and proto.data_format == DT.FMT_BFLOAT16:
        bits = np.frombuffer(proto.raw_data, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32)
    elif proto.HasField("raw_data"):
        dtype = DATA_TYPE_TO_NUMPY[data_type]
        if len(proto.raw_data) != count * dtype.itemsize:
            raise TensorProtoError(f"{where}: incorrect data size: raw_data holds "
                                   f"{len(proto.raw_data)} bytes for {count} {dtype} values.")
        values = np.frombuffer(proto.raw_data, dtype=dtype.newbyteorder("<")).astype(dtype)
    elif data_type in BYTE_HOLDER_TYPES and (proto.HasField("byte_data") or data_type == DT.BYTE):
        dtype = DATA_TYPE_TO_NUMPY[data_type]
        if len(proto.byte_data) != count * dtype.itemsize:
            raise TensorProtoError(f"{where}: incorrect data size: byte_data holds "
                                   f"{len(proto.byte_data)} bytes for {count} {dtype} values.")
        values = np.frombuffer(proto.byte_data, dtype=dtype.newbyteorder("<")).astype(dtype)
    elif data_type == DT.FLOAT16:
        values = np.array(proto.int32_data, dtype=np.int64).astype(np.uint16).view(np.float16)
    else:
        dtype = DATA_TYPE_TO_NUMPY[data_type]
        values = np.array(getattr(proto, _TO_PROTO[dtype][1]), dtype=np.float64
                          if dtype.kind == "f" else np.int64).astype(dtype)
    if values.size != count:
        raise TensorProtoError(f"{where}: Incorrect proto field size: dims {list(proto.dims)} "
                               f"need {count} values, found {values.size}.")
    return values


def _data_type(proto: Any, where: str, strict: bool) -> int:
    if not proto.HasField("data_type"):
        if strict:
            raise TensorProtoError(f"{where}: Cannot deserialize tensor: unrecognized data "
                                     "type (the TensorProto sets no data_type; set it "
                                     "explicitly, even for FLOAT).")
        return DT.FLOAT
    data_type = int(proto.data_type)
    if data_type not in DATA_TYPE_TO_NUMPY and data_type != DT.UNDEFINED:
        raise TensorProtoError(f"{where}: unsupported TensorProto data_type {data_type}.")
    return data_type


def tensor_proto_to_numpy(proto: caffe2_pb2.TensorProto, where: str = "",
                          strict: bool = False) -> np.ndarray:
    """A whole (unchunked, or the only chunk of a) TensorProto as a numpy array.

    ``strict`` refuses a missing ``data_type`` as Caffe2 2021 does for blobs; TensorProtos
    DB records and ``FeedBlob`` default it to FLOAT."""
    where = where or f"TensorProto {proto.name!r}"
    numel = _numel(proto, where)
    data_type = _data_type(proto, where, strict)
    if data_type == DT.UNDEFINED:
        if numel:
            raise TensorProtoError(f"{where}: data_type UNDEFINED with {numel} elements.")
        return np.zeros((0,), dtype=np.float32)
    begin, end = (proto.segment.begin, proto.segment.end) if proto.HasField("segment") \
        else (0, numel)
    if (begin, end) != (0, numel):
        raise TensorProtoError(f"{where}: segment [{begin}, {end}) is part of a chunked "
                                 f"tensor of {numel} elements; load it with Load.")
    return _values(proto, data_type, numel, where).reshape(tuple(proto.dims))


# --- blobs -----------------------------------------------------------------------------------
@dataclass
class TypeSerializer:
    """How a non-tensor blob type is written to and read from ``BlobProto.content``.

    With ``with_tensor`` (Caffe2 types that also fill ``BlobProto.tensor``, such as counters
    and tree cursors) ``serialize(name, value)`` returns ``(TensorProto or None, content
    bytes)`` and ``deserialize(tensor or None, content)`` receives both."""

    type_name: str
    accepts: Callable[[Any], bool]
    serialize: Callable[..., Any]
    deserialize: Callable[..., Any]
    with_tensor: bool = False

    def fill(self, proto: caffe2_pb2.BlobProto, name: str, value: Any) -> None:
        """Write ``value`` into ``proto`` (type, tensor and content)."""
        proto.type = self.type_name
        if not self.with_tensor:
            proto.content = self.serialize(name, value)
            return
        tensor, content = self.serialize(name, value)
        if tensor is not None:
            proto.tensor.CopyFrom(tensor)
        if content:
            proto.content = content

    def read(self, proto: caffe2_pb2.BlobProto) -> Any:
        """The value stored in ``proto``."""
        if not self.with_tensor:
            return self.deserialize(bytes(proto.content))
        tensor = proto.tensor if proto.HasField("tensor") else None
        return self.deserialize(tensor, bytes(proto.content))


_TYPES: dict[str, TypeSerializer] = {}


def register_type(serializer: TypeSerializer) -> None:
    """Register a serializer for a non-tensor blob type (BlobProto ``type`` name)."""
    _TYPES[serializer.type_name] = serializer


def is_tensor(value: Any) -> bool:
    """Arrays (numpy or CuPy) and numpy scalars serialize as tensors."""
    return isinstance(value, np.generic) or is_array(value)


def chunk_count(numel: int, chunk_size: int) -> int:
    """``max(1, ceil(numel / chunk_size))``."""
    return max(1, -(-numel // chunk_size))


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


#: dtypes whose packed data field is the raw little-endian bytes: (field number, wire dtype)
_RAW_PACKED = {np.dtype(np.float32): (3, "<f4"), np.dtype(np.float64): (9, "<f8")}


def _fast_chunk(name: str, array: np.ndarray, begin: int, end: int, device: Any) -> bytes:
    """The BlobProto bytes :func:`tensor_chunk` + protobuf would give, for float32/float64,
    built from the array's bytes.  Protobuf writes fields in number order, so the data field
    (3 or 9) goes between the fields numbered below it and those above it."""
    number, wire = _RAW_PACKED[array.dtype]
    data_type = _TO_PROTO[array.dtype][0]
    before = DT(dims=array.shape, data_type=data_type)  # type: ignore[arg-type]
    after = DT()
    for proto in (before, after):
        if (proto is before) == (number > 7):
            proto.name = name
        if (proto is before) == (number > 8):
            _device_detail(proto.device_detail, device)
    after.segment.begin, after.segment.end = begin, end
    if data_type == DT.FLOAT:
        after.data_format = DT.FMT_PROTOBUF
    payload = np.ascontiguousarray(array.reshape(-1)[begin:end]).astype(wire, copy=False)
    data = payload.tobytes()
    field_bytes = bytes([number << 3 | 2]) + _encode_varint(len(data)) + data if data else b""
    tensor = before.SerializeToString() + field_bytes + after.SerializeToString()
    blob = caffe2_pb2.BlobProto(name=name, type="Tensor").SerializeToString()
    return blob + b"\x1a" + _encode_varint(len(tensor)) + tensor


def serialize_blob_chunks(name: str, value: Any, device: Any = None,
                          chunk_size: int = DEFAULT_CHUNK_SIZE,
                          float_format: int = FLOAT_DEFAULT) -> Iterator[tuple[str, bytes]]:
    """``(db_key, BlobProto bytes)`` for each chunk of ``value`` (``name#%k``), or one
    plain-name record for a non-tensor blob.  ``chunk_size`` <= 0 means no chunking."""
    if not is_tensor(value):
        yield name, serialize_blob(name, value, device)
        return
    array = host(value)
    numel = int(array.size)
    size = chunk_size if chunk_size > 0 else numel + 1
    fast = array.dtype in _RAW_PACKED and float_format != FLOAT_BFLOAT16
    for k in range(chunk_count(numel, size)):
        begin = k * size
        if fast:
            yield (f"{name}{KEY_SEPARATOR}{k}",
                   _fast_chunk(name, array, begin, min(numel, begin + size), device))
            continue
        proto = caffe2_pb2.BlobProto(name=name, type="Tensor")
        proto.tensor.CopyFrom(tensor_chunk(array, name, begin, min(numel, begin + size),
                                           device, float_format=float_format))
        yield f"{name}{KEY_SEPARATOR}{k}", proto.SerializeToString()


def serialize_blob(name: str, value: Any, device: Any = None) -> bytes:
    """One BlobProto holding the whole blob (``workspace.SerializeBlob``)."""
    proto = caffe2_pb2.BlobProto(name=name)
    if isinstance(value, (bytes, str)):
        proto.type = "std::string"
        proto.content = _as_bytes(value)
    elif value is None:
        raise TensorProtoError(f"Blob {name!r} is empty and cannot be serialized; feed it a "
                                 "value (or run the net that produces it) first.")
    elif is_tensor(value):
        array = host(value)
        proto.type = "Tensor"
        proto.tensor.CopyFrom(tensor_chunk(array, name, 0, array.size, device))
    else:
        for serializer in _TYPES.values():
            if serializer.accepts(value):
                serializer.fill(proto, name, value)
                break
        else:
            raise TensorProtoError(f"Blob {name!r}: No known serializer for "
                                     f"{type(value).__name__}.")
    return proto.SerializeToString()


def parse_blob_proto(data: bytes, where: str = "") -> caffe2_pb2.BlobProto:
    """Parse BlobProto bytes; unparsable bytes raise CorruptDataError naming ``where``."""
    proto = caffe2_pb2.BlobProto()
    try:
        proto.ParseFromString(bytes(data))
    except DecodeError as error:
        raise CorruptDataError(f"{where or 'value'}: not a serialized BlobProto ({error}); the "
                               "record is corrupt or was not written by Save.") from None
    return proto


def deserialize_blob(data: bytes, where: str = "") -> tuple[str, Any]:
    """``(name, value)`` from the bytes of one complete BlobProto."""
    proto = parse_blob_proto(data, where)
    assembler = BlobAssembler(proto.name, where)
    assembler.add(proto)
    assembler.check_complete()
    return proto.name, assembler.value


@dataclass
class BlobAssembler:
    """Collects the chunks of one blob (any order) into its value, with Caffe2's checks."""

    name: str
    where: str = ""
    value: Any = None
    filled: int = 0
    numel: int = -1
    device: DeviceKey = (0, 0)
    seen: bool = False
    _flat: Any = field(default=None, repr=False)

    def add(self, proto: caffe2_pb2.BlobProto) -> bool:
        """Add one record; True once the blob is complete."""
        where = self.where or f"blob {self.name!r}"
        if proto.type == "Tensor" or (not proto.type and proto.HasField("tensor")):
            return self._add_tensor(proto.tensor, where)
        if self.seen:
            raise CorruptDataError(f"{where}: Blob duplicated: {self.name!r} appears twice.")
        self.seen = True
        if proto.type == "std::string" or (not proto.type and proto.HasField("content")):
            self.value = bytes(proto.content)
        elif proto.type in _TYPES:
            self.value = _TYPES[proto.type].read(proto)
        else:
            raise TensorProtoError(f"{where}: No registered deserializer for type "
                                     f"{proto.type!r}.")
        self.numel = self.filled = 0
        return True

    def _add_tensor(self, tensor: Any, where: str) -> bool:
        numel = _numel(tensor, where)
        data_type = _data_type(tensor, where, strict=True)
        if self.seen and self.complete:
            raise CorruptDataError(f"{where}: Found an extra part for an already filled "
                                   f"tensor {self.name!r}.")
        if self.seen and not tensor.HasField("segment"):
            raise CorruptDataError(f"{where}: Partial tensor must have a segment.")
        begin, end = (tensor.segment.begin, tensor.segment.end) \
            if tensor.HasField("segment") else (0, numel)
        if not 0 <= begin <= end <= numel:
            raise CorruptDataError(f"{where}: segment [{begin}, {end}) is outside the tensor "
                                   f"of {numel} elements.")
        values = _values(tensor, data_type, end - begin, where) if data_type != DT.UNDEFINED \
            else np.zeros((0,), np.float32)
        if not self.seen:
            self.seen, self.numel = True, numel
            dtype = values.dtype if data_type != DT.UNDEFINED else np.dtype(np.float32)
            self._flat = np.empty(numel, dtype=dtype)
            self.device = (int(tensor.device_detail.device_type),
                           int(tensor.device_detail.device_id)) \
                if tensor.HasField("device_detail") and tensor.device_detail.device_type \
                else (0, 0)
            shape = tuple(tensor.dims) if data_type != DT.UNDEFINED or numel else (0,)
            self.value = self._flat.reshape(shape)
        self._flat[begin:end] = values
        self.filled += end - begin
        return self.complete

    @property
    def complete(self) -> bool:
        return self.seen and self.filled >= self.numel

    def check_complete(self) -> None:
        if not self.complete:
            raise CorruptDataError(f"{self.where or 'Load'}: Data size mismatch for blob "
                                   f"{self.name}. Expected: {self.numel} Read: {self.filled}")


# --- keys and options ------------------------------------------------------------------------
def blob_name_of_key(key: str) -> str:
    """The blob name of a DB key: the key cut at the first ``#%``."""
    index = key.find(KEY_SEPARATOR)
    return key if index < 0 else key[:index]


@dataclass(frozen=True)
class BlobOptions:
    """One ``BlobSerializationOptions`` entry: regex, chunk size, float format."""

    blob_name_regex: str = ""
    chunk_size: int = 0
    float_format: int = FLOAT_DEFAULT

    def matches(self, name: str) -> bool:
        return not self.blob_name_regex or re.fullmatch(self.blob_name_regex, name) is not None

    def resolved_chunk_size(self) -> int:
        """0 -> the default (1,000,000 elements), -1 -> no chunking, N -> N."""
        if self.chunk_size == 0:
            return DEFAULT_CHUNK_SIZE
        return -1 if self.chunk_size < 0 else self.chunk_size


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise TensorProtoError("truncated varint.")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """Decode a protobuf message into ``(field_number, value)`` (varint or bytes)."""
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: Any
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            size, pos = read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = data[pos:pos + width], pos + width
        else:
            raise TensorProtoError(f"unsupported protobuf wire type {wire}.")
        yield number, value


def wire_fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """``(field_number, value)`` of a protobuf message's wire bytes: varints as ints,
    length-delimited fields as bytes, fixed-width fields as their raw bytes."""
    return _fields(bytes(data))


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_serialization_options(data: Any) -> list[BlobOptions]:
    """The entries of a ``caffe2.SerializationOptions`` (message or its bytes):
    ``options`` (1) of ``{blob_name_regex (1), chunk_size (2), float_format (3)}``."""
    if data is None or data == b"" or data == "":
        return []
    if hasattr(data, "SerializeToString"):
        data = data.SerializeToString()
    data = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    entries = []
    for number, entry in _fields(data):
        if number != 1:
            continue
        values: dict[int, Any] = dict(_fields(entry))
        regex = values.get(1, b"")
        entries.append(BlobOptions(
            regex.decode("utf-8") if isinstance(regex, bytes) else "",
            _signed64(int(values.get(2, 0))), int(values.get(3, 0))))
    return entries


def options_for(name: str, options: list[BlobOptions]) -> BlobOptions:
    """The first entry that matches ``name`` (empty regex matches all), else the defaults."""
    for entry in options:
        if entry.matches(name):
            return entry
    return BlobOptions()


# --- fast TensorProtos decoding (DB input records) -------------------------------------------
def _decode_varints(buf: bytes) -> np.ndarray:
    """All varints in ``buf`` (a packed field) as int64, decoded without a Python loop."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(raw < 0x80)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        raise TensorProtoError("a packed varint field is truncated.")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    group = np.repeat(np.arange(ends.size), ends - starts + 1)
    shifts = (7 * (np.arange(raw.size) - starts[group])).astype(np.uint64)
    parts = (raw & 0x7F).astype(np.uint64) << shifts
    return np.bitwise_or.reduceat(parts, starts).view(np.int64)


_FIXED: dict[int, np.dtype] = {3: np.dtype("<f4"), 9: np.dtype("<f8")}
_VARINT_FIELDS = {1, 4, 10}


def _tensor_fields(data: bytes) -> dict[int, list[Any]]:
    """``{field: [values]}`` of one TensorProto; packed numeric fields come as arrays."""
    fields: dict[int, list[Any]] = {}
    for number, value in _fields(data):
        if isinstance(value, bytes) and number in _FIXED:
            value = np.frombuffer(value, dtype=_FIXED[number])
        elif isinstance(value, bytes) and number in _VARINT_FIELDS:
            value = _decode_varints(value)
        fields.setdefault(number, []).append(value)
    return fields


def _join(parts: list[Any], dtype: Any) -> np.ndarray:
    arrays = [np.frombuffer(p, dtype) if isinstance(p, bytes) and len(p) in (4, 8)
              and np.dtype(dtype).itemsize == len(p) else np.asarray(p, dtype=dtype).reshape(-1)
              for p in parts]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _fast_tensor(data: bytes, where: str) -> np.ndarray:
    fields = _tensor_fields(data)
    dims = _join(fields.get(1, []), np.int64) if 1 in fields else np.zeros(0, np.int64)
    data_type = int(fields[2][-1]) if 2 in fields else DT.FLOAT
    proto_like = DT(dims=dims.tolist())
    numel = _numel(proto_like, where)
    if data_type == DT.UNDEFINED and numel == 0:
        return np.zeros((0,), np.float32)
    dtype = DATA_TYPE_TO_NUMPY.get(data_type)
    if dtype is None:
        raise TensorProtoError(f"{where}: unsupported TensorProto data_type {data_type}.")
    if 13 in fields or 11 in fields or (15 in fields and fields[15][-1]):
        return tensor_proto_to_numpy(DT.FromString(data), where)  # rare layouts: full parse
    if data_type == DT.STRING:
        values = np.empty(len(fields.get(6, [])), dtype=object)
        values[:] = fields.get(6, [])
    elif data_type in BYTE_HOLDER_TYPES and (5 in fields or data_type == DT.BYTE):
        buf = b"".join(fields.get(5, []))
        if len(buf) != numel * dtype.itemsize:
            raise TensorProtoError(f"{where}: incorrect data size: byte_data holds {len(buf)} "
                                   f"bytes for {numel} {dtype} values.")
        values = np.frombuffer(buf, dtype=dtype.newbyteorder("<"))
    elif data_type == DT.FLOAT:
        values = _join(fields.get(3, []), "<f4")
    elif data_type == DT.DOUBLE:
        values = _join(fields.get(9, []), "<f8")
    elif data_type == DT.INT64:
        values = _join(fields.get(10, []), np.int64)
    else:
        ints = _join(fields.get(4, []), np.int64)
        values = ints.astype(np.uint16).view(np.float16) if data_type == DT.FLOAT16 \
            else ints.astype(dtype)
    if values.size != numel:
        raise TensorProtoError(f"{where}: Incorrect proto field size: dims {dims.tolist()} "
                               f"need {numel} values, found {values.size}.")
    return values.reshape(tuple(dims.tolist()))


def decode_tensor_protos(data: bytes, where: str = "") -> list[np.ndarray]:
    """The tensors of a serialized ``TensorProtos`` record, decoded straight from the wire
    (as ``TensorProtos.FromString`` + :func:`tensor_proto_to_numpy`, without per-element
    Python objects).  ``device_detail`` is ignored; a missing data_type means FLOAT."""
    where = where or "TensorProtos record"
    try:
        parts = [value for number, value in _fields(bytes(data)) if number == 1]
        if not all(isinstance(part, bytes) for part in parts):
            raise TensorProtoError("a protos entry is not a length-delimited message")
        return [_fast_tensor(part, f"{where}, proto {i}") for i, part in enumerate(parts)]
    except ResourceLimitError:
        raise
    # ValueError includes TensorProtoError; TypeError: a field of the wrong wire type
    except (DecodeError, ValueError, TypeError, OverflowError) as error:
        raise CorruptDataError(
            f"{where}: not a serialized TensorProtos ({error}); the record is corrupt or of "
            "another type (a Save record? read it with Load; a CaffeDatum? use ImageInput "
            "with use_caffe_datum=1).") from None
