"""Suite-wide pytest configuration: golden-case summary lines."""

from __future__ import annotations

from typing import Any

from _golden import GRADIENTS, KERNELS, case_names, load_case


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print ``golden: N passed, M failed, K skipped of 152`` and the gradient line."""
    if sum(KERNELS.counts.values()):
        terminalreporter.write_line(KERNELS.line(len(case_names())))
    if sum(GRADIENTS.counts.values()):
        with_grads = sum(1 for name in case_names() if load_case(name).grad_files)
        terminalreporter.write_line(GRADIENTS.line(with_grads))
