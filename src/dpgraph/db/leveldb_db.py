"""``leveldb``: a LevelDB directory through ``plyvel`` (the optional ``leveldb`` extra).

Options as Caffe2 sets them: block size 64 KiB, 256 MiB write buffer, 100 open files,
``create_if_missing`` unless READ, ``error_if_exists`` for NEW.  Puts go to a write batch
written on commit.
"""

from __future__ import annotations

from typing import Any

from dpgraph.db.base import DB, Cursor, Mode, Transaction, as_bytes, register_db
from dpgraph.errors import DBError, MissingDependencyError

BLOCK_SIZE = 65536
WRITE_BUFFER_SIZE = 268435456
MAX_OPEN_FILES = 100


def _plyvel() -> Any:
    try:
        import plyvel
    except ImportError:
        raise MissingDependencyError(
            "The leveldb DB type needs the optional 'plyvel' package: pip install plyvel "
            "(or pip install 'dpgraph[leveldb]'); or use db_type='lmdb' or 'minidb'.") from None
    return plyvel


class LevelDBCursor(Cursor):
    def __init__(self, db: LevelDB) -> None:
        self._snapshot = db._db.snapshot()
        self._it = self._snapshot.raw_iterator()
        self._it.seek_to_first()

    def supports_seek(self) -> bool:
        return True

    def seek(self, key: Any) -> None:
        self._it.seek(as_bytes(key))

    def seek_to_first(self) -> None:
        self._it.seek_to_first()

    def next(self) -> None:
        self._it.next()

    def key(self) -> bytes:
        return self._it.key()

    def value(self) -> bytes:
        return self._it.value()

    def valid(self) -> bool:
        return bool(self._it.valid())

    def close(self) -> None:
        self._it.close()


class LevelDBTransaction(Transaction):
    def __init__(self, db: LevelDB) -> None:
        self._db = db
        self._batch: list[tuple[bytes, bytes]] = []

    def put(self, key: Any, value: Any) -> None:
        self._batch.append((as_bytes(key), as_bytes(value, "value")))

    def commit(self) -> None:
        if not self._batch or self._db.closed:
            return
        try:
            with self._db._db.write_batch() as batch:
                for key, value in self._batch:
                    batch.put(key, value)
        except Exception as error:
            raise DBError(f"{self._db.where()}: write failed: {error}") from error
        self._batch = []


class LevelDB(DB):
    type_name = "leveldb"

    def __init__(self, source: str, mode: Mode) -> None:
        super().__init__(source, mode)
        plyvel = _plyvel()
        try:
            self._db = plyvel.DB(self.source, create_if_missing=self.mode != Mode.read,
                                 error_if_exists=self.mode == Mode.new, block_size=BLOCK_SIZE,
                                 write_buffer_size=WRITE_BUFFER_SIZE,
                                 max_open_files=MAX_OPEN_FILES)
        except Exception as error:
            raise DBError(f"Failed to open leveldb {self.source}. {error}") from error

    def new_cursor(self) -> Cursor:
        self._check_open()
        return LevelDBCursor(self)

    def new_transaction(self) -> Transaction:
        self._check_open()
        return LevelDBTransaction(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._db.close()


register_db(LevelDB, "LevelDB", "leveldb")
