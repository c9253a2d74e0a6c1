"""Blobs queues: CreateBlobsQueue, EnqueueBlobs, SafeEnqueueBlobs, DequeueBlobs,
SafeDequeueBlobs, WeightedSampleDequeueBlobs, CloseBlobsQueue.

A queue blob holds a bounded, thread-safe :class:`BlobsQueue` of records (one value per
blob).  Enqueueing blocks while the queue is full, dequeueing blocks while it is empty;
closing wakes every waiter: enqueues then fail, dequeues drain what is left and then fail
(the ``Safe`` variants report that through a bool status output instead of failing).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from dpgraph.errors import DataInputError, QueueClosedError, ShapeError, WorkspaceError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient

#: Threads (idents) whose blocking queue waits should give up: worker threads being stopped
#: by ``parallel_workers``/``data_workers``, so ``stop()`` can join them even when they wait
#: on a full or empty queue nobody closes.
_CANCELLED: set[int] = set()
_POLL_SECONDS = 0.1


def cancel_blocking_waits(thread_idents: Any) -> None:
    """Make the blocking ``put``/``get`` of these threads return as if the queue closed."""
    _CANCELLED.update(i for i in thread_idents if i is not None)


def forget_cancelled(thread_idents: Any) -> None:
    """Drop finished threads from the cancelled set (idents are reused)."""
    _CANCELLED.difference_update(thread_idents)


def _cancelled() -> bool:
    return bool(_CANCELLED) and threading.get_ident() in _CANCELLED


def wait_for(cond: threading.Condition, ready: Any, timeout: float | None = None) -> bool:
    """Wait on ``cond`` (held by the caller) until ``ready()`` or this thread is cancelled
    (see :func:`cancel_blocking_waits`); False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not (ready() or _cancelled()):
        remaining = _POLL_SECONDS if deadline is None else \
            min(_POLL_SECONDS, deadline - time.monotonic())
        if remaining <= 0:
            return False
        cond.wait(remaining)
    return True


class BlobsQueue:
    """A bounded FIFO of records; ``put``/``get`` block, ``close`` ends it cleanly."""

    def __init__(self, name: str, capacity: int, num_blobs: int) -> None:
        if capacity < 1:
            raise ShapeError(f"queue {name!r}: capacity must be >= 1, got {capacity}.")
        self.name, self.capacity, self.num_blobs = name, capacity, num_blobs
        self._items: deque[tuple[Any, ...]] = deque()
        self._cond = threading.Condition()
        self.closed = False
        self.reason: BaseException | None = None

    def __repr__(self) -> str:
        return (f"BlobsQueue({self.name!r}, {len(self._items)}/{self.capacity} records"
                f"{', closed' if self.closed else ''})")

    def __len__(self) -> int:
        return len(self._items)

    def _wait(self, ready: Any, timeout: float | None) -> bool:
        """Wait (holding the condition) until ``ready()``, the queue closes or this thread
        is cancelled; False on timeout."""
        return wait_for(self._cond, lambda: self.closed or ready(), timeout)

    def put(self, record: tuple[Any, ...], timeout: float | None = None) -> bool:
        """Append ``record``; False if the queue is (or gets) closed."""
        with self._cond:
            if not self._wait(lambda: len(self._items) < self.capacity, timeout):
                raise WorkspaceError(f"queue {self.name!r}: enqueue timed out after "
                                     f"{timeout} s (queue full).")
            if self.closed or _cancelled():
                return False
            self._items.append(record)
            self._cond.notify_all()
            return True

    def get(self, timeout: float | None = None) -> tuple[Any, ...] | None:
        """The oldest record; ``None`` once the queue is closed and drained."""
        with self._cond:
            if not self._wait(lambda: bool(self._items), timeout):
                raise WorkspaceError(f"queue {self.name!r}: dequeue timed out after "
                                     f"{timeout} s (queue empty).")
            if not self._items:
                return None
            record = self._items.popleft()
            self._cond.notify_all()
            return record

    def get_many(self, count: int, timeout: float | None = None) -> list[tuple[Any, ...]]:
        """Up to ``count`` records: waits for the first, then takes what is queued."""
        first = self.get(timeout)
        if first is None:
            return []
        records = [first]
        with self._cond:
            while self._items and len(records) < count:
                records.append(self._items.popleft())
            self._cond.notify_all()
        return records

    def close(self, reason: BaseException | None = None) -> None:
        """Close the queue; ``reason`` (a producer's failure) is reported to readers."""
        with self._cond:
            self.closed = True
            if reason is not None and self.reason is None:
                self.reason = reason
            self._cond.notify_all()

    def closed_error(self, describe: Any) -> Exception:
        """The error a reader of the closed, drained queue raises."""
        if self.reason is not None:
            error = DataInputError(describe(
                f"queue {self.name!r} was closed because its producer failed: "
                f"{type(self.reason).__name__}: {self.reason}"))
            error.__cause__ = self.reason
            return error
        return QueueClosedError(describe(f"queue {self.name!r} is closed and empty."))


def _queue(ctx: OpContext) -> BlobsQueue:
    queue = ctx.inputs[0]
    if not isinstance(queue, BlobsQueue):
        raise ShapeError(ctx.describe(
            f"input {ctx.input_name(0)!r} is not a queue (got {type(queue).__name__}); "
            "create it with CreateBlobsQueue."))
    return queue


def _record(ctx: OpContext, queue: BlobsQueue) -> tuple[Any, ...]:
    values = ctx.inputs[1:]
    if len(values) != queue.num_blobs:
        raise ShapeError(ctx.describe(
            f"queue {queue.name!r} holds {queue.num_blobs} blobs per record, got {len(values)}."))
    return tuple(v.copy() if hasattr(v, "copy") and hasattr(v, "shape") else v for v in values)


def _timeout(ctx: OpContext) -> float | None:
    seconds = ctx.float_arg("timeout_secs", 0.0)
    return seconds if seconds > 0 else None


def _status(closed: bool) -> np.ndarray:
    return np.array(closed, dtype=np.bool_)


@register_op("CreateBlobsQueue", inputs=0, outputs=1, side_effects=True)
def create_blobs_queue(ctx: OpContext) -> Outputs:
    """A new queue; args capacity (default 1), num_blobs (default 1), enforce_unique_name,
    field_names (one per blob).  Like Caffe2 it creates the slot blobs
    ``<queue>_<slot>_<j>`` in the workspace."""
    name = ctx.str_arg("name", "") or ctx.output_name(0)
    capacity, num_blobs = ctx.int_arg("capacity", 1), ctx.int_arg("num_blobs", 1)
    field_names = ctx.arg("field_names", [])
    if field_names and len(field_names) != num_blobs:
        raise ShapeError(ctx.describe(f"field_names has {len(field_names)} names for "
                                      f"num_blobs={num_blobs}."))
    if ctx.workspace is not None and hasattr(ctx.workspace, "create_blob"):
        for slot in range(capacity):
            for j in range(num_blobs):
                ctx.workspace.create_blob(f"{ctx.output_name(0)}_{slot}_{j}")
    return (BlobsQueue(name, capacity, num_blobs),)


@register_op("EnqueueBlobs", inputs=(2, None), outputs=(1, None),
             inplace=[(i + 1, i) for i in range(64)], side_effects=True)
def enqueue_blobs(ctx: OpContext) -> Outputs:
    """Append (copies of) the blobs as one record; fails if the queue is closed."""
    queue = _queue(ctx)
    if not queue.put(_record(ctx, queue), _timeout(ctx)):
        raise QueueClosedError(ctx.describe(f"queue {queue.name!r} is closed."))
    return tuple(ctx.inputs[1:])


@register_op("SafeEnqueueBlobs", inputs=(2, None), outputs=(2, None),
             inplace=[(i + 1, i) for i in range(64)], side_effects=True)
def safe_enqueue_blobs(ctx: OpContext) -> Outputs:
    """Like EnqueueBlobs; the extra last output is True when the queue was closed."""
    queue = _queue(ctx)
    ok = queue.put(_record(ctx, queue), _timeout(ctx))
    return (*ctx.inputs[1:], _status(not ok))


@register_op("DequeueBlobs", inputs=1, outputs=(1, None), side_effects=True)
def dequeue_blobs(ctx: OpContext) -> Outputs:
    """Pop one record into the outputs; blocks while empty, fails once closed and empty."""
    queue = _queue(ctx)
    record = queue.get(_timeout(ctx))
    if record is None:
        raise queue.closed_error(ctx.describe)
    if len(record) != ctx.num_outputs:
        raise ShapeError(ctx.describe(
            f"records of queue {queue.name!r} hold {len(record)} blobs, the op has "
            f"{ctx.num_outputs} outputs."))
    return record


@register_op("SafeDequeueBlobs", inputs=1, outputs=(2, None), side_effects=True)
def safe_dequeue_blobs(ctx: OpContext) -> Outputs:
    """Like DequeueBlobs; the last output is True (outputs unchanged) once closed and empty.
    ``num_records`` > 1 concatenates up to that many records along dim 0."""
    queue = _queue(ctx)
    num_records = ctx.int_arg("num_records", 1)
    if num_records <= 0:
        raise ShapeError(ctx.describe(f"num_records must be > 0, got {num_records}."))
    records = queue.get_many(num_records, _timeout(ctx))
    count = ctx.num_outputs - 1
    if not records:
        return (*(ctx.prev_output(i) for i in range(count)), _status(True))
    if len(records[0]) != count:
        raise ShapeError(ctx.describe(
            f"records of queue {queue.name!r} hold {len(records[0])} blobs, the op has "
            f"{count} data outputs."))
    if len(records) == 1:
        return (*records[0], _status(False))
    return (*(np.concatenate([np.asarray(r[i]) for r in records]) for i in range(count)),
            _status(False))


def _sampling_bounds(ctx: OpContext) -> np.ndarray:
    """Cumulative probabilities of the ``weights`` arg (one per queue, default all 1), the
    last one 1.0001 as in Caffe2 (no draw can fall past it)."""
    weights = np.asarray(ctx.floats_arg("weights") or [1.0] * ctx.num_inputs, np.float32)
    if weights.size != ctx.num_inputs:
        raise ShapeError(ctx.describe(f"weights has {weights.size} entries for "
                                      f"{ctx.num_inputs} queues."))
    total = np.float32(weights.sum())
    if not total > 0:
        raise ShapeError(ctx.describe(f"Sum of weights must be positive, got {weights.tolist()}"))
    if (weights < 0).any():
        raise ShapeError(ctx.describe(f"Each probability must be non-negative, got weights "
                                      f"{weights.tolist()}"))
    bounds = np.cumsum(weights / total, dtype=np.float32)
    bounds[-1] = np.float32(1.0001)
    return bounds


@register_op("WeightedSampleDequeueBlobs", inputs=(1, None), outputs=(2, None),
             side_effects=True)
def weighted_sample_dequeue_blobs(ctx: OpContext) -> Outputs:
    """Pick one of the input queues at random (``weights``) and pop a record from it into
    the data outputs; the last output is True (data unchanged) when that queue is closed
    and drained.  ``table_idx_blob`` >= 0: that output gets the chosen queue's index
    (int32 [1]) instead."""
    table_idx = ctx.int_arg("table_idx_blob", -1)
    if table_idx >= ctx.num_outputs - 1:
        raise ShapeError(ctx.describe(f"table_idx_blob {table_idx} must be below the "
                                      f"{ctx.num_outputs - 1} data outputs."))
    bounds = _sampling_bounds(ctx)
    chosen = int(np.searchsorted(bounds, np.float32(ctx.rng.random()), side="left"))
    queue = ctx.inputs[chosen]
    if not isinstance(queue, BlobsQueue):
        raise ShapeError(ctx.describe(
            f"input {ctx.input_name(chosen)!r} is not a queue (got {type(queue).__name__}); "
            "create it with CreateBlobsQueue."))
    count = ctx.num_outputs - 1
    if queue.num_blobs != count:
        raise ShapeError(ctx.describe(f"queue {queue.name!r} holds {queue.num_blobs} blobs "
                                      f"per record; the op has {count} data outputs."))
    record = queue.get(_timeout(ctx))
    values = list(record) if record is not None else [ctx.prev_output(i) for i in range(count)]
    if table_idx >= 0:
        values[table_idx] = np.array([chosen], np.int32)
    return (*values, _status(record is None))


@register_op("CloseBlobsQueue", inputs=1, outputs=0, side_effects=True)
def close_blobs_queue(ctx: OpContext) -> Outputs:
    """Close the queue: waiting and later dequeues drain it, then end; waiting enqueues
    of a full queue fail."""
    _queue(ctx).close()
    return ()


for _op_type in ("CreateBlobsQueue", "EnqueueBlobs", "SafeEnqueueBlobs", "DequeueBlobs",
                 "SafeDequeueBlobs", "WeightedSampleDequeueBlobs", "CloseBlobsQueue"):
    register_gradient(_op_type)(no_gradient)
