"""Who hears of operator runs: the observers of the nets running now.

:mod:`dpgraph.runtime.observers` adds a net's observers to :data:`ACTIVE` while that net
runs; the operator runner and kernels that run ops of their own (a RecurrentNetwork's step
net) call :func:`report` after each op while the list is not empty.
"""

from __future__ import annotations

from typing import Any

#: The observers listening now (mutated in place; empty almost always).
ACTIVE: list[Any] = []


def report(op: Any, seconds: float) -> None:
    """``op`` finished a run that took ``seconds``."""
    for observer in list(ACTIVE):
        observer.op_finished(op, seconds)
