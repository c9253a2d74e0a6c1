"""Decode thread pools and one-batch-ahead prefetching for the input ops.

Decode pools are shared per size and live for the process (idle threads cost nothing and
are joined at exit).  A :class:`Prefetcher` (one per input op instance, with its own thread)
keeps the next batch in flight: each call returns the batch started by the previous call and
starts the next one, so the delivered sequence is the same as reading synchronously.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dpgraph.ops.queue import cancel_blocking_waits, forget_cancelled

_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def _release_pool_threads() -> None:
    """At interpreter exit, before the threads are joined: a decode or prefetch task
    blocked on a blobs queue (an input op over CreateBlobsQueueDB) gives up instead of
    hanging, and prefetch threads end."""
    cancel_blocking_waits(t.ident for pool in _POOLS.values()
                          for t in getattr(pool, "_threads", ()))
    for prefetcher in list(_LIVE):
        prefetcher.release_at_exit()


if hasattr(threading, "_register_atexit"):  # runs before concurrent.futures joins its pools
    threading._register_atexit(_release_pool_threads)


def decode_pool(threads: int) -> ThreadPoolExecutor:
    """The shared pool with ``threads`` workers."""
    threads = max(1, int(threads))
    with _LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = ThreadPoolExecutor(threads, thread_name_prefix=f"dpgraph-decode{threads}")
            _POOLS[threads] = pool
        return pool


#: How long closing an op waits for its prefetch before telling a queue wait to give up.
CLOSE_WAIT_SECONDS = 1.0
#: Read ahead in the caller's thread when the caller spends less than this share of a
#: batch's read time between two calls: a background thread could overlap only that much,
#: and handing batches between threads costs more.
INLINE_GAP_SHARE = 0.25
#: Weight of the newest sample in the running averages of gap and read time.
_SMOOTHING = 0.25


class Prefetcher:
    """Keeps the next batch read ahead, as Caffe2's PrefetchOperator: the reader stays one
    batch ahead of what the op delivered, and the delivered sequence is the synchronous one.

    The batch after the one delivered is read on the op's own thread while the net runs, so
    reading overlaps the net's work.  When the caller comes back almost at once (a loop that
    only reads), there is nothing to overlap, and the next batch is read in the caller's
    thread right after delivering this one.  ``may_block`` (a reader waiting on a blobs
    queue) always uses the thread, so a delivered batch never waits for the next one."""

    def __init__(self, may_block: bool = False) -> None:
        self.may_block = may_block
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._in_flight = False
        self._ready: list[tuple[bool, Any]] = []  # a batch read ahead in the caller's thread
        self._returned = 0.0  # when the last call returned
        self._gap: float | None = None  # the caller's time between calls (running average)
        self._cost: float | None = None  # the time to read a batch (running average)
        self._lock = threading.Lock()

    def next(self, produce: Callable[[Any], Any], draw: Callable[[], Any]) -> Any:
        """The next batch (read ahead by the previous call, else produced now from a fresh
        ``draw()`` token); then start reading the following one from another ``draw()``.
        Tokens are drawn in batch order, so the batches match synchronous reading.  A failed
        read ahead raises here, and the call after it reads synchronously again."""
        with self._lock:
            if self._returned:
                self._gap = _average(self._gap, time.perf_counter() - self._returned)
            if self._ready:
                result = _unwrap(self._ready.pop())
            elif self._in_flight:
                result = self._collect()
            else:
                result = self._timed(produce, draw())[1]
            if self._read_here():
                self._ready.append(self._timed_outcome(produce, draw(), Exception))
            else:
                self._start(produce, draw())
            self._returned = time.perf_counter()
            return result

    def close(self) -> None:
        """The op is destroyed: the batch read ahead is dropped once read (its records are
        consumed, as in Caffe2; one still blocked on a blobs queue after
        ``CLOSE_WAIT_SECONDS`` gives up) and the thread ends."""
        with self._lock:
            self._ready.clear()
            if self._in_flight:
                self._drain()
                self._in_flight = False
            if self._thread is not None:
                self._requests.put(None)
                self._thread.join()
                self._thread = None
                _LIVE.discard(self)

    # --- reading ---------------------------------------------------------------------------
    def _read_here(self) -> bool:
        return (not self.may_block and self._gap is not None and self._cost is not None
                and self._gap < INLINE_GAP_SHARE * self._cost)

    def _timed(self, produce: Callable[[Any], Any], token: Any) -> tuple[bool, Any]:
        start = time.perf_counter()
        try:
            return True, produce(token)
        finally:
            self._cost = _average(self._cost, time.perf_counter() - start)

    def _timed_outcome(self, produce: Callable[[Any], Any], token: Any,
                       kept: type[BaseException] = BaseException) -> tuple[bool, Any]:
        """``(True, batch)``, or ``(False, error)`` for an error of type ``kept`` (raised
        when the batch is delivered; in the caller's thread a Ctrl-C raises at once)."""
        try:
            return self._timed(produce, token)
        except kept as error:
            return False, error

    def _collect(self) -> Any:
        """The batch read ahead on the thread.  The flag drops only once it is taken, so a
        wait cut short (Ctrl-C) leaves it for the next call, in order."""
        outcome = self._results.get()
        self._in_flight = False
        return _unwrap(outcome)

    def _start(self, produce: Callable[[Any], Any], token: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="dpgraph-prefetch")
            self._thread.start()
            _LIVE.add(self)
        self._requests.put((produce, token))
        self._in_flight = True

    def _serve(self) -> None:
        while self._serve_one(self._requests.get()):
            pass

    def _serve_one(self, request: Any) -> bool:
        """Read one requested batch (``None``: stop); nothing of it stays referenced after."""
        if request is None:
            return False
        self._results.put(self._timed_outcome(*request))
        return True

    def _drain(self) -> None:
        try:
            self._results.get(timeout=CLOSE_WAIT_SECONDS)
        except queue.Empty:
            thread = self._thread.ident if self._thread is not None else None
            cancel_blocking_waits([thread])
            self._results.get()
            forget_cancelled([thread])

    def release_at_exit(self) -> None:
        """Interpreter exit: end the thread after its batch, unblocking a queue wait."""
        if self._thread is not None:
            cancel_blocking_waits([self._thread.ident])
            self._requests.put(None)


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else current + _SMOOTHING * (sample - current)


def _unwrap(outcome: tuple[bool, Any]) -> Any:
    ok, value = outcome
    if not ok:
        raise value
    return value


#: Prefetchers whose thread runs (each holds itself through its thread until closed).
_LIVE: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


class ArrayRecycler:
    """Batch buffers handed out again once nobody else holds them.

    A fresh 20 MB batch array costs a page fault per 4 KB on first write; reusing a buffer
    that only this recycler still references (its reference count says so) avoids that.
    Any other holder (the workspace blob, a view, a user's reference) keeps it out of use.
    """

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._buffers: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            buffers = self._buffers.setdefault(key, [])
            for buffer in buffers:
                if sys.getrefcount(buffer) <= 3:  # the list, the loop name, the call's arg
                    return buffer
            buffer = np.empty(shape, dtype=dtype)
            if len(buffers) >= self._keep:
                buffers.pop(0)
            buffers.append(buffer)
            return buffer


_RECYCLER = ArrayRecycler()


def batch_buffer(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised batch array, recycled when a previous one is free again."""
    return _RECYCLER.empty(shape, dtype)
