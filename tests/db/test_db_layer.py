"""The DB layer: registry, modes, minidb byte layout, lmdb/leveldb/protodb behaviour."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import lmdb
import numpy as np
import pytest

from dpgraph.db import DBReader, Mode, create_db, db_exists, register_db, registered_dbs
from dpgraph.db.minidb import MiniDB
from dpgraph.errors import CorruptDataError, DBError
from dpgraph.ir.blob_serde import numpy_to_tensor_proto
from dpgraph.proto import caffe2_pb2

PAIRS = [(f"key{i}".encode(), f"value{i}".encode()) for i in range(1, 10)]


def _read_all(db_type: str, path: str) -> list[tuple[bytes, bytes]]:
    db = create_db(db_type, path, Mode.read)
    cursor = db.new_cursor()
    out = []
    while cursor.valid():
        out.append((cursor.key(), cursor.value()))
        cursor.next()
    del cursor
    db.close()
    return out


def test_registry_names_and_modes() -> None:
    names = registered_dbs()
    for name in ("minidb", "MiniDB", "lmdb", "LMDB", "leveldb", "LevelDB", "protodb", "ProtoDB"):
        assert name in names
    assert create_db("nosuchdb", "/tmp/x", Mode.read) is None
    assert (Mode.read, Mode.write, Mode.new) == (0, 1, 2)
    assert Mode.READ is Mode.read


def test_minidb_db_test_py_pattern(tmp_path: Path) -> None:
    """Caffe2's db_test.py: append mode on an empty file, one transaction per put."""
    path = str(tmp_path / "db")
    Path(path).touch()
    db = create_db("minidb", path, Mode.write)
    for key, value in PAIRS:
        transaction = db.new_transaction()
        transaction.put(key, value)
        del transaction
    del db
    assert _read_all("minidb", path) == PAIRS


def test_minidb_bytes_are_the_documented_layout(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = create_db("minidb", path, Mode.new)
    txn = db.new_transaction()
    txn.put("ab", b"xyz")
    txn.put(b"k2", b"v" * 300)
    txn.commit()
    db.close()
    data = Path(path).read_bytes()
    assert data[:8] == struct.pack("=ii", 2, 3) and data[8:13] == b"abxyz"
    klen, vlen = struct.Struct("=ii").unpack_from(data, 13)
    assert (klen, vlen) == (2, 300) and len(data) == 13 + 8 + 302
    # WRITE appends, NEW truncates
    db = create_db("minidb", path, Mode.write)
    db.new_transaction().put(b"k3", b"v3")
    db.close()
    assert [k for k, _ in _read_all("minidb", path)] == [b"ab", b"k2", b"k3"]
    create_db("minidb", path, Mode.new).close()
    assert os.path.getsize(path) == 0 and _read_all("minidb", path) == []


def test_minidb_cursor_seek_to_first_and_invalid(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = create_db("minidb", path, Mode.new)
    db.new_transaction().put(b"a", b"1")
    db.close()
    cursor = create_db("minidb", path, Mode.read).new_cursor()
    assert cursor.supports_seek() is False and cursor.key() == b"a"
    cursor.next()
    assert not cursor.valid()
    with pytest.raises(DBError, match="invalid location"):
        cursor.key()
    cursor.seek_to_first()
    assert cursor.valid() and cursor.value() == b"1"


@pytest.mark.parametrize("content, problem", [
    (b"\x00" * 20, "must both be > 0"),
    (struct.pack("=ii", 3, 5) + b"abcde", "cut short|needs 8 bytes"),
    (struct.pack("=i", 3) + b"\x01", "cut short"),
])
def test_minidb_corrupt_files_raise(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(content)
    db = create_db("minidb", str(path), Mode.read)
    with pytest.raises(CorruptDataError, match=problem) as info:
        db.new_cursor()
    assert str(path) in str(info.value) and isinstance(info.value, RuntimeError)


def test_missing_paths_raise(tmp_path: Path) -> None:
    with pytest.raises(DBError, match="Cannot open file"):
        create_db("minidb", str(tmp_path / "none"), Mode.read)
    with pytest.raises(DBError):
        create_db("lmdb", str(tmp_path / "none"), Mode.read)
    assert not db_exists("minidb", str(tmp_path / "none"))
    assert not db_exists("lmdb", str(tmp_path / "none"))
    with pytest.raises(DBError, match="Cannot find db implementation of type bogus"):
        DBReader("bogus", str(tmp_path))


def test_lmdb_new_mkdir_and_write_modes(tmp_path: Path) -> None:
    path = str(tmp_path / "l")
    db = create_db("lmdb", path, Mode.new)
    txn = db.new_transaction()
    for key, value in reversed(PAIRS):
        txn.put(key, value)
    txn.commit()
    txn.put(b"key1", b"again")  # commit starts a new transaction; put overwrites
    del txn
    db.close()
    assert _read_all("lmdb", path)[0] == (b"key1", b"again")
    assert [k for k, _ in _read_all("lmdb", path)] == sorted(k for k, _ in PAIRS)
    with pytest.raises(DBError, match="mkdir"):
        create_db("lmdb", path, Mode.new)
    assert db_exists("lmdb", path)
    cursor = create_db("lmdb", path, Mode.read).new_cursor()
    assert cursor.supports_seek()
    cursor.seek(b"key5")
    assert cursor.key() == b"key5"


def test_leveldb_round_trip_and_modes(tmp_path: Path) -> None:
    pytest.importorskip("plyvel")
    path = str(tmp_path / "ldb")
    with pytest.raises(DBError, match="Failed to open leveldb"):
        create_db("leveldb", path, Mode.read)
    db = create_db("leveldb", path, Mode.new)
    txn = db.new_transaction()
    for key, value in PAIRS:
        txn.put(key, value)
    del txn
    db.close()
    assert _read_all("leveldb", path) == PAIRS
    with pytest.raises(DBError):
        create_db("leveldb", path, Mode.new)


def test_protodb_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "p.pb")
    db = create_db("protodb", path, Mode.new)
    txn = db.new_transaction()
    for name in ("a", "b"):
        txn.put(name, numpy_to_tensor_proto(np.ones(2, np.float32), name).SerializeToString())
    with pytest.raises(DBError, match="must equal the key"):
        txn.put("c", numpy_to_tensor_proto(np.ones(1), "d").SerializeToString())
    db.close()
    protos = caffe2_pb2.TensorProtos.FromString(Path(path).read_bytes())
    assert [p.name for p in protos.protos] == ["a", "b"]
    db = create_db("protodb", path, Mode.write)
    with pytest.raises(DBError, match="already exists"):
        db.new_transaction().put("a", protos.protos[0].SerializeToString())
    assert [k for k, _ in _read_all("protodb", path)] == [b"a", b"b"]


def test_db_reader_wraps_and_shards(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = create_db("minidb", path, Mode.new)
    txn = db.new_transaction()
    for i in range(5):
        txn.put(str(i), str(i))
    db.close()
    reader = DBReader("minidb", path)
    assert [reader.read()[0] for _ in range(7)] == [b"0", b"1", b"2", b"3", b"4", b"0", b"1"]
    shard = DBReader("minidb", path, num_shards=2, shard_id=1)
    assert [shard.read()[0] for _ in range(4)] == [b"1", b"3", b"1", b"3"]
    with pytest.raises(DBError, match="fewer rows than shard id"):
        DBReader("minidb", path, num_shards=8, shard_id=6)
    with pytest.raises(DBError):
        DBReader("minidb", path, num_shards=2, shard_id=2)


def test_user_registered_db_type(tmp_path: Path) -> None:
    class Upper(MiniDB):
        type_name = "upperdb"

    register_db(Upper, "UpperDB", "upperdb")
    db = create_db("upperdb", str(tmp_path / "u"), Mode.new)
    assert isinstance(db, Upper)
    db.new_transaction().put(b"k", b"v")
    db.close()
    assert _read_all("upperdb", str(tmp_path / "u")) == [(b"k", b"v")]


def test_lmdb_written_by_python_package_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "ex")
    env = lmdb.open(path, map_size=1 << 40)
    with env.begin(write=True) as txn:
        for j in range(12):
            txn.put(str(j).encode("ascii"), f"v{j}".encode())
    env.close()
    keys = [k for k, _ in _read_all("lmdb", path)]
    assert keys == sorted(str(j).encode() for j in range(12))  # "0","1","10","11","2",...


def test_a_collection_inside_an_lmdb_open_may_free_another_lmdb(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection inside ``lmdb.open`` (any allocation may start one) can free a
    DB object whose ``__del__`` releases its environment, in the thread that is opening
    another one: the environment map must not deadlock on itself."""
    import gc
    import threading

    from dpgraph.db.lmdb_db import ENVIRONMENTS

    paths = []
    for name in ("freed", "opened"):
        env = lmdb.open(str(tmp_path / name), map_size=1 << 20)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        env.close()
        paths.append(str(tmp_path / name))
    real_open = lmdb.open

    def open_after_a_collection(*args: object, **kwargs: object) -> object:
        gc.collect()
        return real_open(*args, **kwargs)

    gc.disable()  # only the collection inside lmdb.open frees the cycle
    try:
        freed = create_db("lmdb", paths[0], Mode.read)
        freed.cycle = freed
        del freed
        monkeypatch.setattr(lmdb, "open", open_after_a_collection)
        opened: list[object] = []
        opener = threading.Thread(target=lambda: opened.append(
            create_db("lmdb", paths[1], Mode.read)), daemon=True)
        opener.start()
        opener.join(timeout=30)
    finally:
        gc.enable()
    assert not opener.is_alive(), "opening an LMDB deadlocked on the environment map"
    assert os.path.realpath(paths[0]) not in ENVIRONMENTS._open
    opened[0].close()  # type: ignore[attr-defined]
