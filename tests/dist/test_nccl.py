"""The nccl backend.  GPU tests run only with CuPy and real GPUs; the host-buffer path (as on
virtual GPUs) runs everywhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph.collectives import create_backend
from dpgraph.collectives.nccl import NcclBackend


def _gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver
        return 0


GPUS = _gpu_count()
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs CuPy and a real GPU (none here)")
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs CuPy and at least 2 real GPUs")


def test_host_buffers_reduce_on_the_host() -> None:
    world = create_backend("nccl", world="w")
    assert isinstance(world, NcclBackend)
    copies = [np.full(4, i + 1, np.float32) for i in range(3)]
    world.allreduce(copies)
    for copy in copies:
        np.testing.assert_array_equal(copy, np.full(4, 6, np.float32))
    world.broadcast(copies, root=0)
    world.barrier()


class _RecordingHostWorld:
    """Stands in for the Gloo world that carries host buffers across processes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None:
        self.calls.append("allreduce")
        buffer *= 2  # as if a second rank held the same values

    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        self.calls.append(f"broadcast from {root}")

    def _barrier(self, timeout: float) -> None:
        self.calls.append("barrier")


def test_host_buffers_cross_processes_through_the_gloo_host_world() -> None:
    world = NcclBackend(None, 0, 1, "w")
    world.size = 2  # as if several processes
    host = world._host = _RecordingHostWorld()  # type: ignore[assignment]
    copies = [np.ones(2, np.float32), np.ones(2, np.float32)]
    world.allreduce(copies)
    world.broadcast(copies, root=1)
    world.barrier()
    assert host.calls == ["allreduce", "broadcast from 1", "barrier"]
    np.testing.assert_array_equal(copies[1], [4.0, 4.0])  # local sum 2, then x2 across ranks


def _device_copies(cupy: Any, count: int) -> list[Any]:
    copies = []
    for gpu in range(count):
        with cupy.cuda.Device(gpu):
            copies.append(cupy.full(1 << 16, gpu + 1, dtype=cupy.float32))
    return copies


@pytest.mark.gpu
@needs_gpu
def test_one_gpu_allreduce_is_identity() -> None:
    import cupy

    world = create_backend("nccl", world="w1")
    (copy,) = world.allreduce(_device_copies(cupy, 1))
    assert float(copy[0]) == 1.0


@pytest.mark.gpu
@needs_two_gpus
def test_local_gpus_allreduce_and_broadcast() -> None:
    import cupy

    world = create_backend("nccl", world="w2")
    copies = _device_copies(cupy, GPUS)
    world.allreduce(copies)
    expected = GPUS * (GPUS + 1) / 2
    for gpu, copy in enumerate(copies):
        assert copy.device.id == gpu
        assert float(cupy.asnumpy(copy).min()) == float(cupy.asnumpy(copy).max()) == expected
    copies = _device_copies(cupy, GPUS)
    world.broadcast(copies, root=0)
    for copy in copies:
        assert float(copy.sum()) == copy.size
