"""The ``cpu`` backend: collectives across the local devices of one process.

It is the default backend of single-host graphs: every collective reduces or copies the
device copies of a blob in place with numpy, no other process takes part, and the world
always has one rank.  Several processes or hosts need the ``gloo`` backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, BaseBackend
from dpgraph.errors import RendezvousError


class CpuBackend(BaseBackend):
    """An in-process common world of one rank (local devices only)."""

    backend = "cpu"

    def __init__(self, name: str = "cpu", rank: int = 0, size: int = 1,
                 timeout: float = DEFAULT_TIMEOUT_SEC, engine: str = "CPU") -> None:
        if size != 1 or rank != 0:
            raise RendezvousError(
                f"Common world {name!r}: the cpu backend runs inside one process and has one "
                f"rank, got rank {rank} of {size}; use engine='GLOO' for several processes or "
                "hosts.")
        super().__init__(name, rank, size, timeout, engine)

    def clone(self, name: str) -> CpuBackend:
        return CpuBackend(name, self.rank, self.size, self.timeout, self.engine)

    # A one-rank world never reaches the cross-rank steps.
    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None:
        raise AssertionError("unreachable: one rank")

    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        raise AssertionError("unreachable: one rank")

    def _reduce_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        raise AssertionError("unreachable: one rank")

    def _allgather_host(self, local: np.ndarray, out: np.ndarray, timeout: float) -> None:
        raise AssertionError("unreachable: one rank")

    def _barrier(self, timeout: float) -> None:
        raise AssertionError("unreachable: one rank")


def create(store: Any = None, rank: int = 0, size: int = 1, name: str = "cpu",
           timeout: float = DEFAULT_TIMEOUT_SEC, **_: Any) -> CpuBackend:
    """Registry entry point; ``store`` and transport options are ignored."""
    return CpuBackend(name, rank, size, timeout)
