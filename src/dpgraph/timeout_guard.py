"""Caffe2's ``timeout_guard``: kill a process that hangs.

``with CompleteInTimeOrDie(600): ...`` starts a watchdog thread; if the block has not finished
after ``timeout_secs`` the watchdog logs the stack of every thread and exits the process with
status 1 (``os._exit``, so a hung thread or a stuck ``atexit`` handler cannot stop it).
``EuthanizeIfNecessary(timeout_secs)`` does the same for the rest of the process's life, for
scripts that hang at shutdown.  Tests pass ``exit_fn`` to observe the exit instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator

logger = logging.getLogger("dpgraph.timeout_guard")

ExitFn = Callable[[int], object]


def _default_exit(status: int) -> None:
    os._exit(status)


def _all_thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


class WatcherThread(threading.Thread):
    """A daemon thread that exits the process unless :meth:`complete` is called in time."""

    def __init__(self, timeout_secs: float, exit_fn: ExitFn | None = None) -> None:
        super().__init__(name="dpgraph-timeout-guard", daemon=True)
        self.timeout_secs = timeout_secs
        self.exit_fn: ExitFn = exit_fn or _default_exit
        self.completed = False
        self.fired = False
        self._done = threading.Event()

    def complete(self) -> None:
        """The guarded work finished: stop watching."""
        self.completed = True
        self._done.set()

    def run(self) -> None:
        if self._done.wait(self.timeout_secs):
            return
        self.fired = True
        logger.error("Did not complete within %s s; stacks of all threads:\n%s",
                     self.timeout_secs, _all_thread_stacks())
        logger.error("Exiting the process (timeout_guard).")
        for handler in logging.getLogger().handlers + logger.handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        self.exit_fn(1)


@contextlib.contextmanager
def CompleteInTimeOrDie(timeout_secs: float, exit_fn: ExitFn | None = None
                        ) -> Iterator[WatcherThread]:
    """Exit the process if the ``with`` block runs longer than ``timeout_secs``."""
    watcher = WatcherThread(timeout_secs, exit_fn)
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.complete()


def EuthanizeIfNecessary(timeout_secs: float = 120, exit_fn: ExitFn | None = None
                         ) -> WatcherThread:
    """Exit the process if it is still alive ``timeout_secs`` from now (e.g. hung at exit).

    Returns the watchdog; its :meth:`~WatcherThread.complete` cancels it.
    """
    watcher = WatcherThread(timeout_secs, exit_fn)
    watcher.start()
    return watcher


__all__ = ["CompleteInTimeOrDie", "EuthanizeIfNecessary", "WatcherThread"]
