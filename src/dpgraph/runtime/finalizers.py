"""Finalizers that wait (for a lock, a thread, a batch in flight) without deadlocking.

A finalizer runs wherever the object happens to die.  Inside a garbage collection that can
be any allocation of any thread: in the middle of code that holds the very lock the
finalizer needs, or on the very prefetch or decode thread the finalizer waits to finish.
:func:`when_dropped` therefore runs the cleanup at once only on an ordinary drop (``del``,
a reference going out of scope) in a thread dpgraph did not start; a drop inside a
collection, or on one of dpgraph's own threads (named ``dpgraph-...``), hands the cleanup to
one reaper thread, which runs it moments later.  :func:`flush` waits for those.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("dpgraph.runtime.finalizers")

#: Prefix of the names of the threads dpgraph starts (prefetch, decode pools, executors).
THREAD_PREFIX = "dpgraph-"

# .active: this thread runs a garbage collection (collections never nest in a thread).  A
# flag, not a count: a callback that fails (a collection started at the recursion limit)
# leaves it wrong only until the next collection of the thread ends.
_collecting = threading.local()
_pending: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()  # put is reentrant
_reaper: threading.Thread | None = None
_reaper_lock = threading.Lock()


def _track_collections(phase: str, info: dict[str, Any],
                       state: threading.local = _collecting) -> None:
    state.active = phase == "start"  # (bound early: module globals are gone at shutdown)


gc.callbacks.append(_track_collections)


def when_dropped(obj: Any, cleanup: Callable[[], Any]) -> weakref.finalize:
    """Run ``cleanup()`` once ``obj`` is gone (or at interpreter exit), where it cannot
    deadlock (see the module doc).  ``cleanup`` must not reference ``obj``."""
    _start_reaper()  # here, not in the finalizer: starting a thread takes threading's locks
    return weakref.finalize(obj, _run_or_defer, cleanup)


def must_defer() -> bool:
    """Whether a cleanup that waits must not run in this thread now."""
    return (getattr(_collecting, "active", False)
            or threading.current_thread().name.startswith(THREAD_PREFIX))


def flush(timeout: float | None = None) -> bool:
    """Wait until every cleanup handed to the reaper so far has run (False: ``timeout``
    seconds passed first).  From the reaper thread itself, returns at once."""
    if _reaper is None or threading.current_thread() is _reaper:
        return True
    done = threading.Event()
    _pending.put(done.set)
    return done.wait(timeout)


def _run_or_defer(cleanup: Callable[[], Any]) -> None:
    if must_defer():
        _pending.put(cleanup)
    else:
        cleanup()


def _start_reaper() -> None:
    global _reaper
    with _reaper_lock:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name=f"{THREAD_PREFIX}reaper", daemon=True)
            _reaper.start()


def _forget_reaper_after_fork() -> None:
    """A forked child has no reaper thread, and its parent's pending cleanups are not its
    own: it starts afresh (its next :func:`when_dropped` starts a reaper)."""
    global _reaper, _pending, _reaper_lock
    _reaper, _pending, _reaper_lock = None, queue.SimpleQueue(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reaper_after_fork)


def _reap() -> None:
    while True:
        cleanup = _pending.get()
        try:
            cleanup()
        except Exception:  # noqa: BLE001  (one failed cleanup must not stop the others)
            logger.exception("a deferred cleanup failed: %r", cleanup)
