"""Caffe2's rebatching queue: CreateRebatchingQueue, EnqueueRebatchingQueue,
DequeueRebatchingQueue, CloseRebatchingQueue.

The queue holds up to ``capacity`` elements; an element is one row of each of the
``num_blobs`` tensors.  Enqueue adds each input as one element, or (``enqueue_batch``) splits
the inputs along their first dimension into rows; it blocks while the queue is full and fails
once the queue is closed (a batch interrupted by a close counts as failed).  Dequeue waits
for ``num_elements`` elements and stacks them into ``[n] + row shape`` outputs; a closed queue
hands out what is left (possibly fewer) and fails once it is empty.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from dpgraph.errors import QueueClosedError, ShapeError
from dpgraph.ir.arrays import to_host
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.queue import wait_for


class RebatchingQueue:
    """A bounded FIFO of elements (tuples of rows), see the module docstring."""

    def __init__(self, name: str, capacity: int, num_blobs: int) -> None:
        if capacity < 1 or num_blobs < 1:
            raise ShapeError(f"rebatching queue {name!r}: capacity and num_blobs must be >= 1, "
                             f"got {capacity} and {num_blobs}.")
        self.name, self.capacity, self.num_blobs = name, capacity, num_blobs
        self._items: deque[tuple[np.ndarray, ...]] = deque()
        self._cond = threading.Condition()
        self.closed = False

    def __repr__(self) -> str:
        return (f"RebatchingQueue({self.name!r}, {len(self._items)}/{self.capacity} elements"
                f"{', closed' if self.closed else ''})")

    def _wait(self, ready: Any) -> None:
        """Wait (holding the condition) until ``ready()``, a close or a cancellation."""
        wait_for(self._cond, lambda: self.closed or ready())

    def enqueue(self, elements: list[tuple[np.ndarray, ...]]) -> bool:
        """Append every element (blocking while full); False once the queue is closed."""
        index = 0
        while index < len(elements):
            with self._cond:
                self._wait(lambda: len(self._items) < self.capacity)
                if self.closed or len(self._items) >= self.capacity:  # closed or cancelled
                    return False
                while len(self._items) < self.capacity and index < len(elements):
                    self._items.append(elements[index])
                    index += 1
                self._cond.notify_all()
        return True

    def dequeue(self, count: int) -> list[tuple[np.ndarray, ...]]:
        """Up to ``count`` elements; fewer only when the queue is closed."""
        results: list[tuple[np.ndarray, ...]] = []
        while len(results) < count:
            with self._cond:
                self._wait(lambda: bool(self._items))
                if not self._items:  # closed and drained (or this thread was cancelled)
                    break
                while self._items and len(results) < count:
                    results.append(self._items.popleft())
                self._cond.notify_all()
        return results

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _queue(ctx: OpContext) -> RebatchingQueue:
    return ctx.object_input(0, RebatchingQueue, "queue", "CreateRebatchingQueue")


@register_op("CreateRebatchingQueue", inputs=0, outputs=1, side_effects=True)
def create_rebatching_queue(ctx: OpContext) -> Outputs:
    """A queue of ``capacity`` (default 1) elements of ``num_blobs`` (default 1) tensors."""
    return (RebatchingQueue(ctx.output_name(0), ctx.int_arg("capacity", 1),
                            ctx.int_arg("num_blobs", 1)),)


def _elements(ctx: OpContext, queue: RebatchingQueue) -> list[tuple[np.ndarray, ...]]:
    tensors = [np.asarray(to_host(t)) for t in ctx.inputs[1:]]
    if len(tensors) != queue.num_blobs:
        raise ctx.fail(f"queue {queue.name!r} holds {queue.num_blobs} blobs per element, got "
                       f"{len(tensors)} inputs to enqueue.")
    if not ctx.int_arg("enqueue_batch", 0):
        return [tuple(t.copy() for t in tensors)]
    rows = {t.shape[0] if t.ndim else -1 for t in tensors}
    if len(rows) != 1 or -1 in rows:
        raise ctx.fail("enqueue_batch needs inputs of at least one dimension with the same "
                       f"first dimension, got shapes {[list(t.shape) for t in tensors]}.")
    return [tuple(t[i].copy() for t in tensors) for i in range(rows.pop())]


@register_op("EnqueueRebatchingQueue", inputs=(2, None), outputs=0, side_effects=True)
def enqueue_rebatching_queue(ctx: OpContext) -> Outputs:
    """Enqueue the inputs as one element, or row by row with ``enqueue_batch``."""
    queue = _queue(ctx)
    if not queue.enqueue(_elements(ctx, queue)):
        raise QueueClosedError(ctx.describe(f"rebatching queue {queue.name!r} is closed; "
                                            "nothing more can be enqueued."))
    return ()


@register_op("DequeueRebatchingQueue", inputs=1, outputs=(1, None), side_effects=True)
def dequeue_rebatching_queue(ctx: OpContext) -> Outputs:
    """Stack ``num_elements`` (default 1) elements into one tensor per blob."""
    queue = _queue(ctx)
    if ctx.num_outputs != queue.num_blobs:
        raise ctx.fail(f"queue {queue.name!r} holds {queue.num_blobs} blobs per element, but "
                       f"the op has {ctx.num_outputs} outputs.")
    elements = queue.dequeue(ctx.int_arg("num_elements", 1))
    if not elements:
        raise QueueClosedError(ctx.describe(f"rebatching queue {queue.name!r} is closed and "
                                            "empty."))
    return tuple(np.stack([e[i] for e in elements]) for i in range(queue.num_blobs))


@register_op("CloseRebatchingQueue", inputs=1, outputs=0, side_effects=True)
def close_rebatching_queue(ctx: OpContext) -> Outputs:
    """Close the queue: waiting enqueues fail, dequeues drain it and then fail."""
    _queue(ctx).close()
    return ()


def _no_gradient(g: Any) -> None:
    """Caffe2's ``NO_GRADIENT``."""


for _op_type in ("CreateRebatchingQueue", "EnqueueRebatchingQueue", "DequeueRebatchingQueue",
                 "CloseRebatchingQueue"):
    register_gradient(_op_type)(_no_gradient)

__all__ = ["RebatchingQueue"]
