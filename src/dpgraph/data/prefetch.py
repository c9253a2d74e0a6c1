"""Decode thread pools and one-batch-ahead prefetching for the input ops.

Pools are shared per size and live for the process (idle threads cost nothing and are
joined at exit).  A :class:`Prefetcher` keeps the next batch in flight: each call returns the
batch started by the previous call and starts the next one, so the delivered sequence is the
same as reading synchronously.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dpgraph.ops.queue import cancel_blocking_waits

_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def _release_pool_threads() -> None:
    """At interpreter exit, before the pools are joined: a decode or prefetch task blocked
    on a blobs queue (an ImageInput over CreateBlobsQueueDB) gives up instead of hanging."""
    pools = list(_POOLS.values()) + list(_PREFETCH_POOL)
    cancel_blocking_waits(t.ident for pool in pools for t in getattr(pool, "_threads", ()))


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


_PREFETCH_POOL: list[ThreadPoolExecutor] = []


def _prefetch_pool() -> ThreadPoolExecutor:
    with _LOCK:
        if not _PREFETCH_POOL:
            _PREFETCH_POOL.append(ThreadPoolExecutor(4, thread_name_prefix="dpgraph-prefetch"))
        return _PREFETCH_POOL[0]


class Prefetcher:
    """Runs ``produce(token)`` one call ahead on a background thread."""

    def __init__(self) -> None:
        self._pending: Future[Any] | None = None
        self._lock = threading.Lock()

    def next(self, produce: Callable[[Any], Any], draw: Callable[[], Any]) -> Any:
        """The next batch (prefetched by the previous call, else produced now from a fresh
        ``draw()`` token); then start producing the following one from another ``draw()``.
        Tokens are drawn in batch order, so the batches match synchronous reading."""
        with self._lock:
            pending, self._pending = self._pending, None
            result = pending.result() if pending is not None else produce(draw())
            self._pending = _prefetch_pool().submit(produce, draw())
            return result

    def cancel(self) -> None:
        """Wait for the batch in flight and drop it (its records are consumed)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.exception()


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
