"""ImageInput records: TensorProtos (encoded or raw image, label, extras, bounding box) and
CaffeDatum, parsed into one :class:`ImageRecord` each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from dpgraph.errors import DataInputError
from dpgraph.ir.blob_serde import wire_fields
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto
SINGLE_LABEL, MULTI_LABEL_SPARSE, MULTI_LABEL_DENSE = 0, 1, 2
MULTI_LABEL_WEIGHTED_SPARSE, SINGLE_LABEL_WEIGHTED, EMBEDDING_LABEL = 3, 4, 5


@dataclass
class ImageRecord:
    """One record: ``encoded`` bytes or ``pixels`` (HWC uint8, BGR), the label values and
    their dtype, the label weights (type 3), extra outputs and a bounding box."""

    encoded: bytes | None = None
    pixels: np.ndarray | None = None
    label: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    weights: np.ndarray | None = None
    extras: list[np.ndarray] = field(default_factory=list)
    bbox: tuple[int, int, int, int] | None = None


def _label(proto: Any, where: str) -> np.ndarray:
    if proto.data_type not in (DT.INT32, DT.FLOAT):
        raise DataInputError(f"{where}: the label proto must be INT32 or FLOAT, got data_type "
                             f"{proto.data_type}.")
    values = proto.int32_data if proto.data_type == DT.INT32 else proto.float_data
    return np.asarray(values, dtype=np.int32 if proto.data_type == DT.INT32 else np.float32)


def _extra(proto: Any, where: str) -> np.ndarray:
    if proto.data_type == DT.UINT8:
        return np.asarray(proto.int32_data, dtype=np.uint8)
    fields = {DT.FLOAT: ("float_data", np.float32), DT.INT32: ("int32_data", np.int32),
              DT.INT64: ("int64_data", np.int64)}
    if proto.data_type not in fields:
        raise DataInputError(f"{where}: additional outputs must be FLOAT, INT32, INT64 or UINT8,"
                             f" got data_type {proto.data_type}.")
    name, dtype = fields[proto.data_type]
    return np.asarray(getattr(proto, name), dtype=dtype)


def _image(record: ImageRecord, proto: Any, where: str) -> None:
    if proto.data_type == DT.STRING:
        if not proto.string_data:
            raise DataInputError(f"{where}: the image proto holds no encoded image.")
        record.encoded = bytes(proto.string_data[0])
    elif proto.data_type == DT.BYTE:
        dims = list(proto.dims)
        if len(dims) not in (2, 3) or (len(dims) == 3 and dims[2] not in (1, 3)):
            raise DataInputError(f"{where}: a raw (BYTE) image needs dims [H, W] or [H, W, C] "
                                 f"with C 1 or 3, got {dims}.")
        pixels = np.frombuffer(proto.byte_data, dtype=np.uint8)
        if pixels.size != int(np.prod(dims)):
            raise DataInputError(f"{where}: byte_data holds {pixels.size} bytes for dims {dims}.")
        record.pixels = pixels.reshape(dims[0], dims[1], dims[2] if len(dims) == 3 else 1)
    else:
        raise DataInputError(f"{where}: Unknown image data type {proto.data_type}; the image "
                             "must be STRING (encoded) or BYTE (raw HWC pixels).")


def parse_tensor_protos(value: bytes, label_type: int, num_extra: int,
                        where: str) -> ImageRecord:
    """An ImageInput TensorProtos record (see the module docstring of ops/image_input)."""
    try:
        protos = caffe2_pb2.TensorProtos.FromString(value).protos
    except DecodeError as error:
        raise DataInputError(f"{where}: not a TensorProtos record ({error}); CaffeDatum "
                             "records need use_caffe_datum=1.") from None
    offset = 3 if label_type in (MULTI_LABEL_WEIGHTED_SPARSE, SINGLE_LABEL_WEIGHTED) else 2
    if len(protos) < offset + num_extra:
        raise DataInputError(f"{where}: the record holds {len(protos)} TensorProtos, label type "
                             f"{label_type} with {num_extra} additional outputs needs "
                             f"{offset + num_extra}.")
    record = ImageRecord()
    _image(record, protos[0], where)
    record.label = _label(protos[1], where)
    if label_type == MULTI_LABEL_WEIGHTED_SPARSE:
        record.weights = np.asarray(protos[2].float_data, dtype=np.float32)
    record.extras = [_extra(protos[offset + i], where) for i in range(num_extra)]
    if len(protos) == offset + num_extra + 1:
        box = list(protos[-1].int32_data)
        if len(box) == 4:
            record.bbox = (box[0], box[1], box[2], box[3])
    return record


_DATUM_INTS = {1: "channels", 2: "height", 3: "width", 5: "label", 7: "encoded"}


def _datum_fields(value: bytes, where: str) -> dict[int, Any]:
    """The CaffeDatum's fields; wire-level garbage or a field of the wrong wire type raises
    DataInputError."""
    fields: dict[int, Any] = {}
    try:
        for number, item in wire_fields(value):
            fields[number] = item
    except ValueError as error:  # the wire reader's TensorProtoError
        raise DataInputError(f"{where}: not a CaffeDatum record ({error}).") from None
    for number, name in _DATUM_INTS.items():
        if not isinstance(fields.get(number, 0), int):
            raise DataInputError(f"{where}: not a CaffeDatum record (field {name} is not an "
                                 "integer).")
    if not isinstance(fields.get(4, b""), bytes):
        raise DataInputError(f"{where}: not a CaffeDatum record (field data is not bytes).")
    return fields


def parse_caffe_datum(value: bytes, where: str) -> ImageRecord:
    """A CaffeDatum: channels (1), height (2), width (3), data (4), label (5), encoded (7)."""
    fields = _datum_fields(value, where)
    # int32 label: the varint's low 32 bits, as protobuf reads it (negatives sign-extended)
    label = np.array([fields.get(5, 0) & 0xFFFFFFFF], dtype=np.uint32).view(np.int32)
    record = ImageRecord(label=label)
    data = fields.get(4, b"")
    if fields.get(7, 0):
        record.encoded = bytes(data)
        return record
    channels, height, width = fields.get(1, 0), fields.get(2, 0), fields.get(3, 0)
    if channels not in (1, 3) or len(data) != channels * height * width:
        raise DataInputError(f"{where}: raw CaffeDatum needs 1 or 3 channels and C*H*W bytes; "
                             f"got {channels}x{height}x{width} and {len(data)} bytes.")
    chw = np.frombuffer(data, dtype=np.uint8).reshape(channels, height, width)
    record.pixels = np.ascontiguousarray(chw.transpose(1, 2, 0))
    return record
