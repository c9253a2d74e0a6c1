"""Blob values as arrays: the one definition of "is this an array" and "its host copy".

Blobs hold numpy arrays on CPUs and virtual GPUs and CuPy arrays on real GPUs.  CuPy arrays
are recognised by their type's module, so nothing here imports CuPy.  Every layer (the
serializer, op kernels, the runtime, collective backends) uses these.
"""

from __future__ import annotations

import weakref
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


# --- storage several blobs share (UnsafeCoalesce) --------------------------------------------
_SHARED_STORAGE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def mark_shared_storage(*arrays: Any) -> None:
    """Record that these arrays are storage other blobs share (an op made them views of one
    buffer), so feeding one of them writes into it as Caffe2's FeedBlob does."""
    for array in arrays:
        _SHARED_STORAGE[id(array)] = array


def is_shared_storage(value: Any) -> bool:
    """Whether ``value`` was marked by :func:`mark_shared_storage` (and is still alive)."""
    return _SHARED_STORAGE.get(id(value)) is value
