"""Devices and placement: virtual GPUs, real GPUs through CuPy, array modules, access rules.

Every ``(device type, device id)`` pair is its own placement.  Host devices (CPU, MKLDNN,
IDEEP) share host memory.  GPU placements run either on *virtual GPUs* (numpy, enabled by
:func:`SetVirtualGpus` or ``DPGRAPH_VIRTUAL_GPUS=n``) or on real GPUs through CuPy, which is
imported lazily and only when no virtual GPUs are configured.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, DeviceError
from dpgraph.ir.arrays import is_array, to_host  # noqa: F401  (re-exported: one definition)
from dpgraph.ir.device import device_name
from dpgraph.proto import caffe2_pb2

DeviceKey = tuple[int, int]
CPU = caffe2_pb2.PROTO_CPU
CUDA = caffe2_pb2.PROTO_CUDA
HIP = caffe2_pb2.PROTO_HIP
HOST_TYPES = frozenset({CPU, caffe2_pb2.PROTO_MKLDNN, caffe2_pb2.PROTO_IDEEP})
GPU_TYPES = frozenset({CUDA, HIP})
CPU_KEY: DeviceKey = (CPU, 0)

ENABLE_HINT = ("enable virtual GPUs with dpgraph.workspace.SetVirtualGpus(n) or the "
               "environment variable DPGRAPH_VIRTUAL_GPUS=n to run CUDA device options on numpy")

_lock = threading.Lock()


class _GpuState:
    """The process-wide GPU configuration (virtual count, peer access, real-GPU probe)."""

    def __init__(self) -> None:
        self.virtual = 0
        self.peer: np.ndarray = np.zeros((0, 0), dtype=bool)
        self.real: int | None = None  # probed lazily
        self.cupy: Any = None
        env = os.environ.get("DPGRAPH_VIRTUAL_GPUS", "").strip()
        if env:
            try:
                count = int(env)
            except ValueError as error:
                raise DeviceError(
                    f"DPGRAPH_VIRTUAL_GPUS must be an integer, got {env!r}.") from error
            self.set_virtual(count, None)

    def set_virtual(self, count: int, peer_access: Any) -> None:
        if count < 0:
            raise ArgumentError(f"SetVirtualGpus: the number of GPUs must be >= 0, got {count}.")
        if peer_access is None:
            peer = np.ones((count, count), dtype=bool)
        else:
            peer = np.array(peer_access, dtype=bool)
            if peer.shape != (count, count):
                raise ArgumentError(
                    f"SetVirtualGpus: peer_access must be a {count}x{count} bool matrix, "
                    f"got shape {peer.shape}.")
            peer = peer | np.eye(count, dtype=bool)  # a device always reaches itself
        self.virtual, self.peer = count, peer


_state = _GpuState()


def SetVirtualGpus(n: int, peer_access: Any = None) -> None:
    """Run CUDA device options on ``n`` numpy-backed virtual GPUs (0 turns them off).

    ``peer_access`` is an ``n x n`` bool matrix (default: every pair may access the other).
    """
    if isinstance(n, bool) or not hasattr(type(n), "__index__"):
        raise ArgumentError(f"SetVirtualGpus: the number of GPUs must be an int, got "
                            f"{type(n).__name__} {n!r}.")
    with _lock:
        _state.set_virtual(int(n), peer_access)


def virtual_gpu_count() -> int:
    return _state.virtual


def cupy_module() -> Any:
    """The cupy module when CuPy and at least one GPU are present, else ``None``."""
    if _state.real is None:
        with _lock:
            if _state.real is None:
                try:
                    import cupy  # type: ignore[import-not-found]

                    count = int(cupy.cuda.runtime.getDeviceCount())
                    _state.cupy = cupy if count > 0 else None
                    _state.real = count
                except Exception:  # no CuPy, no driver, no device
                    _state.real = 0
    return _state.cupy


def real_gpu_count() -> int:
    """Real CUDA GPUs visible through CuPy (0 without CuPy or GPUs)."""
    cupy_module()
    return int(_state.real or 0)


def uses_real_gpus() -> bool:
    return _state.virtual == 0 and real_gpu_count() > 0


def NumGpuDevices() -> int:
    """Virtual GPUs when enabled, otherwise real GPUs (0 without any)."""
    return _state.virtual if _state.virtual else real_gpu_count()


def GetGpuPeerAccessPattern() -> np.ndarray:
    """``N x N`` bool matrix of which GPU may read which; ``np.array([])`` without GPUs."""
    if _state.virtual:
        return _state.peer.copy()
    count = real_gpu_count()
    if count == 0:
        return np.array([])
    runtime = cupy_module().cuda.runtime
    return np.array([[i == j or bool(runtime.deviceCanAccessPeer(i, j)) for j in range(count)]
                     for i in range(count)], dtype=bool)


def GetCUDAVersion() -> int:
    """The CUDA runtime version of real GPUs; 0 without CUDA (virtual GPUs included)."""
    return int(cupy_module().cuda.runtime.runtimeGetVersion()) if uses_real_gpus() else 0


def GetCuDNNVersion() -> int:
    """The cuDNN version of real GPUs; 0 without CUDA or cuDNN."""
    if not uses_real_gpus():
        return 0
    try:
        from cupy.cuda import cudnn  # type: ignore[import-not-found]

        return int(cudnn.getVersion())
    except Exception:
        return 0


def GetGPUMemoryInfo() -> dict[str, Any]:
    """Caffe2's tracked GPU memory report; dpgraph does not track allocations, so every
    count is 0 (one entry per GPU)."""
    count = NumGpuDevices()
    return {"total_by_gpu": [0] * count, "max_by_gpu": [0] * count, "total": 0,
            "max_total": 0}


def GetDeviceProperties(device_id: int) -> dict[str, Any]:
    """Caffe2-style properties of GPU ``device_id`` (``name``, ``total_memory``, ...)."""
    count = NumGpuDevices()
    if not 0 <= device_id < count:
        raise DeviceError(f"GetDeviceProperties: no GPU {device_id}; there are {count} GPUs"
                          + ("" if count else f" ({ENABLE_HINT})") + ".")
    if _state.virtual:
        return {"name": f"dpgraph virtual GPU {device_id}", "major": 0, "minor": 0,
                "total_memory": 0, "multi_processor_count": 0, "virtual": True}
    props = cupy_module().cuda.runtime.getDeviceProperties(device_id)
    name = props.get("name", b"")
    return {"name": name.decode() if isinstance(name, bytes) else str(name),
            "major": props.get("major", 0), "minor": props.get("minor", 0),
            "total_memory": props.get("totalGlobalMem", 0),
            "multi_processor_count": props.get("multiProcessorCount", 0), "virtual": False}


# --- placement rules -------------------------------------------------------------------------
def is_host(key: DeviceKey) -> bool:
    return key[0] in HOST_TYPES


def is_gpu(key: DeviceKey) -> bool:
    return key[0] in GPU_TYPES


def check_device(key: DeviceKey, what: str = "") -> None:
    """Raise DeviceError if placement ``key`` does not exist in this process."""
    if is_host(key):
        return
    if not is_gpu(key):
        raise DeviceError(f"{what}device type {key[0]} ({device_name(key)}) is not supported; "
                          "use CPU or CUDA device options.")
    count = NumGpuDevices()
    if count == 0:
        raise DeviceError(f"{what}{device_name(key)} is a CUDA device but this process has no "
                          f"GPU; {ENABLE_HINT}.")
    if key[1] >= count or key[1] < 0:
        raise DeviceError(f"{what}{device_name(key)} does not exist: there are {count} GPUs "
                          f"(ids 0..{count - 1}).")


def array_module(key: DeviceKey) -> Any:
    """numpy for host devices and virtual GPUs, cupy for real GPUs."""
    check_device(key)
    if is_host(key) or _state.virtual:
        return np
    return cupy_module()


def can_read(reader: DeviceKey, blob: DeviceKey) -> bool:
    """May an op on ``reader`` read a blob placed on ``blob`` (without being cross_device)?"""
    if reader == blob:
        return True
    if is_host(blob):
        return True  # host blobs are readable everywhere (counters, learning rates)
    if is_host(reader):
        return False
    if not (is_gpu(reader) and is_gpu(blob)):
        return False
    peer = _state.peer if _state.virtual else GetGpuPeerAccessPattern()
    try:
        return bool(peer[reader[1], blob[1]])
    except IndexError:
        return False


def to_device(value: Any, key: DeviceKey) -> Any:
    """``value`` as an array on placement ``key`` (always a new array)."""
    xp = array_module(key)
    if xp is np:
        return np.array(to_host(value), copy=True)
    with xp.cuda.Device(key[1]):
        return xp.array(value, copy=True)


@contextlib.contextmanager
def device_context(key: DeviceKey) -> Iterator[None]:
    """Make ``key`` the current CUDA device while a kernel runs (no-op for numpy)."""
    if is_gpu(key) and uses_real_gpus():
        with cupy_module().cuda.Device(key[1]):
            yield
    else:
        yield
