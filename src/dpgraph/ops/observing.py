"""Who hears of operator runs: the observers of the nets running now.

:mod:`dpgraph.runtime.observers` adds a net's observers to :data:`ACTIVE` while that net
runs; the operator runner (inside :func:`running`) and kernels that run ops of their own (a
RecurrentNetwork's step net) call :func:`report` after each op while the list is not empty.
An observer hears of its net's ops and of the ops run inside them (a step net's, a subnet's),
not of ops that other nets run at the same time in other threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

#: The observers listening now (mutated in place; empty almost always).
ACTIVE: list[Any] = []
_THREAD = threading.local()


@contextlib.contextmanager
def running(op: Any) -> Iterator[None]:
    """``op`` runs in this thread: ops reported inside it are attributed to it (and to the
    op running it in turn, up to the outermost one)."""
    stack = getattr(_THREAD, "stack", None)
    if stack is None:
        stack = _THREAD.stack = []
    stack.append(op)
    try:
        yield
    finally:
        stack.pop()


def report(op: Any, seconds: float) -> None:
    """``op`` finished a run that took ``seconds``: tell the observers of its net, and those
    of the nets whose ops it ran inside."""
    stack = getattr(_THREAD, "stack", None) or ()
    for observer in list(ACTIVE):
        if observer.observes(op) or any(observer.observes(outer) for outer in stack):
            observer.op_finished(op, seconds)
