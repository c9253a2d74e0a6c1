"""A backend's transport failures become CollectiveTimeoutError ("a peer died or is late");
any other exception (a bug, bad input) propagates as it is."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph.collectives.base import BaseBackend
from dpgraph.errors import CollectiveTimeoutError, DeviceError


class _FailingBackend(BaseBackend):
    backend = "failing"
    peer_failures = (ConnectionError,)

    def __init__(self, failure: BaseException) -> None:
        super().__init__("cw", rank=0, size=2, timeout=1.0)
        self.failure = failure

    def clone(self, name: str) -> _FailingBackend:
        return _FailingBackend(self.failure)

    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None:
        raise self.failure

    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        raise self.failure

    def _reduce_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        raise self.failure

    def _allgather_host(self, local: np.ndarray, out: np.ndarray, timeout: float) -> None:
        raise self.failure

    def _barrier(self, timeout: float) -> None:
        raise self.failure


_world = _FailingBackend


def test_a_transport_failure_is_a_peer_timeout() -> None:
    with pytest.raises(CollectiveTimeoutError, match="A peer died") as caught:
        _world(ConnectionError("connection reset by peer")).barrier()
    assert isinstance(caught.value.__cause__, ConnectionError)


@pytest.mark.parametrize("failure", [ValueError("bad shape"), KeyError("x"),
                                     DeviceError("no such GPU")])
def test_other_failures_propagate_unchanged(failure: BaseException) -> None:
    with pytest.raises(type(failure)) as caught:
        _world(failure).allreduce([np.ones(3, np.float32)])
    assert caught.value is failure
