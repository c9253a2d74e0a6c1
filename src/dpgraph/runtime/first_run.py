"""Checks that run once per created net, just before its first run.

A check is ``fn(workspace, net_def)``; it may raise to stop the run (the net is not run).
Higher layers register theirs (the collective-schedule check of
:mod:`dpgraph.parallel.schedule_check` registers itself when imported), so the runtime
needs no knowledge of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FirstRunCheck = Callable[[Any, Any], None]

_CHECKS: list[FirstRunCheck] = []


def register_first_run_check(check: FirstRunCheck) -> None:
    """Run ``check(workspace, net_def)`` before the first run of every net instance
    (registering the same function twice keeps one)."""
    if check not in _CHECKS:
        _CHECKS.append(check)


def run_first_run_checks(workspace: Any, net_def: Any) -> None:
    """Called by the runtime before a net instance's first run."""
    for check in list(_CHECKS):
        check(workspace, net_def)
