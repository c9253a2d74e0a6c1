"""Suite-wide pytest configuration: a hang watchdog and golden-case summary lines."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from typing import IO, Any

import pytest
from _golden import GRADIENTS, KERNELS, case_names, load_case

#: A test still running after this many seconds has hung: every thread's stack is written
#: to the terminal and the run ends, so CI fails at once, naming the place of the hang,
#: instead of at its time limit with nothing to go on.
HANG_SECONDS = float(os.environ.get("DPGRAPH_TEST_HANG_SECONDS", "300"))
_terminal: list[IO[str]] = []  # a copy of stderr that pytest's output capture does not take


def pytest_configure(config: pytest.Config) -> None:
    if not _terminal:
        _terminal.append(os.fdopen(os.dup(2), "w"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    if HANG_SECONDS > 0:
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=_terminal[0])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print ``golden: N passed, M failed, K skipped of 152`` and the gradient line."""
    if sum(KERNELS.counts.values()):
        terminalreporter.write_line(KERNELS.line(len(case_names())))
    if sum(GRADIENTS.counts.values()):
        with_grads = sum(1 for name in case_names() if load_case(name).grad_files)
        terminalreporter.write_line(GRADIENTS.line(with_grads))
