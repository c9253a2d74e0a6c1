"""``DBReader``: the blob CreateDB makes; a shared, thread-safe, wrapping reader.

``read()`` returns the current record and steps ``num_shards`` records, wrapping around to
the shard start at the end, so several ops sharing one reader take disjoint records forever.
"""

from __future__ import annotations

import threading
from typing import Any

from dpgraph.db.base import DB, Cursor, Mode, open_db
from dpgraph.errors import DBError
from dpgraph.ir.blob_serde import TypeSerializer, register_type
from dpgraph.proto import caffe2_pb2


class DBReader:
    """Opens ``source`` read-only and positions a cursor on shard ``shard_id``."""

    def __init__(self, db_type: str, source: str, num_shards: int = 1, shard_id: int = 0,
                 name: str = "") -> None:
        if num_shards < 1 or not 0 <= shard_id < num_shards:
            raise DBError(f"DBReader({source!r}): need num_shards >= 1 and 0 <= shard_id < "
                          f"num_shards, got num_shards={num_shards}, shard_id={shard_id}.")
        self.db_type, self.source, self.name = db_type, source, name
        self.num_shards, self.shard_id = num_shards, shard_id
        self.db = open_db(db_type, source, Mode.read)
        self._cursor = self.db.new_cursor()
        self._lock = threading.Lock()
        self._to_start()

    @classmethod
    def from_db(cls, db: DB, db_type: str, name: str = "") -> DBReader:
        """A reader over an already open DB (the BlobsQueueDB)."""
        reader = cls.__new__(cls)
        reader.db_type, reader.source, reader.name = db_type, db.source, name
        reader.num_shards, reader.shard_id = 1, 0
        reader.db = db
        reader._cursor = db.new_cursor()
        reader._lock = threading.Lock()
        return reader

    def __repr__(self) -> str:
        return (f"DBReader({self.db_type}:{self.source!r}, shard {self.shard_id}/"
                f"{self.num_shards})")

    def _to_start(self) -> None:
        self._cursor.seek_to_first()
        for _ in range(self.shard_id):
            self._cursor.next()
            if not self._cursor.valid():
                raise DBError(f"{self.db.where()}: Db has fewer rows than shard id "
                              f"{self.shard_id}; use fewer shards or a bigger DB.")

    def _check_current(self) -> None:
        if not self._cursor.valid():
            raise DBError(f"{self.db.where()}: no record to read (the DB is empty, or the "
                          "queue behind it timed out or was closed).")

    def _step(self) -> None:
        """To this shard's next record, wrapping around to the shard start at the end."""
        for _ in range(self.num_shards):
            self._cursor.next()
            if not self._cursor.valid():
                self._to_start()
                return

    def _records(self, count: int) -> list[tuple[Any, Any]]:
        """``count`` records read in turn (the caller holds the lock); values may be views
        that stay valid while the cursor is open."""
        records: list[tuple[Any, Any]] = []
        while len(records) < count:
            self._check_current()
            if self.num_shards == 1:
                records += self._cursor.read_run(count - len(records))
                if not self._cursor.valid():
                    self._to_start()
            else:
                records.append((self._cursor.key(), self._cursor.value()))
                self._step()
        return records

    def read(self) -> tuple[bytes, bytes]:
        """The current ``(key, value)``; then step to this shard's next record."""
        keys, values = self.read_batch(1)
        return keys[0], values[0]

    def read_many(self, count: int) -> list[bytes]:
        """``count`` values read in turn under one lock acquisition."""
        return self.read_batch(count)[1]

    def read_batch(self, count: int) -> tuple[list[bytes], list[bytes]]:
        """``(keys, values)`` of ``count`` records read in turn under one lock acquisition."""
        with self._lock:
            records = self._records(count)
            return [bytes(k) for k, _ in records], [bytes(v) for _, v in records]

    def read_joined(self, count: int) -> tuple[list[bytes], list[int], bytes]:
        """``count`` records as ``(keys, value lengths, the values joined end to end)``: one
        copy of the values, made straight from the DB's storage."""
        with self._lock:
            records = self._records(count)
            return ([bytes(k) for k, _ in records], [len(v) for _, v in records],
                    b"".join(v for _, v in records))

    def seek_to_first(self) -> None:
        with self._lock:
            self._to_start()

    def cursor(self) -> Cursor:
        """The raw cursor (not thread-safe); Load scans it from its current position."""
        return self._cursor

    def close(self) -> None:
        with self._lock:  # not while a read holds views of the cursor's storage
            self._cursor.close()
            self.db.close()

    # --- serialization ------------------------------------------------------------------
    def to_proto(self, name: str) -> caffe2_pb2.DBReaderProto:
        proto = caffe2_pb2.DBReaderProto(name=name, source=self.source, db_type=self.db_type)
        if self._cursor.supports_seek() and self._cursor.valid():
            proto.key = self._cursor.key().decode("latin-1")
        return proto

    @classmethod
    def from_proto(cls, proto: caffe2_pb2.DBReaderProto) -> DBReader:
        reader = cls(proto.db_type, proto.source, name=proto.name)
        if proto.HasField("key"):
            if not reader._cursor.supports_seek():
                raise DBError(f"{reader.db.where()}: the serialized reader has a key but "
                              f"{proto.db_type} cannot seek.")
            reader._cursor.seek(proto.key.encode("latin-1"))
        return reader


def _serialize(name: str, reader: Any) -> bytes:
    return reader.to_proto(name).SerializeToString()


def _deserialize(content: bytes) -> DBReader:
    return DBReader.from_proto(caffe2_pb2.DBReaderProto.FromString(content))


register_type(TypeSerializer("DBReader", lambda v: isinstance(v, DBReader), _serialize,
                             _deserialize))
