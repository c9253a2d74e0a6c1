"""The one serializer (dpgraph.ir.blob_serde): Caffe2's field layout for every dtype,
devices, chunk assembly rules, the accepted alternative encodings and the DB reader blob."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpgraph.db import DBReader, Mode, create_db
from dpgraph.errors import CorruptDataError, SerializationError
from dpgraph.ir.blob_serde import (
    FLOAT_BFLOAT16,
    BlobAssembler,
    BlobOptions,
    decode_tensor_protos,
    deserialize_blob,
    numpy_to_tensor_proto,
    options_for,
    parse_serialization_options,
    serialize_blob,
    serialize_blob_chunks,
)
from dpgraph.ir.protos_batch import decode_tensor_protos_batch
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


@pytest.mark.parametrize("dtype, data_type, field", [
    (np.float32, DT.FLOAT, "float_data"), (np.float64, DT.DOUBLE, "double_data"),
    (np.int32, DT.INT32, "int32_data"), (np.int64, DT.INT64, "int64_data"),
    (np.bool_, DT.BOOL, "int32_data"), (np.uint8, DT.UINT8, "int32_data"),
    (np.int8, DT.INT8, "int32_data"), (np.uint16, DT.UINT16, "int32_data"),
    (np.int16, DT.INT16, "int32_data"), (np.float16, DT.FLOAT16, "int32_data"),
])
def test_fields_per_dtype(dtype: type, data_type: int, field: str) -> None:
    array = np.array([[1, 0, 1], [0, 1, 1]]).astype(dtype)
    proto = caffe2_pb2.BlobProto.FromString(serialize_blob("b", array))
    tensor = proto.tensor
    assert proto.type == "Tensor" and tensor.data_type == data_type
    assert list(tensor.dims) == [2, 3] and len(getattr(tensor, field)) == 6
    assert (tensor.segment.begin, tensor.segment.end) == (0, 6)
    assert tensor.device_detail.device_type == 0 and tensor.HasField("device_detail")
    assert tensor.HasField("data_format") == (dtype is np.float32)
    if dtype is np.float16:
        assert list(tensor.int32_data) == array.reshape(-1).view(np.uint16).tolist()
    assert deserialize_blob(proto.SerializeToString())[1].dtype == np.dtype(dtype)


def test_gpu_device_detail_and_assembled_device() -> None:
    data = serialize_blob("g", np.ones(2, np.float32), (1, 3))
    tensor = caffe2_pb2.BlobProto.FromString(data).tensor
    assert (tensor.device_detail.device_type, tensor.device_detail.device_id) == (1, 3)
    blob = BlobAssembler("g")
    blob.add(caffe2_pb2.BlobProto.FromString(data))
    assert blob.device == (1, 3)


def test_byte_data_and_raw_data_are_accepted() -> None:
    values = np.array([-3, 7], np.int16)
    tensor = DT(dims=[2], data_type=DT.INT16, byte_data=values.astype("<i2").tobytes())
    proto = caffe2_pb2.BlobProto(name="x", type="Tensor", tensor=tensor)
    np.testing.assert_array_equal(deserialize_blob(proto.SerializeToString())[1], values)
    tensor = DT(dims=[2], data_type=DT.INT16, byte_data=b"\x00")
    proto = caffe2_pb2.BlobProto(name="x", type="Tensor", tensor=tensor)
    with pytest.raises(SerializationError, match="incorrect data size"):
        deserialize_blob(proto.SerializeToString())


def test_missing_data_type_and_undefined_empty() -> None:
    proto = caffe2_pb2.BlobProto(name="x", type="Tensor", tensor=DT(dims=[1], float_data=[1]))
    with pytest.raises(SerializationError, match="unrecognized data type"):
        deserialize_blob(proto.SerializeToString())
    proto = caffe2_pb2.BlobProto(name="x", type="Tensor",
                                 tensor=DT(dims=[0, 3], data_type=DT.UNDEFINED))
    value = deserialize_blob(proto.SerializeToString())[1]
    assert value.dtype == np.float32 and value.shape == (0,)


def test_chunk_rules() -> None:
    chunks = list(serialize_blob_chunks("w", np.arange(10, dtype=np.int64), chunk_size=4))
    assert [k for k, _ in chunks] == ["w#%0", "w#%1", "w#%2"]
    blob = BlobAssembler("w")
    for _, data in reversed(chunks):
        blob.add(caffe2_pb2.BlobProto.FromString(data))
    np.testing.assert_array_equal(blob.value, np.arange(10))
    with pytest.raises(CorruptDataError, match="extra part"):
        blob.add(caffe2_pb2.BlobProto.FromString(chunks[0][1]))
    partial = BlobAssembler("w")
    partial.add(caffe2_pb2.BlobProto.FromString(chunks[0][1]))
    with pytest.raises(CorruptDataError, match="Data size mismatch for blob w. Expected: 10 "
                                               "Read: 4"):
        partial.check_complete()
    empty = list(serialize_blob_chunks("e", np.zeros((0, 3), np.float32)))
    assert len(empty) == 1
    assert deserialize_blob(empty[0][1])[1].shape == (0, 3)


def test_bfloat16_float_format() -> None:
    array = np.array([1.0, -2.5, 3.140625], np.float32)
    (_, data), = serialize_blob_chunks("b", array, float_format=FLOAT_BFLOAT16)
    tensor = caffe2_pb2.BlobProto.FromString(data).tensor
    assert tensor.data_format == 1 and len(tensor.raw_data) == 6
    np.testing.assert_array_equal(deserialize_blob(data)[1], array)


def test_serialization_options_parse_and_precedence() -> None:
    message = (b"\x0a\x08\x0a\x04a.*b\x10\x05" + b"\x0a\x02\x10\x07")
    entries = parse_serialization_options(message)
    assert entries == [BlobOptions("a.*b", 5, 0), BlobOptions("", 7, 0)]
    assert options_for("axxb", entries).chunk_size == 5
    assert options_for("ab_not_full", entries).chunk_size == 7
    assert BlobOptions("", 0).resolved_chunk_size() == 1_000_000
    assert BlobOptions("", -1).resolved_chunk_size() == -1


def test_string_blob_layout_and_string_tensor() -> None:
    assert serialize_blob("s", b"hi") == bytes.fromhex("0a0173120b7374643a3a737472696e67220268"
                                                       "69")
    value = np.array([b"a", "b"], dtype=object)
    back = deserialize_blob(serialize_blob("t", value))[1]
    assert back.dtype == object and back.tolist() == [b"a", b"b"]
    with pytest.raises(SerializationError):
        serialize_blob("bad", np.array([object()], dtype=object))


def test_fast_tensor_protos_decoding_matches_protobuf() -> None:
    records = []
    for j in range(5):
        protos = caffe2_pb2.TensorProtos()
        protos.protos.add().CopyFrom(numpy_to_tensor_proto(np.full((2, 2), j, np.float32)))
        protos.protos.add(data_type=DT.INT32, int32_data=[j * 100 - 150])  # multi-byte
        protos.protos.add().CopyFrom(numpy_to_tensor_proto(np.array([j], np.int64)))
        records.append(protos.SerializeToString())
    data, label, extra = decode_tensor_protos_batch(records)
    assert data.shape == (5, 2, 2) and label.dtype == np.int32 and extra.shape == (5, 1)
    np.testing.assert_array_equal(label, [j * 100 - 150 for j in range(5)])
    assert decode_tensor_protos(records[1])[0].dtype == np.float32


def test_db_reader_blob_serializes_its_position(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    db = create_db("lmdb", path, Mode.new)
    txn = db.new_transaction()
    for key in ("a", "b", "c"):
        txn.put(key, key)
    del txn
    db.close()
    reader = DBReader("lmdb", path)
    reader.read()
    data = serialize_blob("reader", reader)
    proto = caffe2_pb2.BlobProto.FromString(data)
    assert proto.type == "DBReader"
    assert caffe2_pb2.DBReaderProto.FromString(proto.content).key == "b"
    copy = deserialize_blob(data)[1]
    assert copy.read() == (b"b", b"b")


@pytest.mark.parametrize("array", [np.array([1.0, 2.0], np.float32), np.float64(2.5),
                                   np.zeros((0, 3), np.float32), np.arange(35.0).reshape(5, 7),
                                   np.linspace(0, 1, 1000, dtype=np.float32)])
@pytest.mark.parametrize("device", [None, (1, 2)])
@pytest.mark.parametrize("chunk_size", [0, 3, 400])
def test_fast_float_chunks_equal_protobuf_serialization(array: np.ndarray, device: object,
                                                       chunk_size: int) -> None:
    """float32/float64 chunks are built from the array bytes; they must be the bytes
    protobuf writes for tensor_chunk's message (field-number order)."""
    from dpgraph.ir.blob_serde import chunk_count, tensor_chunk

    values = np.asarray(array)
    size = chunk_size if chunk_size > 0 else values.size + 1
    expected = []
    for k in range(chunk_count(values.size, size)):
        proto = caffe2_pb2.BlobProto(name="w", type="Tensor")
        proto.tensor.CopyFrom(tensor_chunk(values, "w", k * size,
                                           min(values.size, (k + 1) * size), device))
        expected.append((f"w#%{k}", proto.SerializeToString()))
    assert list(serialize_blob_chunks("w", array, device, chunk_size)) == expected
