"""``protodb``: one binary ``TensorProtos`` file; keys are the protos' names and values the
serialized TensorProtos.  Written back in binary on close (NEW and WRITE)."""

from __future__ import annotations

import os
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from dpgraph.db.base import DB, Cursor, Mode, Transaction, as_bytes, register_db
from dpgraph.errors import CorruptDataError, DBError
from dpgraph.proto import caffe2_pb2


class ProtoDBCursor(Cursor):
    def __init__(self, protos: list[Any]) -> None:
        self._protos = protos
        self._index = 0

    def seek_to_first(self) -> None:
        self._index = 0

    def next(self) -> None:
        self._index += 1

    def key(self) -> bytes:
        return self._protos[self._index].name.encode("utf-8")

    def value(self) -> bytes:
        return self._protos[self._index].SerializeToString()

    def valid(self) -> bool:
        return self._index < len(self._protos)


class ProtoDBTransaction(Transaction):
    def __init__(self, db: ProtoDB) -> None:
        self._db = db
        self._existing = {p.name for p in db._protos.protos}

    def put(self, key: Any, value: Any) -> None:
        name = as_bytes(key).decode("utf-8")
        if name in self._existing:
            raise DBError(f"{self._db.where(name)}: An item with key {name} already exists.")
        tensor = caffe2_pb2.TensorProto()
        try:
            tensor.ParseFromString(as_bytes(value, "value"))
        except DecodeError:
            raise CorruptDataError(f"{self._db.where(name)}: Cannot parse content from the "
                                   "value string.") from None
        if tensor.name != name:
            raise DBError(f"{self._db.where(name)}: the TensorProto's name {tensor.name!r} must "
                          "equal the key.")
        self._db._protos.protos.append(tensor)

    def commit(self) -> None:
        """Nothing to do: the file is written when the DB closes."""


class ProtoDB(DB):
    type_name = "protodb"

    def __init__(self, source: str, mode: Mode) -> None:
        super().__init__(source, mode)
        self._protos = caffe2_pb2.TensorProtos()
        if self.mode != Mode.new:
            self._read()

    def _read(self) -> None:
        if not os.path.isfile(self.source):
            raise DBError(f"protodb: File not found: {self.source}")
        with open(self.source, "rb") as handle:
            data = handle.read()
        try:
            self._protos.ParseFromString(data)
        except DecodeError:
            try:
                text_format.Parse(data.decode("utf-8"), self._protos)
            except (text_format.ParseError, UnicodeDecodeError):
                raise CorruptDataError(f"protodb {self.source!r}: Cannot read protobuffer.") \
                    from None

    def new_cursor(self) -> Cursor:
        self._check_open()
        return ProtoDBCursor(list(self._protos.protos))

    def new_transaction(self) -> Transaction:
        self._check_open()
        return ProtoDBTransaction(self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.mode != Mode.read:
            with open(self.source, "wb") as handle:
                handle.write(self._protos.SerializeToString())
            os.chmod(self.source, 0o644)


register_db(ProtoDB, "ProtoDB", "protodb")
