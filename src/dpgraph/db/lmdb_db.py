"""``lmdb``: an LMDB environment directory, through the ``lmdb`` package.

As Caffe2 opens it: a 1 TB map, the unnamed main database, bytewise key order; NEW creates
the directory (and fails if it exists), WRITE opens an existing one, READ opens read-only
without locking.  A cursor reads one snapshot; a transaction commits and starts a new one.
"""

from __future__ import annotations

import os
import struct
import threading
from itertools import islice
from typing import Any

from dpgraph.db.base import DB, Cursor, Mode, Transaction, as_bytes, register_db
from dpgraph.errors import CorruptDataError, DBError, MissingDependencyError

MAP_SIZE = 1 << 40

_META = struct.Struct("<II")  # mm_magic, mm_version at byte 16 of a meta page
_PSIZE = struct.Struct("<I")  # mm_dbs[FREE_DBI].md_pad (= the page size) at byte 40
_LAST = struct.Struct("<QQ")  # mm_last_pg, mm_txnid at byte 136 (64-bit LMDB layout)
_MAGIC = 0xBEEFC0DE


def _meta_pages(handle: Any) -> tuple[list[bytes], int]:
    """The valid meta pages at the start of ``data.mdb`` and the page size."""
    head = handle.read(152)
    if len(head) < 152:
        return [], 0
    psize = _PSIZE.unpack_from(head, 40)[0]
    if _META.unpack_from(head, 16)[0] != _MAGIC or not 512 <= psize <= 1 << 16 \
            or psize & (psize - 1):
        return [], psize
    handle.seek(psize)
    second = handle.read(152)
    metas = [head]
    if len(second) == 152 and _META.unpack_from(second, 16)[0] == _MAGIC:
        metas.append(second)
    return metas, psize


def check_data_file(source: str) -> None:
    """Refuse a ``data.mdb`` shorter than its newest meta page says: liblmdb would mmap it
    and die with SIGBUS on the first page past the end (e.g. a partial copy)."""
    path = os.path.join(source, "data.mdb")
    if not os.path.isfile(path):
        return  # lmdb.open reports the missing environment itself
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            metas, psize = _meta_pages(handle)
    except OSError as error:
        raise DBError(f"lmdb: cannot read {path!r} ({error.strerror}).") from None
    if not metas:
        raise CorruptDataError(f"lmdb: {path!r} ({size} bytes) has no valid LMDB meta page; "
                               "the file is truncated, corrupt or not an LMDB.")
    last_pg, _ = max((_LAST.unpack_from(m, 136) for m in metas), key=lambda v: v[1])
    need = (last_pg + 1) * psize
    if size < need:
        raise CorruptDataError(f"lmdb: {path!r} has {size} bytes but its meta page says "
                               f"{last_pg + 1} pages of {psize} bytes ({need} bytes); the file "
                               "is truncated (copy the LMDB again).")


def _lmdb() -> Any:
    try:
        import lmdb
    except ImportError:
        raise MissingDependencyError("The lmdb DB type needs the 'lmdb' package: "
                                     "pip install lmdb") from None
    return lmdb


class _Environments:
    """py-lmdb refuses to open one environment twice in a process, so every DB object on
    a path shares one ``lmdb.Environment`` (opened read-only unless a writer asked first)."""

    def __init__(self) -> None:
        self._open: dict[str, list[Any]] = {}  # realpath -> [env, users, writable]
        # Reentrant: a garbage collection inside ``lmdb.open`` can free another DB object,
        # whose ``__del__`` releases its environment in this same thread.  That is safe here:
        # ``acquire`` touches the map only before and after the call.
        self._lock = threading.RLock()

    def acquire(self, path: str, writable: bool) -> Any:
        key = os.path.realpath(path)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                if writable and not entry[2]:
                    raise DBError(f"lmdb: {path!r} is open read-only by {entry[1]} reader(s) in "
                                  "this process; close them (or reset the workspace holding "
                                  "the CreateDB readers) before writing to it.")
                entry[1] += 1
                return entry[0]
            lmdb = _lmdb()
            if writable:
                env = lmdb.open(path, map_size=MAP_SIZE, create=False, mode=0o664)
            else:
                env = lmdb.open(path, readonly=True, lock=False, create=False,
                                max_readers=1024)
            self._open[key] = [env, 1, writable]
            return env

    def release(self, path: str) -> None:
        key = os.path.realpath(path)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[key]
                entry[0].close()


ENVIRONMENTS = _Environments()


class LMDBCursor(Cursor):
    def __init__(self, db: LMDB) -> None:
        self._db = db
        # buffers: values are read-only views of the map (valid while the transaction
        # lives); key() and value() copy them, read_run() hands the views to the reader
        self._txn = db._env.begin(write=False, buffers=True)
        self._cursor = self._txn.cursor()
        self._valid = self._call(self._cursor.first)

    def _call(self, fn: Any, *args: Any) -> Any:
        """A liblmdb call; its errors (corrupt pages) become CorruptDataError."""
        try:
            return fn(*args)
        except _lmdb().Error as error:
            raise CorruptDataError(f"lmdb {self._db.source!r}: {error}; the database is "
                                   "corrupt (copy it again or rebuild it).") from None

    def supports_seek(self) -> bool:
        return True

    def seek(self, key: Any) -> None:
        key = as_bytes(key)
        self._valid = (self._call(self._cursor.set_range, key) if key
                       else self._call(self._cursor.first))

    def seek_to_first(self) -> None:
        self._valid = self._call(self._cursor.first)

    def next(self) -> None:
        self._valid = self._call(self._cursor.next)

    def key(self) -> bytes:
        return bytes(self._call(self._cursor.key))

    def value(self) -> bytes:
        return bytes(self._call(self._cursor.value))

    def read_run(self, count: int) -> list[tuple[Any, Any]]:
        """As :meth:`Cursor.read_run`, in one liblmdb loop; the records are views of the
        map, valid until the cursor is closed."""
        if not self._valid or count <= 0:
            return []
        run = self._call(lambda: list(islice(self._cursor.iternext(), count)))
        # iternext leaves the cursor on the last record it yielded (unpositioned at the end)
        self._valid = len(run) == count and self._call(self._cursor.next)
        return run

    def valid(self) -> bool:
        return self._valid

    def close(self) -> None:
        if self._txn is not None:
            self._cursor.close()
            self._txn.abort()
            self._txn = None
            self._valid = False

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class LMDBTransaction(Transaction):
    def __init__(self, db: LMDB) -> None:
        self._db = db
        self._txn: Any = db._env.begin(write=True)

    def put(self, key: Any, value: Any) -> None:
        if self._txn is None:
            raise DBError(f"{self._db.where()}: the transaction is closed.")
        try:
            self._txn.put(as_bytes(key), as_bytes(value, "value"))
        except _lmdb().Error as error:
            raise DBError(f"{self._db.where(key)}: put failed: {error}") from None

    def commit(self) -> None:
        if self._txn is None:
            return
        try:
            self._txn.commit()
        except _lmdb().Error as error:
            raise DBError(f"{self._db.where()}: commit failed: {error}") from None
        self._txn = self._db._env.begin(write=True) if not self._db.closed else None

    def close(self) -> None:
        if self._txn is not None and not self._db.closed:
            self._txn.commit()
        self._txn = None


class LMDB(DB):
    type_name = "lmdb"

    def __init__(self, source: str, mode: Mode) -> None:
        super().__init__(source, mode)
        lmdb = _lmdb()
        if self.mode == Mode.new:
            try:
                os.mkdir(self.source, 0o744)
            except OSError as error:
                raise DBError(f"lmdb NEW: mkdir {self.source} failed ({error.strerror}); Save "
                              "and NEW mode need a path that does not exist yet.") from None
        if self.mode != Mode.new:
            check_data_file(self.source)
        try:
            self._env = ENVIRONMENTS.acquire(self.source, self.mode != Mode.read)
        except lmdb.Error as error:
            raise DBError(f"lmdb {self.mode.name}: cannot open {self.source!r}: {error}") \
                from None

    def new_cursor(self) -> Cursor:
        self._check_open()
        return LMDBCursor(self)

    def new_transaction(self) -> Transaction:
        self._check_mode((Mode.new, Mode.write), "a transaction")
        return LMDBTransaction(self)

    def close(self) -> None:
        if not self.closed and hasattr(self, "_env"):
            self.closed = True
            ENVIRONMENTS.release(self.source)


register_db(LMDB, "LMDB", "lmdb")
