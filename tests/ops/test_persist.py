"""Save / Load / Checkpoint: every dtype through minidb, lmdb and leveldb, Caffe2's byte
layout, chunking and options, prefixes and overrides, and every error Caffe2 raises."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import DBError
from dpgraph.ir.blob_serde import KEY_SEPARATOR
from dpgraph.proto import caffe2_pb2

DTYPES = [np.float16, np.float32, np.float64, np.bool_, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint16]
DB_TYPES = ["minidb", "lmdb", "leveldb"]


def _values(dtype: type) -> np.ndarray:
    if dtype is np.bool_:
        return np.array([[True, False, True], [False, False, True]])
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        return np.array([[info.min, 0, 1], [2, info.max - 1, info.max]], dtype=dtype)
    return (np.arange(6).reshape(2, 3) * 1.25 - 2).astype(dtype)


def _run(op_type: str, inputs: list[str], outputs: list[str], **kwargs: object) -> None:
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


def _save(path: Path, names: list[str], db_type: str = "minidb", **kwargs: object) -> None:
    _run("Save", names, [], db=str(path), db_type=db_type, absolute_path=1, **kwargs)


def _load(path: Path | list[Path], outputs: list[str], db_type: str = "minidb",
          **kwargs: object) -> None:
    where = {"dbs": [str(p) for p in path]} if isinstance(path, list) else {"db": str(path)}
    _run("Load", [], outputs, db_type=db_type, absolute_path=1, **where, **kwargs)


def _records(path: Path) -> list[tuple[bytes, bytes]]:
    """minidb records parsed independently of dpgraph's reader."""
    data, pos, out = path.read_bytes(), 0, []
    header = struct.Struct("=ii")
    while pos < len(data):
        klen, vlen = header.unpack_from(data, pos)
        pos += 8
        out.append((data[pos:pos + klen], data[pos + klen:pos + klen + vlen]))
        pos += klen + vlen
    assert pos == len(data)
    return out


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_every_dtype_and_strings_round_trip(tmp_path: Path, db_type: str) -> None:
    if db_type == "leveldb":
        pytest.importorskip("plyvel")
    names = []
    for dtype in DTYPES:
        name = f"blob_{np.dtype(dtype).name}"
        workspace.FeedBlob(name, _values(dtype))
        names.append(name)
    workspace.FeedBlob("strings", np.array([b"a", b"", "\u00e9".encode()], dtype=object))
    workspace.FeedBlob("text", b"std::string blob")
    workspace.FeedBlob("scalar", np.float32(3.5))
    workspace.FeedBlob("empty", np.zeros((0, 3), np.int64))
    names += ["strings", "text", "scalar", "empty"]
    expected = {n: workspace.FetchBlob(n) for n in names}
    _save(tmp_path / "db", names, db_type)
    workspace.ResetWorkspace()
    _load(tmp_path / "db", names, db_type)
    for name in names:
        got = workspace.FetchBlob(name)
        if isinstance(expected[name], bytes):
            assert got == expected[name]
            continue
        assert got.dtype == expected[name].dtype and got.shape == expected[name].shape, name
        np.testing.assert_array_equal(got, expected[name])


def test_minidb_bytes_match_caffe2_layout(tmp_path: Path) -> None:
    workspace.FeedBlob("x", np.array([1.0, 2.0], np.float32))
    workspace.FeedBlob("s", b"hi")
    _save(tmp_path / "db", ["x", "s"])
    records = _records(tmp_path / "db")
    assert records[0][0] == b"x#%0"
    assert records[0][1] == bytes.fromhex(
        "0a0178120654656e736f721a1d080210011a080000803f000000403a0178420208005a040800100278"
        "00")
    assert records[1] == (b"s", bytes.fromhex("0a0173120b7374643a3a737472696e67220268 69"
                                              .replace(" ", "")))


def test_chunking_keys_and_any_chunk_order(tmp_path: Path) -> None:
    workspace.FeedBlob("w", np.arange(1234, dtype=np.float32))
    _save(tmp_path / "db", ["w"], chunk_size=32)
    records = _records(tmp_path / "db")
    assert [k for k, _ in records] == [f"w#%{k}".encode() for k in range(39)]
    last = caffe2_pb2.BlobProto.FromString(records[-1][1]).tensor
    assert list(last.dims) == [1234] and (last.segment.begin, last.segment.end) == (1216, 1234)
    reordered = tmp_path / "shuffled"
    with open(reordered, "wb") as out:  # Load accepts chunks in any order
        for key, value in records[::-1]:
            out.write(struct.pack("=ii", len(key), len(value)) + key + value)
    workspace.ResetWorkspace()
    _load(reordered, ["w"])
    np.testing.assert_array_equal(workspace.FetchBlob("w"), np.arange(1234, dtype=np.float32))


def test_default_chunk_size_is_a_million_elements(tmp_path: Path) -> None:
    workspace.FeedBlob("big", np.arange(1_000_010, dtype=np.int8))
    _save(tmp_path / "a", ["big"], chunk_size=-1)  # legacy -1 = the default chunk size
    assert [k for k, _ in _records(tmp_path / "a")] == [b"big#%0", b"big#%1"]
    _save(tmp_path / "b", ["big"], chunk_size=0)  # legacy 0 = no chunking
    assert len(_records(tmp_path / "b")) == 1
    workspace.ResetWorkspace()
    _load(tmp_path / "a", ["big"])
    np.testing.assert_array_equal(workspace.FetchBlob("big"), np.arange(1_000_010, dtype=np.int8))


def _options(*entries: tuple[str, int]) -> bytes:
    """Serialized caffe2.SerializationOptions{options: [{blob_name_regex, chunk_size}]}."""
    def varint(value: int) -> bytes:
        out = b""
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out

    message = b""
    for regex, size in entries:
        inner = b"\x0a" + varint(len(regex)) + regex.encode() + b"\x10" + varint(size)
        message += b"\x0a" + varint(len(inner)) + inner
    return message


def test_options_regex_precedence(tmp_path: Path) -> None:
    for name, dtype in (("int16_data", np.int16), ("uint16_data", np.uint16),
                        ("float16_data", np.float16), ("int64_data", np.int64)):
        workspace.FeedBlob(name, np.arange(100).astype(dtype))
    names = ["int16_data", "uint16_data", "float16_data", "int64_data"]
    _save(tmp_path / "db", names, chunk_size=40,
          options=_options(("int16_data", 10), (".*16_data", 20), ("float16_data", 30)))
    counts: dict[str, int] = {}
    for key, _ in _records(tmp_path / "db"):
        name = key.decode().rsplit(KEY_SEPARATOR, 1)[0]
        counts[name] = counts.get(name, 0) + 1
    assert counts == {"int16_data": 10, "uint16_data": 5, "float16_data": 5, "int64_data": 3}


def test_prefixes_overrides_and_source_names(tmp_path: Path) -> None:
    workspace.FeedBlob("gpu_0/w", np.ones(2, np.float32))
    workspace.FeedBlob("gpu_0/b", np.zeros(3, np.int32))
    _save(tmp_path / "s", ["gpu_0/w", "gpu_0/b"], strip_prefix="gpu_0/")
    assert [k for k, _ in _records(tmp_path / "s")] == [b"w#%0", b"b#%0"]
    _load(tmp_path / "s", ["cpu_1/w", "cpu_1/b"], load_all=1, add_prefix="cpu_1/")
    assert workspace.FetchBlob("cpu_1/b").dtype == np.int32
    _save(tmp_path / "o", ["gpu_0/w", "gpu_0/b"], blob_name_overrides=["W", "B"])
    _load(tmp_path / "o", ["w2"], source_blob_names=["W"])
    np.testing.assert_array_equal(workspace.FetchBlob("w2"), np.ones(2, np.float32))
    _load(tmp_path / "s", ["z/b"], strip_prefix="", add_prefix="z/")
    assert workspace.FetchBlob("z/b").shape == (3,)


@pytest.mark.parametrize("kwargs, message", [
    ({"strip_prefix": "gpu_0/", "blob_name_overrides": ["a", "b"]}, "mutually exclusive"),
    ({"blob_name_overrides": ["a"]}, "mismatch"),
    ({"blob_name_overrides": ["a", "a"]}, "Duplicated input"),
])
def test_save_argument_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    workspace.FeedBlob("gpu_0/a", np.ones(1))
    workspace.FeedBlob("gpu_0/b", np.ones(1))
    with pytest.raises(RuntimeError, match=message):
        _save(tmp_path / "db", ["gpu_0/a", "gpu_0/b"], **kwargs)
    assert not (tmp_path / "db").exists()


def test_save_repeated_inputs_and_missing_args(tmp_path: Path) -> None:
    workspace.FeedBlob("a", np.ones(1))
    with pytest.raises(RuntimeError, match="Duplicated input"):
        _save(tmp_path / "db", ["a", "a"])
    with pytest.raises(RuntimeError, match="Must specify a db type"):
        _run("Save", ["a"], [], db=str(tmp_path / "db"), absolute_path=1)
    with pytest.raises(RuntimeError, match="Must specify a db name"):
        _run("Save", ["a"], [], db_type="minidb")


def _saved_pair(tmp_path: Path) -> Path:
    workspace.FeedBlob("a", np.arange(4, dtype=np.float32))
    workspace.FeedBlob("b", np.arange(3, dtype=np.int64))
    _save(tmp_path / "db", ["a", "b"])
    return tmp_path / "db"


@pytest.mark.parametrize("outputs, kwargs, message", [
    (["a", "a"], {}, "Duplicated source blob name"),
    (["a"], {"source_blob_names": ["a", "b"]}, "mismatch"),
    (["a"], {"source_blob_names": ["a"], "load_all": 1}, "load_all"),
    (["zz"], {}, "Expected to load 1 blobs, got 0"),
    (["zz"], {"load_all": 1}, "Output blob name zz does not exist"),
])
def test_load_errors_leave_workspace_unchanged(tmp_path: Path, outputs: list[str],
                                               kwargs: dict, message: str) -> None:
    path = _saved_pair(tmp_path)
    workspace.FeedBlob("a", np.full(4, 7.0, np.float32))
    before = set(workspace.Blobs())
    with pytest.raises(RuntimeError, match=message):
        _load(path, outputs, **kwargs)
    assert set(workspace.Blobs()) == before
    np.testing.assert_array_equal(workspace.FetchBlob("a"), np.full(4, 7.0, np.float32))


def test_load_multiple_dbs_and_duplicates(tmp_path: Path) -> None:
    workspace.FeedBlob("a", np.ones(1, np.float32))
    _save(tmp_path / "one", ["a"])
    workspace.FeedBlob("b", np.ones(2, np.float32))
    _save(tmp_path / "two", ["b"])
    workspace.ResetWorkspace()
    _load([tmp_path / "one", tmp_path / "two"], ["a", "b"])
    assert workspace.FetchBlob("b").shape == (2,)
    with pytest.raises(RuntimeError, match="Duplicated db name"):
        _load([tmp_path / "one", tmp_path / "one"], ["a"])
    with pytest.raises(RuntimeError, match="Duplicate Key"):
        _load([tmp_path / "one", _copy(tmp_path / "one", tmp_path / "copy")], ["a"],
              load_all=1)


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def test_missing_truncated_and_wrong_type_files(tmp_path: Path) -> None:
    path = _saved_pair(tmp_path)
    with pytest.raises(RuntimeError, match="Cannot open file"):
        _load(tmp_path / "missing", ["a"])
    data = path.read_bytes()
    (tmp_path / "cut").write_bytes(data[:-5])
    with pytest.raises(RuntimeError, match=str(tmp_path / "cut")):
        _load(tmp_path / "cut", ["a", "b"])
    with open(tmp_path / "zeros", "wb") as out:  # Caffe2's testTruncatedFile leaves zeros
        out.write(b"\x00" * 20)
    with pytest.raises(RuntimeError):
        _load(tmp_path / "zeros", ["a"])
    junk = b"a#%0"
    (tmp_path / "junk").write_bytes(struct.pack("=ii", len(junk), 3) + junk + b"\xff\xff\xff")
    with pytest.raises(RuntimeError, match="key 'a#%0'"):  # a record that is no BlobProto
        _load(tmp_path / "junk", ["a"])
    np.testing.assert_array_equal(workspace.FetchBlob("a"), np.arange(4, dtype=np.float32))


def test_incomplete_chunks_are_a_size_mismatch(tmp_path: Path) -> None:
    workspace.FeedBlob("w", np.arange(100, dtype=np.float32))
    _save(tmp_path / "db", ["w"], chunk_size=30)
    records = _records(tmp_path / "db")
    with open(tmp_path / "partial", "wb") as out:
        for key, value in records[:2]:
            out.write(struct.pack("=ii", len(key), len(value)) + key + value)
    workspace.ResetWorkspace()
    with pytest.raises(RuntimeError, match="Data size mismatch for blob w"):
        _load(tmp_path / "partial", ["w"])
    assert not workspace.HasBlob("w")


def test_allow_incomplete_keeps_existing_blobs(tmp_path: Path) -> None:
    path = _saved_pair(tmp_path)
    workspace.FeedBlob("c", np.full(2, 5, np.int32))
    _load(path, ["a", "c", "never_there"], allow_incomplete=True)
    np.testing.assert_array_equal(workspace.FetchBlob("c"), [5, 5])
    assert workspace.FetchBlob("a").shape == (4,)
    assert not workspace.HasBlob("never_there")  # not loaded, no content before: removed


def test_root_folder_and_absolute_path(tmp_path: Path) -> None:
    workspace.ResetWorkspace(str(tmp_path / "root"))
    workspace.FeedBlob("a", np.ones(1, np.float32))
    _run("Save", ["a"], [], db="rel.db", db_type="minidb")
    assert (tmp_path / "root" / "rel.db").exists()
    _run("DBExists", [], ["exists"], db_name="rel.db", db_type="minidb")
    exists = workspace.FetchBlob("exists")
    assert exists.shape == () and exists.dtype == np.bool_ and bool(exists)
    _run("DBExists", [], ["exists"], db_name="nope.db", db_type="minidb")
    assert not workspace.FetchBlob("exists")


def test_load_from_db_reader_continues_at_cursor(tmp_path: Path) -> None:
    """The predictor exporter's pattern: META first from a reader, then the params."""
    workspace.FeedBlob("!!META_NET_DEF", b"meta")
    workspace.FeedBlob("w", np.ones(3, np.float32))
    workspace.FeedBlob("b", np.zeros(2, np.float32))
    _run("Save", ["!!META_NET_DEF", "w", "b"], [], db=str(tmp_path / "m"), db_type="minidb",
         absolute_path=True)
    workspace.ResetWorkspace()
    _run("CreateDB", [], ["reader"], db=str(tmp_path / "m"), db_type="minidb")
    _run("Load", ["reader"], ["!!META_NET_DEF"])
    assert workspace.FetchBlob("!!META_NET_DEF") == b"meta"
    _run("Load", ["reader"], ["w", "b"])
    assert workspace.FetchBlob("b").shape == (2,)


def test_keep_device_and_op_device_on_virtual_gpus(tmp_path: Path) -> None:
    workspace.SetVirtualGpus(2)
    gpu1 = core.DeviceOption(caffe2_pb2.CUDA, 1)
    workspace.FeedBlob("g", np.ones(2, np.float32), device_option=gpu1)
    _save(tmp_path / "db", ["g"])
    value = caffe2_pb2.BlobProto.FromString(_records(tmp_path / "db")[0][1])
    assert (value.tensor.device_detail.device_type, value.tensor.device_detail.device_id) == \
        (1, 1)
    workspace.ResetWorkspace()
    _load(tmp_path / "db", ["g"], keep_device=1)
    from dpgraph.runtime.api import current

    assert current().placement("g") == (1, 1)
    _load(tmp_path / "db", ["g"])
    assert current().placement("g") == (0, 0)
    op = core.CreateOperator("Load", [], ["g"], db=str(tmp_path / "db"), db_type="minidb",
                             absolute_path=1, device_option=core.DeviceOption(caffe2_pb2.CUDA, 0))
    workspace.RunOperatorOnce(op)
    assert current().placement("g") == (1, 0)


def test_checkpoint_every_n_iterations(tmp_path: Path) -> None:
    workspace.FeedBlob("w", np.ones(2, np.float32))
    pattern = str(tmp_path / "ckpt_%04d.db")
    for iteration in range(5):
        workspace.FeedBlob("iter", np.array([iteration], np.int64))
        _run("Checkpoint", ["iter", "w"], [], db=pattern, db_type="minidb", every=2,
             absolute_path=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["ckpt_0000.db", "ckpt_0002.db", "ckpt_0004.db"]
    assert [k for k, _ in _records(tmp_path / "ckpt_0002.db")] == [b"iter#%0", b"w#%0"]
    workspace.FeedBlob("iter", np.array([1], np.int32))
    with pytest.raises(RuntimeError, match="int64"):
        _run("Checkpoint", ["iter", "w"], [], db=pattern, db_type="minidb", absolute_path=1)


def test_lmdb_save_twice_fails_like_caffe2(tmp_path: Path) -> None:
    workspace.FeedBlob("a", np.ones(1))
    _save(tmp_path / "l", ["a"], "lmdb")
    with pytest.raises(RuntimeError, match="mkdir"):
        _save(tmp_path / "l", ["a"], "lmdb")
    assert isinstance(DBError("x"), RuntimeError)
