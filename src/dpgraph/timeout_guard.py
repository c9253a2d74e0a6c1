"""Caffe2's ``timeout_guard``: kill a process that hangs.

``with CompleteInTimeOrDie(600): ...`` starts a daemon watchdog thread.  If the block has not
finished after ``timeout_secs``, the watchdog logs ``Call did not finish in time. Timeout:
<t>s PID: <pid>`` and the stack of every thread (logger ``timeout_guard``), starts a
force-quit thread that prints the caller's stack and calls ``os.abort()`` 10 s later, and
sends the process SIGINT (a ``KeyboardInterrupt`` in the main thread, so ``finally`` blocks
and atexit handlers get a chance first).  ``EuthanizeIfNecessary(timeout_secs)`` arms a
watchdog that is never completed: the process dies if it is still alive by then.

As in Caffe2, ``CompleteInTimeOrDie`` marks the watchdog completed only when the block
exits normally; a block that raises leaves it armed.  Tests pass ``exit_fn`` to observe the
timeout instead of signalling and aborting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

logger = logging.getLogger("timeout_guard")

ExitFn = Callable[[int], object]
FORCE_QUIT_AFTER_SECS = 10.0


def _all_thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


def _force_quit(caller_ident: int | None) -> None:
    time.sleep(FORCE_QUIT_AFTER_SECS)
    frame = sys._current_frames().get(caller_ident) if caller_ident is not None else None
    if frame is not None:
        print("Caller thread was:\n" + "".join(traceback.format_stack(frame)),
              file=sys.stderr, flush=True)
    print("Force quitting the process.", file=sys.stderr, flush=True)
    os.abort()


class WatcherThread(threading.Thread):
    """A daemon thread that brings the process down unless :meth:`complete` is called in
    time (see the module docstring)."""

    def __init__(self, timeout_secs: float, exit_fn: ExitFn | None = None) -> None:
        super().__init__(name="timeout_guard", daemon=True)
        self.timeout_secs = timeout_secs
        self.exit_fn = exit_fn
        self.completed = False
        self.fired = False
        self.condition = threading.Condition()
        self.caller_thread = threading.current_thread()

    def complete(self) -> None:
        """The guarded work finished: stop watching."""
        with self.condition:
            self.completed = True
            self.condition.notify_all()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_secs
        with self.condition:
            while not self.completed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.condition.wait(left)
            if self.completed:
                return
        self.fired = True
        logger.error("Call did not finish in time. Timeout:%ss PID: %s", self.timeout_secs,
                     os.getpid())
        logger.error("Stacks of all threads:\n%s", _all_thread_stacks())
        for handler in logging.getLogger().handlers + logger.handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        if self.exit_fn is not None:
            self.exit_fn(1)
            return
        threading.Thread(target=_force_quit, args=(self.caller_thread.ident,),
                         name="timeout_guard_force_quit", daemon=True).start()
        os.kill(os.getpid(), signal.SIGINT)


@contextlib.contextmanager
def CompleteInTimeOrDie(timeout_secs: float, exit_fn: ExitFn | None = None
                        ) -> Iterator[WatcherThread]:
    """Bring the process down if the ``with`` block runs longer than ``timeout_secs``."""
    watcher = WatcherThread(timeout_secs, exit_fn)
    watcher.start()
    yield watcher
    watcher.complete()


def EuthanizeIfNecessary(timeout_secs: float = 120, exit_fn: ExitFn | None = None
                         ) -> WatcherThread:
    """Bring the process down if it is still alive ``timeout_secs`` from now (e.g. hung at
    exit).  Returns the watchdog; its :meth:`~WatcherThread.complete` cancels it."""
    watcher = WatcherThread(timeout_secs, exit_fn)
    watcher.start()
    return watcher


__all__ = ["CompleteInTimeOrDie", "EuthanizeIfNecessary", "WatcherThread"]
