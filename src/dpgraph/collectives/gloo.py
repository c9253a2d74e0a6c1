"""The ``gloo`` backend: torch.distributed's Gloo process groups across processes and hosts.

Each common world is its own ``ProcessGroupGloo``, built directly on a ``PrefixStore`` of the
rendezvous store (no global ``init_process_group``), so a process can hold any number of
worlds.  Buffers are reduced in place: torch tensors share the numpy arrays' memory
(``torch.from_numpy``), so no copy is made on the host.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, BaseBackend
from dpgraph.collectives.rendezvous import Member, describe_missing, join_world
from dpgraph.errors import CollectiveTimeoutError, MissingDependencyError, RendezvousError

logger = logging.getLogger("dpgraph.collectives.gloo")

# Extra seconds the caller waits beyond Gloo's own timeout before giving up on the work.
_WAIT_MARGIN_SEC = 2.0
# The tag of the 16-bit all-reduce's point-to-point messages.
_EXCHANGE_TAG = 7


def _torch() -> tuple[Any, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        raise MissingDependencyError(
            "The gloo collective backend needs torch: pip install 'dpgraph[gloo]' "
            "(or pip install torch).") from error
    if not dist.is_available() or not dist.is_gloo_available():
        raise MissingDependencyError(
            "This torch build has no Gloo support; install a standard torch wheel "
            "(pip install torch).")
    return torch, dist


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


_DEVICES: dict[str, Any] = {}

# Worlds still open.  They are closed at exit, before the interpreter tears torch down:
# a process group destroyed during finalisation can abort the process.
_OPEN: weakref.WeakSet[GlooBackend] = weakref.WeakSet()


@atexit.register
def _close_open_worlds() -> None:
    for world in list(_OPEN):
        world.close()


def _device(dist: Any, interface: str) -> Any:
    """One Gloo TCP device per interface (``""``: the host name's address)."""
    if interface not in _DEVICES:
        gloo = dist.ProcessGroupGloo
        _DEVICES[interface] = (gloo.create_device(interface=interface) if interface
                               else gloo.create_default_device())
    return _DEVICES[interface]


class GlooBackend(BaseBackend):
    """One common world: a ``ProcessGroupGloo`` over a prefix of ``store``."""

    backend = "gloo"
    #: torch.distributed reports a dead or late peer as RuntimeError (DistError and kin)
    peer_failures = (RuntimeError, TimeoutError)

    def __init__(self, store: Any, rank: int, size: int, name: str,
                 timeout: float = DEFAULT_TIMEOUT_SEC, transport: str = "tcp",
                 interface: str = "", engine: str = "GLOO") -> None:
        if store is None:
            raise RendezvousError(f"Common world {name!r}: the gloo backend needs a store; "
                                  "pass a kv_handler blob made by FileStoreHandlerCreate.")
        super().__init__(name, rank, size, timeout, engine)
        self._torch, self._dist = _torch()
        self.store = store
        self._allreduce_options: dict[float, tuple[Any, datetime.timedelta]] = {}
        self.transport = transport
        self.interface = interface
        if transport != "tcp":
            logger.warning("Common world %r: torch's Gloo speaks tcp only; transport %r "
                           "falls back to tcp.", name, transport)
        prefix, self.members = join_world(store, name, rank, size, engine, transport, timeout)
        self._group = self._make_group(prefix)
        _OPEN.add(self)

    def _make_group(self, prefix: str) -> Any:
        dist = self._dist
        options = dist.ProcessGroupGloo._Options()
        options._timeout = _delta(self.timeout)
        options._devices = [_device(dist, self.interface)]
        try:
            return dist.ProcessGroupGloo(dist.PrefixStore(prefix + "pg/", self.store),
                                         self.rank, self.size, options)
        except RuntimeError as error:
            raise CollectiveTimeoutError(
                f"CreateCommonWorld {self.name!r} (rank {self.rank} of {self.size}, gloo): "
                f"connecting to the peers failed within {self.timeout:g}s: "
                f"{describe_missing(self.members, self.rank)}. Cause: {error}") from error

    @property
    def process_group(self) -> Any:
        """The underlying ``ProcessGroupGloo`` (``None`` once closed)."""
        return self._group

    def clone(self, name: str) -> GlooBackend:
        """A new world with the same ranks; every rank must clone in the same order."""
        return GlooBackend(self.store, self.rank, self.size, name, self.timeout,
                           self.transport, self.interface, self.engine)

    def close(self) -> None:
        super().close()
        self._group = None
        _OPEN.discard(self)

    def missing_ranks(self) -> str:
        return describe_missing(self.members, self.rank)

    # --- cross-rank steps --------------------------------------------------------------
    def _tensor(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(array)

    def _wait(self, work: Any, timeout: float) -> None:
        work.wait(_delta(timeout + _WAIT_MARGIN_SEC))

    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None:
        cached = self._allreduce_options.get(timeout)
        if cached is None:  # built once per timeout: the hot path only looks it up
            options = self._dist.AllreduceOptions()
            options.reduceOp = self._dist.ReduceOp.SUM
            options.timeout = _delta(timeout)
            cached = self._allreduce_options[timeout] = (options,
                                                         _delta(timeout + _WAIT_MARGIN_SEC))
        options, wait = cached
        self._group.allreduce([self._torch.from_numpy(buffer)], options).wait(wait)

    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        options = self._dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        options.timeout = _delta(timeout)
        self._wait(self._group.broadcast([self._tensor(buffer)], options), timeout)

    def _reduce_host(self, buffer: np.ndarray, root: int, timeout: float) -> None:
        options = self._dist.ReduceOptions()
        options.reduceOp = self._dist.ReduceOp.SUM
        options.rootRank, options.rootTensor = root, 0
        options.timeout = _delta(timeout)
        self._wait(self._group.reduce([self._tensor(buffer)], options), timeout)

    def _allgather_host(self, local: np.ndarray, out: np.ndarray, timeout: float) -> None:
        from torch._C._distributed_c10d import AllgatherOptions

        options = AllgatherOptions()
        options.timeout = _delta(timeout)
        outputs = [self._tensor(out[index]) for index in range(self.size)]
        self._wait(self._group.allgather([outputs], [self._tensor(local)], options), timeout)

    exchanges = True

    def _native_16bit(self, wire: str) -> bool:
        """Gloo's bfloat16 sum is a cheap shift-and-add, so bfloat16 words go through Gloo's
        own ring all-reduce; its float16 sum converts every element in software (slower
        than moving float32), so float16 words take the point-to-point path."""
        return wire == "bfloat16"

    def _allreduce_words(self, words: np.ndarray, wire: str, timeout: float) -> None:
        """Gloo's all-reduce of the 16-bit words as torch float16/bfloat16 (in place)."""
        torch = self._torch
        tensor = torch.from_numpy(words.view(np.int16)).view(
            torch.float16 if wire == "float16" else torch.bfloat16)
        options = self._dist.AllreduceOptions()
        options.reduceOp = self._dist.ReduceOp.SUM
        options.timeout = _delta(timeout)
        self._wait(self._group.allreduce([tensor], options), timeout)

    def _post_send(self, peer: int, array: np.ndarray) -> Any:
        return self._group.send([self._words(array)], peer, _EXCHANGE_TAG)

    def _post_recv(self, peer: int, array: np.ndarray) -> Any:
        return self._group.recv([self._words(array)], peer, _EXCHANGE_TAG)

    def _wait_all(self, handles: Sequence[Any], timeout: float) -> None:
        for work in handles:
            self._wait(work, timeout)

    def _words(self, array: np.ndarray) -> Any:
        """A torch view of ``array``'s bytes (16-bit words travel as int16)."""
        return self._torch.from_numpy(array.view(np.int16) if array.dtype.itemsize == 2
                                      else array)

    def _barrier(self, timeout: float) -> None:
        options = self._dist.BarrierOptions()
        options.timeout = _delta(timeout)
        self._wait(self._group.barrier(options), timeout)


def create(store: Any = None, rank: int = 0, size: int = 1, name: str = "gloo",
           timeout: float = DEFAULT_TIMEOUT_SEC, transport: str = "tcp", interface: str = "",
           engine: str = "GLOO", **_: Any) -> GlooBackend:
    """Registry entry point."""
    return GlooBackend(store, rank, size, name, timeout, transport, interface, engine)


__all__ = ["GlooBackend", "Member", "create"]
