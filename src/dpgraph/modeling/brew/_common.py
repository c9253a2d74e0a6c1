"""Shared checks for brew helpers."""

from __future__ import annotations

import numbers
from typing import Any

from dpgraph.errors import ModelConfigError

ORDERS = ("NCHW", "NHWC")


def check_dim(helper: str, name: str, value: Any) -> int:
    """``value`` as a positive int, else a ModelConfigError naming the helper."""
    if type(value) is int:  # the usual case, without the numbers.Integral (ABC) check
        if value > 0:
            return value
    elif not isinstance(value, bool) and isinstance(value, numbers.Integral) and int(value) > 0:
        return int(value)
    raise ModelConfigError(f"brew.{helper}: {name} must be a positive integer, got {value!r}.")


def check_order(helper: str, order: Any) -> str:
    if order not in ORDERS:
        raise ModelConfigError(
            f"brew.{helper}: unknown storage order {order!r}; use 'NCHW' or 'NHWC'.")
    return order


def out_name(model: Any, blob_out: Any) -> Any:
    """``blob_out``, or a fresh ``<net>_blob_N`` name when it is None."""
    return blob_out or model.net.NextName()
