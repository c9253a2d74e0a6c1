"""``minidb``: Caffe2's own single-file DB, byte-compatible.

The file is a plain concatenation of records, no header or index::

    int32 key_len | int32 value_len | key bytes | value bytes     (lengths little-endian)

NEW truncates (``"wb"``), WRITE appends (``"ab"``), READ reads (``"rb"``).  A 0-byte file is
an empty DB; a record with a zero length or a body cut short is corrupt.
"""

from __future__ import annotations

import struct
import threading
from typing import IO, Any

from dpgraph.db.base import DB, Cursor, Mode, Transaction, as_bytes, register_db
from dpgraph.errors import CorruptDataError, DBError

HEADER = struct.Struct("<ii")


def _open(path: str, how: str, what: str) -> IO[bytes]:
    try:
        return open(path, how)  # noqa: SIM115  (closed by the DB / cursor)
    except OSError as error:
        raise DBError(f"minidb {what}: Cannot open file: {path} ({error.strerror}); check the "
                      "path (Save/Load paths are relative to the workspace root folder unless "
                      "absolute_path=1).") from None


class MiniDBCursor(Cursor):
    """Reads records in file order; the first record is read on construction."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._file = _open(path, "rb", "cursor")
        self._key = self._value = b""
        self._valid = False
        self._index = -1
        self.seek_to_first()

    def seek_to_first(self) -> None:
        self._file.seek(0)
        self._index = -1
        self.next()

    def _corrupt(self, offset: int, problem: str) -> CorruptDataError:
        return CorruptDataError(
            f"minidb file {self._path!r}: record {self._index} at byte {offset}: {problem}; "
            "the file is truncated or corrupt (or not a minidb).")

    def next(self) -> None:
        offset = self._file.tell()
        head = self._file.read(4)
        self._index += 1
        if len(head) < 4:
            self._valid = False
            return
        rest = self._file.read(4)
        if len(rest) < 4:
            raise self._corrupt(offset, "the value length is cut short")
        key_len, value_len = HEADER.unpack(head + rest)
        if key_len <= 0 or value_len <= 0:
            raise self._corrupt(offset, f"key length {key_len} / value length {value_len} must "
                                "both be > 0")
        key = self._file.read(key_len)
        value = self._file.read(value_len)
        if len(key) != key_len or len(value) != value_len:
            raise self._corrupt(offset, f"the record needs {key_len + value_len} bytes after its "
                                f"header, only {len(key) + len(value)} are left")
        self._key, self._value, self._valid = key, value, True

    def _check(self) -> None:
        if not self._valid:
            raise DBError(f"minidb {self._path!r}: Cursor is at invalid location!")

    def key(self) -> bytes:
        self._check()
        return self._key

    def value(self) -> bytes:
        self._check()
        return self._value

    def valid(self) -> bool:
        return self._valid

    def close(self) -> None:
        self._file.close()
        self._valid = False

    def __del__(self) -> None:
        try:
            self._file.close()
        except Exception:  # noqa: BLE001
            pass


class MiniDBTransaction(Transaction):
    """Writes each put straight through the DB's file buffer; commit flushes."""

    def __init__(self, db: MiniDB) -> None:
        self._db = db

    def put(self, key: Any, value: Any) -> None:
        key, value = as_bytes(key), as_bytes(value, "value")
        self._db._write(HEADER.pack(len(key), len(value)) + key + value)

    def commit(self) -> None:
        self._db._flush()


class MiniDB(DB):
    type_name = "minidb"

    def __init__(self, source: str, mode: Mode) -> None:
        super().__init__(source, mode)
        how = {Mode.new: "wb", Mode.write: "ab", Mode.read: "rb"}[self.mode]
        self._file: IO[bytes] | None = _open(self.source, how, self.mode.name)
        self._lock = threading.RLock()  # a transaction's __del__ may flush mid-write (GC)
        if self.mode == Mode.read:  # READ keeps nothing open; each cursor has its handle
            self._file.close()
            self._file = None

    def _write(self, data: bytes) -> None:
        self._check_mode((Mode.new, Mode.write), "a transaction")
        with self._lock:
            assert self._file is not None
            self._file.write(data)

    def _flush(self) -> None:
        if self._file is not None and not self._file.closed:
            with self._lock:
                self._file.flush()

    def new_cursor(self) -> Cursor:
        self._check_mode((Mode.read,), "a cursor")
        return MiniDBCursor(self.source)

    def new_transaction(self) -> Transaction:
        self._check_mode((Mode.new, Mode.write), "a transaction")
        return MiniDBTransaction(self)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


register_db(MiniDB, "MiniDB", "minidb")
