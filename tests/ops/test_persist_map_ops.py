"""Map blobs (CreateMap, KeyValueToMap, MapToKeyValue) and their Caffe2 wire format
through Save/Load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError
from dpgraph.ir.blob_serde import deserialize_blob, serialize_blob
from dpgraph.ops.map_ops import MapBlob
from dpgraph.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def _fresh() -> None:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _run(op_type: str, inputs: list[str], outputs: list[str], **kwargs: object) -> None:
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


@pytest.mark.parametrize("key,value", [(np.int32, np.int64), (np.int64, np.int32)])
def test_save_load_round_trip(tmp_path: Path, key: type, value: type) -> None:
    workspace.FeedBlob("k", np.array([5, 1, 5, 9], dtype=key))
    workspace.FeedBlob("v", np.array([7, 8, 0, 6], dtype=value))
    _run("KeyValueToMap", ["k", "v"], ["m"])
    _run("Save", ["m"], [], db=str(tmp_path / "db"), db_type="minidb", absolute_path=1)
    workspace.ResetWorkspace()
    _run("Load", [], [], db=str(tmp_path / "db"), db_type="minidb", absolute_path=1,
         load_all=1)
    _run("MapToKeyValue", ["m"], ["k2", "v2"])
    keys, values = workspace.FetchBlob("k2"), workspace.FetchBlob("v2")
    assert keys.dtype == key and values.dtype == value
    assert dict(zip(keys.tolist(), values.tolist())) == {5: 7, 1: 8, 9: 6}  # first 5 wins


def test_wire_layout() -> None:
    blob = MapBlob(np.int64, np.int32, {3: 4})
    proto = caffe2_pb2.BlobProto.FromString(serialize_blob("m", blob))
    assert proto.type == "(std::unordered_map<int64_t, int32_t>)"
    protos = caffe2_pb2.TensorProtos.FromString(proto.content)
    assert [list(p.int64_data) for p in protos.protos[:1]] == [[3]]
    assert list(protos.protos[1].int32_data) == [4]
    assert protos.protos[0].data_type == caffe2_pb2.TensorProto.INT64
    name, back = deserialize_blob(proto.SerializeToString())
    assert name == "m" and back == {3: 4} and back.value_dtype == np.int32


def test_create_map_and_errors() -> None:
    _run("CreateMap", [], ["m"], key_dtype=core.DataType.INT64)
    created = workspace.FetchBlob("m")
    assert created == {} and created.key_dtype == np.int64 and created.value_dtype == np.int32
    with pytest.raises(ArgumentError):
        _run("CreateMap", [], ["m"], key_dtype=core.DataType.FLOAT)
    workspace.FeedBlob("k", np.array([1, 2], dtype=np.int32))
    workspace.FeedBlob("v", np.array([1], dtype=np.int32))
    with pytest.raises(RuntimeError):
        _run("KeyValueToMap", ["k", "v"], ["m"])
