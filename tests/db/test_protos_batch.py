"""Batched TensorProtos decoding (the TensorProtosDBInput fast path) and the reader's
batch reads it is fed by."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgraph.db import DBReader, Mode, create_db
from dpgraph.errors import CorruptDataError, SerializationError
from dpgraph.ir import protos_batch
from dpgraph.ir.blob_serde import decode_tensor_protos, numpy_to_tensor_proto
from dpgraph.ir.protos_batch import decode_joined_tensor_protos, decode_tensor_protos_batch
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


def _record(*protos: Any) -> bytes:
    record = caffe2_pb2.TensorProtos()
    for proto in protos:
        record.protos.add().CopyFrom(proto)
    return record.SerializeToString()


def _example(j: int, label: int) -> bytes:
    """lmdb_create_example's record: FLOAT [3, 4, 2] image and an INT32 label, no dims."""
    image = DT(data_type=DT.FLOAT, dims=[3, 4, 2])
    image.float_data.extend(np.arange(24, dtype=np.float32) + j)
    return _record(image, DT(data_type=DT.INT32, int32_data=[label]))


def _per_record(values: list[bytes]) -> list[np.ndarray]:
    records = [decode_tensor_protos(v) for v in values]
    return [np.stack([r[i] for r in records]) for i in range(len(records[0]))]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.fixture
def fast_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("the batch went record by record")
    monkeypatch.setattr(protos_batch, "_stack_slow", refuse)


def test_same_layout_records_take_the_fast_path(fast_path_only: None) -> None:
    values = [_example(j, j % 10) for j in range(6)]
    data, label = decode_tensor_protos_batch(values)
    assert data.shape == (6, 3, 4, 2) and data.dtype == np.float32
    assert label.shape == (6,) and label.dtype == np.int32
    np.testing.assert_array_equal(data[4], np.arange(24, dtype=np.float32).reshape(3, 4, 2) + 4)
    np.testing.assert_array_equal(label, [0, 1, 2, 3, 4, 5])


def test_labels_of_different_varint_lengths_are_decoded_per_length(fast_path_only: None
                                                                     ) -> None:
    labels = [5, 500, -3, 127, 128, 999, 70000, 2**31 - 1, -(2**31)]
    values = [_example(j, label) for j, label in enumerate(labels)]
    data, label = decode_tensor_protos_batch(values)
    np.testing.assert_array_equal(label, labels)
    _assert_same([data, label], _per_record(values))


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float64).reshape(2, 3),
    np.array([[1, -2], [2**40, -(2**40)]], dtype=np.int64),
    np.array([0, 7, 255], dtype=np.uint8),
    np.array([True, False, True]),
    np.array([-5, 300, 7], dtype=np.int16),
    np.array([[1, 2], [3, 4]], dtype=np.int32),
])
def test_every_numeric_field_matches_the_record_decoder(array: np.ndarray) -> None:
    values = [_record(numpy_to_tensor_proto(array * (j + 1) if array.dtype != bool else array),
                      DT(data_type=DT.INT64, dims=[2], int64_data=[j, -j]))
              for j in range(4)]
    _assert_same(decode_tensor_protos_batch(values), _per_record(values))


def test_uint8_in_int32_data_and_raw_data_match_the_record_decoder() -> None:
    as_ints = [_record(DT(data_type=DT.UINT8, dims=[3], int32_data=[j, 200, 3]))
               for j in range(3)]
    _assert_same(decode_tensor_protos_batch(as_ints), _per_record(as_ints))
    raw = [_record(DT(data_type=DT.FLOAT, dims=[2],
                      raw_data=np.array([j, 0.5], "<f4").tobytes())) for j in range(3)]
    _assert_same(decode_tensor_protos_batch(raw), _per_record(raw))


def test_records_of_one_length_but_another_layout_are_not_mixed_up() -> None:
    first = [_record(numpy_to_tensor_proto(np.ones((2, 3), np.float32)))] * 2
    second = [_record(numpy_to_tensor_proto(np.ones((3, 2), np.float32)))] * 2
    assert len(first[0]) == len(second[0])
    assert decode_tensor_protos_batch(first)[0].shape == (2, 2, 3)
    assert decode_tensor_protos_batch(second)[0].shape == (2, 3, 2)  # not the cached layout
    with pytest.raises(SerializationError, match=r"key b'k2'.*dims \[3, 2\].*\[2, 3\]"):
        decode_tensor_protos_batch(first + second, "reader", [b"k0", b"k1", b"k2", b"k3"])


def test_a_corrupt_record_is_named_by_key() -> None:
    values = [_example(0, 1), _example(1, 2)[:-10]]
    with pytest.raises(CorruptDataError, match=r"key b'b' \(record 1 of the batch\)"):
        decode_tensor_protos_batch(values, "TensorProtosDBInput", [b"a", b"b"])


def test_outputs_are_writable_copies_even_for_one_record() -> None:
    joined = _example(0, 3)
    data, label = decode_joined_tensor_protos(joined, [len(joined)])
    assert data.flags.writeable and data.flags.c_contiguous and label.flags.writeable
    data[...] = -1
    assert decode_joined_tensor_protos(joined, [len(joined)])[0].min() == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1),
                          st.lists(st.floats(width=32, allow_nan=False), min_size=2,
                                   max_size=2)),
                min_size=1, max_size=8),
       st.sampled_from([DT.INT32, DT.INT64]))
def test_batches_equal_record_by_record_decoding(rows: list[Any], label_type: int) -> None:
    values = []
    for label, pixels in rows:
        label_proto = DT(data_type=label_type)
        (label_proto.int32_data if label_type == DT.INT32 else label_proto.int64_data).append(
            label)
        values.append(_record(DT(data_type=DT.FLOAT, dims=[2], float_data=pixels),
                              label_proto))
    _assert_same(decode_tensor_protos_batch(values), _per_record(values))


# --- the reader's batch reads ------------------------------------------------------------------
def _lmdb(path: Path, count: int) -> str:
    db = create_db("lmdb", str(path), Mode.new)
    txn = db.new_transaction()
    for j in range(count):
        txn.put(f"{j:02d}", _example(j, j))
    txn.commit()
    db.close()
    return str(path)


def test_read_joined_wraps_around_as_read_batch_does(tmp_path: Path) -> None:
    path = _lmdb(tmp_path / "db", 5)
    joined_reader, batch_reader = DBReader("lmdb", path), DBReader("lmdb", path)
    for _ in range(3):
        keys, lengths, joined = joined_reader.read_joined(4)
        batch_keys, values = batch_reader.read_batch(4)
        assert keys == batch_keys and joined == b"".join(values)
        assert lengths == [len(v) for v in values]
    assert keys == [b"03", b"04", b"00", b"01"]  # records 8..11 of 5: wrapped around
    joined_reader.close()
    batch_reader.close()


def test_sharded_readers_take_disjoint_records(tmp_path: Path) -> None:
    path = _lmdb(tmp_path / "db", 5)
    shard = DBReader("lmdb", path, num_shards=2, shard_id=1)
    assert shard.read_joined(4)[0] == [b"01", b"03", b"01", b"03"]
    shard.close()


def test_lmdb_read_run_stops_at_the_end(tmp_path: Path) -> None:
    db = create_db("lmdb", _lmdb(tmp_path / "db", 3), Mode.read)
    cursor = db.new_cursor()
    assert [bytes(k) for k, _ in cursor.read_run(2)] == [b"00", b"01"] and cursor.valid()
    assert cursor.key() == b"02"
    assert [bytes(k) for k, _ in cursor.read_run(1)] == [b"02"] and not cursor.valid()
    assert cursor.read_run(4) == []
    cursor.seek_to_first()
    assert len(cursor.read_run(9)) == 3 and not cursor.valid()
    cursor.close()
    db.close()


def test_minidb_uses_the_generic_read_run(tmp_path: Path) -> None:
    db = create_db("minidb", str(tmp_path / "m"), Mode.new)
    txn = db.new_transaction()
    for j in range(3):
        txn.put(f"{j}", _example(j, j))
    txn.commit()
    db.close()
    reader = DBReader("minidb", str(tmp_path / "m"))
    keys, lengths, joined = reader.read_joined(4)
    assert keys == [b"0", b"1", b"2", b"0"]
    np.testing.assert_array_equal(decode_joined_tensor_protos(joined, lengths)[1], [0, 1, 2, 0])
    reader.close()


def test_corrupt_records_fail_as_the_record_decoder_says() -> None:
    """The fast path never accepts what protobuf rejects: a packed varint cut short, a
    negative dim (next to a 0 dim, so the element count still matches)."""
    payload = bytes([5, 0x85])  # int32_data [5, <a varint cut short>]
    proto = b"\x08\x01\x10\x02\x22" + bytes([len(payload)]) + payload  # dims [1], INT32
    truncated = b"\x0a" + bytes([len(proto)]) + proto  # (lengths < 128: one-byte varints)
    negative = _record(DT(data_type=DT.FLOAT, dims=[0, -1], raw_data=b""))
    for record in (truncated, negative):
        with pytest.raises(CorruptDataError, match=r"record 0 of the batch"):
            decode_tensor_protos_batch([record, record])


def test_records_of_another_data_type_are_refused_not_cast() -> None:
    values = [_record(DT(data_type=DT.UINT8, dims=[2], int32_data=[1, 2])),
              _record(DT(data_type=DT.INT32, dims=[2], int32_data=[70000, 300]))]
    with pytest.raises(SerializationError, match=r"record 1 of the batch\): proto 0 holds "
                                                 r"int32, the first record of the batch uint8"):
        decode_tensor_protos_batch(values)
