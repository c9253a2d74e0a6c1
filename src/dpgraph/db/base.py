"""Caffe2's key-value DB contract: :class:`Mode`, :class:`DB`, :class:`Cursor`,
:class:`Transaction`, and the registry of DB types (``create_db``, ``register_db``).

Keys and values are byte strings.  Both the Python-binding names (``seek_to_first``,
``new_cursor``, ``put``) and the C++ names (``SeekToFirst``, ``NewCursor``, ``Put``) work.
"""

from __future__ import annotations

import enum
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from dpgraph.errors import DBError, did_you_mean


class Mode(enum.IntEnum):
    """``READ=0`` (read-only), ``WRITE=1`` (open existing, add), ``NEW=2`` (create/truncate)."""

    read = 0
    write = 1
    new = 2

    # Caffe2's C++ spelling
    READ = 0
    WRITE = 1
    NEW = 2


def as_mode(mode: Any) -> Mode:
    try:
        return Mode(int(mode))
    except (TypeError, ValueError):
        raise DBError(f"DB mode must be Mode.read, Mode.write or Mode.new (0/1/2), got "
                      f"{mode!r}.") from None


def as_bytes(value: Any, what: str = "key") -> bytes:
    """``str`` (UTF-8) or bytes-like as bytes, as the Python binding accepts them."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise DBError(f"DB {what} must be str or bytes, got {type(value).__name__}.")


class Cursor(ABC):
    """Iterates a DB's records in its order; ``key()``/``value()`` only while ``valid()``."""

    def supports_seek(self) -> bool:
        return False

    def seek(self, key: Any) -> None:
        raise DBError(f"{type(self).__name__} does not support Seek; use seek_to_first().")

    @abstractmethod
    def seek_to_first(self) -> None: ...

    @abstractmethod
    def next(self) -> None: ...

    @abstractmethod
    def key(self) -> bytes: ...

    @abstractmethod
    def value(self) -> bytes: ...

    @abstractmethod
    def valid(self) -> bool: ...

    def close(self) -> None:  # noqa: B027  (optional hook: most cursors hold nothing)
        """Release the cursor's resources (also done when it is freed)."""

    def read_run(self, count: int) -> list[tuple[Any, Any]]:
        """Up to ``count`` ``(key, value)`` records from the current one on, stepping past
        each (fewer where the DB ends; the cursor is then not valid).  Keys and values are
        bytes-like and stay readable until the cursor is closed."""
        run: list[tuple[Any, Any]] = []
        while len(run) < count and self.valid():
            run.append((self.key(), self.value()))
            self.next()
        return run

    def __iter__(self) -> Any:
        while self.valid():
            yield self.key(), self.value()
            self.next()

    # Caffe2's C++ spelling
    def SupportsSeek(self) -> bool:  # noqa: N802
        return self.supports_seek()

    def Seek(self, key: Any) -> None:  # noqa: N802
        self.seek(key)

    def SeekToFirst(self) -> None:  # noqa: N802
        self.seek_to_first()

    def Next(self) -> None:  # noqa: N802
        self.next()

    def Valid(self) -> bool:  # noqa: N802
        return self.valid()


class Transaction(ABC):
    """Collects ``put``s; ``commit`` makes them durable.  Freeing it commits."""

    @abstractmethod
    def put(self, key: Any, value: Any) -> None: ...

    @abstractmethod
    def commit(self) -> None: ...

    def close(self) -> None:
        self.commit()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def Put(self, key: Any, value: Any) -> None:  # noqa: N802
        self.put(key, value)

    def Commit(self) -> None:  # noqa: N802
        self.commit()


class DB(ABC):
    """One open database.  ``close()`` (or freeing it) closes it."""

    type_name = "db"
    #: Whether reading may wait for records that are not there yet (a queue behind it).
    blocking = False

    def __init__(self, source: str, mode: Mode) -> None:
        self.source = os.fspath(source)
        self.mode = as_mode(mode)
        self.closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, {self.mode.name})"

    def where(self, key: Any = None) -> str:
        """``<type> DB '<path>'`` (and the key) for error messages."""
        text = f"{self.type_name} DB {self.source!r}"
        return text if key is None else f"{text}, key {key!r}"

    def _check_open(self) -> None:
        if self.closed:
            raise DBError(f"{self.where()} is closed; open it again with create_db.")

    def _check_mode(self, modes: tuple[Mode, ...], what: str) -> None:
        self._check_open()
        if self.mode not in modes:
            names = " or ".join(m.name for m in modes)
            raise DBError(f"{self.where()}: {what} needs mode {names}, the DB was opened with "
                          f"mode {self.mode.name}.")

    @abstractmethod
    def new_cursor(self) -> Cursor: ...

    @abstractmethod
    def new_transaction(self) -> Transaction: ...

    def set_options(self, options: Any) -> None:  # noqa: B027  (a no-op unless overridden)
        """Caffe2's ``SetOptions``: a no-op for the built-in DBs."""

    def close(self) -> None:
        self.closed = True

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> DB:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def NewCursor(self) -> Cursor:  # noqa: N802
        return self.new_cursor()

    def NewTransaction(self) -> Transaction:  # noqa: N802
        return self.new_transaction()

    def SetOptions(self, options: Any) -> None:  # noqa: N802
        self.set_options(options)

    def Close(self) -> None:  # noqa: N802
        self.close()


DBFactory = Callable[[str, Mode], DB]
_REGISTRY: dict[str, DBFactory] = {}


def register_db(factory: DBFactory, *names: str) -> None:
    """Register a DB type under ``names`` (Caffe2 registers ``MiniDB`` and ``minidb``).

    ``factory(source, mode)`` returns a :class:`DB`; it must raise when the DB cannot be
    opened (``db_exists`` relies on it)."""
    for name in names:
        _REGISTRY[name] = factory


def registered_dbs() -> list[str]:
    return sorted(_REGISTRY)


def create_db(db_type: Any, source: Any, mode: Any) -> DB | None:
    """Open ``source`` as a ``db_type`` DB; ``None`` when the type is not registered."""
    factory = _REGISTRY.get(str(db_type))
    if factory is None:
        return None
    return factory(os.fspath(source), as_mode(mode))


def open_db(db_type: str, source: str, mode: Any) -> DB:
    """Like :func:`create_db`, but an unknown type raises (what the ops and DBReader do)."""
    db = create_db(db_type, source, mode)
    if db is None:
        raise DBError(f"Cannot find db implementation of type {db_type} (while trying to open "
                      f"{source}).{did_you_mean(str(db_type), _REGISTRY)} Registered types: "
                      f"{', '.join(registered_dbs())}.")
    return db


def db_exists(db_type: str, source: str) -> bool:
    """True when ``source`` opens as a ``db_type`` DB in READ mode."""
    try:
        db = create_db(db_type, source, Mode.read)
    except Exception:  # noqa: BLE001  (Caffe2: false on any failure)
        return False
    if db is None:
        return False
    db.close()
    return True
