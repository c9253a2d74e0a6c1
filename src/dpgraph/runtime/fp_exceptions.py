"""Caffe2's floating-point exception flags for operators.

``GlobalInit(["prog", "--caffe2_operator_throw_if_fp_exceptions=1"])`` makes every op that
divides by zero (FE_DIVBYZERO) or produces an invalid result such as ``0/0`` or
``sqrt(-1)`` (FE_INVALID) fail; ``--caffe2_operator_throw_if_fp_overflow_exceptions=1`` does
the same for overflow (FE_OVERFLOW).  ``--caffe2_operator_throw_on_first_occurrence_if_fp_
exceptions`` is accepted: numpy stops at the first occurrence in any case.

The executor calls :func:`run_kernel` instead of the kernel while :data:`state` is active:
it runs the kernel under ``numpy.errstate`` with those conditions set to raise and turns
numpy's ``FloatingPointError`` into an ``OperatorError`` with Caffe2's message.  Only numpy
arithmetic is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, OperatorError

THROW_IF_FP = "caffe2_operator_throw_if_fp_exceptions"
THROW_IF_OVERFLOW = "caffe2_operator_throw_if_fp_overflow_exceptions"
FIRST_OCCURRENCE = "caffe2_operator_throw_on_first_occurrence_if_fp_exceptions"
#: The GlobalInit flags this module handles.
FLAGS = frozenset({THROW_IF_FP, THROW_IF_OVERFLOW, FIRST_OCCURRENCE})

_MESSAGES = {
    "divide": "Division by zero floating point exception (FE_DIVBYZERO) reported.",
    "invalid": "Invalid floating point exception (FE_INVALID) reported.",
    "overflow": "Overflow floating point exception (FE_OVERFLOW) reported.",
}


class _State:
    """The flags as set by GlobalInit; ``active`` is read on every op run."""

    def __init__(self) -> None:
        self.throw_if_fp = False
        self.throw_if_overflow = False
        self.active = False

    def set(self, flag: str, value: str) -> None:
        on = _flag_value(flag, value)
        if flag == THROW_IF_FP:
            self.throw_if_fp = on
        elif flag == THROW_IF_OVERFLOW:
            self.throw_if_overflow = on
        self.active = self.throw_if_fp or self.throw_if_overflow


state = _State()


def _flag_value(flag: str, value: str) -> bool:
    """gflags' bool syntax: ``--flag`` (true), ``--flag=1/0/true/false``."""
    text = value.strip().lower()
    if text in ("", "1", "true", "t", "yes", "y"):
        return True
    if text in ("0", "false", "f", "no", "n"):
        return False
    raise ArgumentError(f"GlobalInit: --{flag}={value!r} needs a boolean (1/0/true/false).")


def set_flag(flag: str, value: str) -> None:
    """Apply one GlobalInit flag of :data:`FLAGS` (``value``: the text after ``=``)."""
    state.set(flag, value)


def run_kernel(kernel: Callable[[Any], Any], ctx: Any) -> Any:
    """``kernel(ctx)`` with the enabled floating-point conditions raising."""
    raising: dict[str, Any] = {}
    if state.throw_if_fp:
        raising.update(divide="raise", invalid="raise")
    if state.throw_if_overflow:
        raising["over"] = "raise"
    try:
        with np.errstate(**raising):  # the other conditions keep their current setting
            return kernel(ctx)
    except FloatingPointError as error:
        text = str(error)
        kind = next((k for k in _MESSAGES if k in text), "invalid")
        raise OperatorError(f"{_MESSAGES[kind]} ({text})") from error
