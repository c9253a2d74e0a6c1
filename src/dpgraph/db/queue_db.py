"""``BlobsQueueDB``: a read-only DB whose cursor pops records from a blobs queue.

Each step pops one record; the value is a bytes blob or the first element of a string
tensor.  The cursor becomes invalid when the queue is closed and drained or on timeout.
"""

from __future__ import annotations

from typing import Any

from dpgraph.db.base import DB, Cursor, Mode, Transaction
from dpgraph.errors import DBError, WorkspaceError


def _as_record_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, str)):
        return value.encode("utf-8") if isinstance(value, str) else value
    flat = getattr(value, "reshape", None)
    if flat is not None and value.size:
        item = value.reshape(-1)[0]
        if isinstance(item, (bytes, str)):
            return item.encode("utf-8") if isinstance(item, str) else item
    raise DBError(f"BlobsQueueDB: the {what} blob must be a string or a string tensor, got "
                  f"{type(value).__name__}.")


class BlobsQueueCursor(Cursor):
    def __init__(self, db: BlobsQueueDB) -> None:
        self._db = db
        self._key = self._value = b""
        self._valid = False
        self._started = False  # the first record is popped when it is first looked at

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.next()

    def seek_to_first(self) -> None:
        """A queue cannot rewind: a no-op, as in Caffe2."""

    def next(self) -> None:
        self._started = True
        try:
            record = self._db.queue.get(self._db.timeout)
        except WorkspaceError:  # the queue's dequeue timeout: the cursor ends, as in Caffe2
            record = None
        if record is None:
            self._valid = False
            return
        self._valid = True
        self._value = _as_record_bytes(record[self._db.value_index], "value")
        self._key = _as_record_bytes(record[self._db.key_index], "key") \
            if self._db.key_index >= 0 else b""

    def key(self) -> bytes:
        self._start()
        return self._key

    def value(self) -> bytes:
        self._start()
        return self._value

    def valid(self) -> bool:
        self._start()
        return self._valid


class BlobsQueueDB(DB):
    type_name = "blobs_queue_db"
    blocking = True

    def __init__(self, queue: Any, key_index: int = -1, value_index: int = 0,
                 timeout_secs: float = 0.0, name: str = "") -> None:
        if not hasattr(queue, "get") or not hasattr(queue, "num_blobs"):
            raise DBError(f"CreateBlobsQueueDB: input {name!r} is not a blobs queue; create it "
                          "with CreateBlobsQueue.")
        super().__init__(name or "queue", Mode.read)
        self.queue, self.key_index, self.value_index = queue, key_index, value_index
        self.timeout = timeout_secs if timeout_secs > 0 else None

    def new_cursor(self) -> Cursor:
        return BlobsQueueCursor(self)

    def new_transaction(self) -> Transaction:
        raise DBError("BlobsQueueDB is read-only: enqueue records into the queue instead.")
