"""Blob values as arrays: the one definition of "is this an array" and "its host copy".

Blobs hold numpy arrays on CPUs and virtual GPUs and CuPy arrays on real GPUs.  CuPy arrays
are recognised by their type's module, so nothing here imports CuPy.  Every layer (the
serializer, op kernels, the runtime, collective backends) uses these.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_cupy_array(value: Any) -> bool:
    """True for a CuPy array (without importing CuPy)."""
    return type(value).__module__.startswith("cupy") and hasattr(value, "get")


def is_array(value: Any) -> bool:
    """True for numpy and CuPy arrays (placement and copies matter only for those)."""
    return isinstance(value, np.ndarray) or is_cupy_array(value)


def to_host(value: Any) -> Any:
    """``value`` copied off the GPU when it is a CuPy array; any other value unchanged."""
    return value.get() if is_cupy_array(value) else value


def host(value: Any) -> np.ndarray:
    """``value`` as a numpy array (copied off the GPU for CuPy arrays, a view if possible)."""
    return np.asarray(to_host(value))
