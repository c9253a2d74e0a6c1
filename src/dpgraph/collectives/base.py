"""The collective backend protocol and the logic every backend shares.

A :class:`Backend` instance is one *common world*: a group of ``size`` ranks (processes or
hosts), of which this process is ``rank``.  Every collective takes the copies of one logical
blob held on this process's local devices (``buffers``: numpy arrays, or CuPy arrays on real
GPUs), reduces them locally, runs the collective across ranks, and leaves the result in every
local copy, in place.  Every collective takes a ``timeout`` in seconds (``None``: the common
world's own); a peer that dies or never arrives raises
:class:`~dpgraph.errors.CollectiveTimeoutError` instead of hanging.

Collectives on one common world must be issued in the same order on every rank; a lock keeps
two threads of one process from interleaving on the same world.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from dpgraph.collectives import halfsum
from dpgraph.errors import CollectiveError, CollectiveTimeoutError, DpgraphError
from dpgraph.ir.arrays import host

T = TypeVar("T")

DEFAULT_TIMEOUT_SEC = 30.0


@runtime_checkable
class Backend(Protocol):
    """One common world of a collective backend.

    Attributes:
        backend: the backend's registry name (``"cpu"``, ``"gloo"``, ``"nccl"``).
        engine: the graph engine it serves (``"CPU"``, ``"GLOO"``, ``"NCCL"``).
        name: the common world's name (its blob name in the graph).
        rank, size: this process's rank and the number of ranks.
        timeout: default timeout of every collective, in seconds.
    """

    backend: str
    engine: str
    name: str
    rank: int
    size: int
    timeout: float

    def allreduce(self, buffers: Sequence[Any], timeout: float | None = None,
                  wire_dtype: str | None = None) -> list[Any]:
        """Sum over every local copy and every rank, into every copy (``wire_dtype``: see
        :meth:`BaseBackend.allreduce`)."""

    def broadcast(self, buffers: Sequence[Any], root: int = 0,
                  timeout: float | None = None) -> list[Any]:
        """Copy the first local copy of rank ``root`` into every copy of every rank."""

    def reduce(self, buffers: Sequence[Any], root: int = 0,
               timeout: float | None = None) -> list[Any]:
        """Sum into every local copy of rank ``root``; other ranks' copies are left alone."""

    def allgather(self, buffers: Sequence[Any], timeout: float | None = None) -> Any:
        """Stack every local copy of every rank: shape ``(size * len(buffers), *shape)``."""

    def reduce_scatter(self, buffers: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """The sum (as allreduce), of which each rank keeps its share of the first axis."""

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank reached the barrier."""

    def clone(self, name: str) -> Backend:
        """A new, independent common world with the same ranks."""

    def close(self) -> None:
        """Release the world's resources; later collectives raise."""


# --- helpers on local device copies ---------------------------------------------------------
def copy_into(dst: Any, src: Any) -> None:
    """Write ``src`` into the existing buffer ``dst`` (host or device)."""
    if dst is src:
        return
    if isinstance(dst, np.ndarray):
        np.copyto(dst, host(src), casting="no")
    else:  # a CuPy array: ``set`` uploads from the host, ``[...] =`` copies between devices
        if isinstance(src, np.ndarray):
            dst.set(src)
        else:
            dst[...] = src


def local_sum(buffers: Sequence[Any]) -> np.ndarray:
    """The sum of the local copies, in place in the first one when it is a host array."""
    first = buffers[0]
    if isinstance(first, np.ndarray):
        for other in buffers[1:]:
            np.add(first, host(other), out=first)
        return first
    total = host(first).copy()
    for other in buffers[1:]:
        np.add(total, host(other), out=total)
    return total


_CHUNKED_MIN_BYTES = 8 << 20
_CHUNK_ELEMENTS = 64 << 10


def local_allreduce_chunked(buffers: Sequence[Any]) -> bool:
    """Sum host copies into every copy chunk by chunk, so each chunk's sum is still in cache
    when it is copied out (about 1.5x faster than sum-then-copy on large blobs).  Returns
    False, doing nothing, unless every copy is a large C-contiguous numpy array."""
    first = buffers[0]
    if (len(buffers) < 2 or not isinstance(first, np.ndarray) or first.nbytes < _CHUNKED_MIN_BYTES
            or not all(isinstance(b, np.ndarray) and b.flags.c_contiguous and b.flags.writeable
                       for b in buffers)):
        return False
    flat = [b.reshape(-1) for b in buffers]  # views: every copy is contiguous
    acc, others = flat[0], flat[1:]
    for start in range(0, acc.size, _CHUNK_ELEMENTS):
        end = start + _CHUNK_ELEMENTS
        chunk = acc[start:end]
        for other in others:
            np.add(chunk, other[start:end], out=chunk)
        for other in others:
            other[start:end] = chunk
    return True


def check_buffers(buffers: Sequence[Any], what: str | Callable[[], str]) -> None:
    """Every local copy must exist, be an array and agree in shape and dtype (``what``
    names the op)."""
    for index, buffer in enumerate(buffers):
        if not (hasattr(buffer, "shape") and hasattr(buffer, "dtype")):
            label = what if isinstance(what, str) else what()
            raise CollectiveError(
                f"{label}: local copy {index} is a {type(buffer).__name__}, not an array; "
                "pass numpy (or CuPy) arrays, one per local device, updated in place.")
    if len(buffers) == 1:
        return
    if not isinstance(what, str):
        what = what()
    if not buffers:
        raise CollectiveError(f"{what}: no buffers given; pass at least one local copy.")
    shape, dtype = tuple(buffers[0].shape), buffers[0].dtype
    for index, other in enumerate(buffers[1:], start=1):
        if tuple(other.shape) != shape or other.dtype != dtype:
            raise CollectiveError(
                f"{what}: local copy {index} has shape {tuple(other.shape)} and dtype "
                f"{other.dtype}, copy 0 has {shape} and {dtype}; every device copy of a blob "
                "must match.")


class BaseBackend(ABC):
    """Shared logic: local reduction, host staging, ordering lock and error wrapping.

    Subclasses implement the cross-rank part on one contiguous host buffer
    (``_allreduce_host`` and friends); with ``size == 1`` those are never called.
    """

    backend = "base"
    #: What the backend's transport raises when a peer is gone or late; only these become
    #: CollectiveTimeoutError (any other exception is a bug or bad input and propagates).
    peer_failures: tuple[type[BaseException], ...] = (TimeoutError,)

    def __init__(self, name: str, rank: int, size: int, timeout: float = DEFAULT_TIMEOUT_SEC,
                 engine: str = "") -> None:
        self.name = name
        self.rank = rank
        self.size = size
        self.timeout = float(timeout)
        self.engine = engine or self.backend.upper()
        self.closed = False
        self.sequence = 0  # collectives issued so far, for error messages
        self._lock = threading.Lock()
        #: Reused work buffers of the 16-bit all-reduce (one collective at a time per world).
        self._scratch: dict[Any, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name!r} rank {self.rank}/{self.size}, "
                f"timeout {self.timeout:g}s>")

    # --- public collectives ------------------------------------------------------------
    def allreduce(self, buffers: Sequence[Any], timeout: float | None = None,
                  wire_dtype: str | None = None) -> list[Any]:
        """Sum over every local copy and every rank, into every copy.

        16-bit payloads (float16 buffers, or float32 buffers holding bfloat16 values with
        ``wire_dtype="bfloat16"``) cross ranks as 16-bit words when the backend can exchange
        buffers point to point (:attr:`exchanges`): see :mod:`dpgraph.collectives.halfsum`.
        """
        buffers = list(buffers)
        self._check_open("allreduce")
        check_buffers(buffers, lambda: self._what("allreduce"))
        wire = halfsum.wire_format(buffers[0], wire_dtype, self._what("allreduce"))
        if wire is not None and self.size > 1 and self.exchanges and buffers[0].size:
            return self._allreduce_16bit(buffers, wire, timeout)
        if self.size == 1 and local_allreduce_chunked(buffers):
            return buffers
        total = self._contiguous(local_sum(buffers))
        if self.size > 1 and total.size:
            self._run("allreduce", timeout, lambda t: self._allreduce_host(total, t))
        self._scatter_local(buffers, total)
        return buffers

    def _allreduce_16bit(self, buffers: list[Any], wire: str, timeout: float | None
                         ) -> list[Any]:
        """The 16-bit all-reduce (:mod:`~dpgraph.collectives.halfsum`), all of it under the
        world's lock (its work buffers are the world's)."""
        plan = halfsum.HalfSum(wire, self.rank, self.size, self._scratch)

        def step(limit: float) -> None:
            payload = plan.local_payload([host(b) for b in buffers])
            if self._native_16bit(wire):
                self._allreduce_words(payload, wire, limit)
            else:
                plan.allreduce(payload, self._post_send, self._post_recv,
                               lambda handles: self._wait_all(handles, limit))
            plan.deliver(payload, buffers, copy_into)

        self._run("allreduce", timeout, step)
        return buffers

    def broadcast(self, buffers: Sequence[Any], root: int = 0,
                  timeout: float | None = None) -> list[Any]:
        buffers = list(buffers)
        self._check_open("broadcast")
        check_buffers(buffers, lambda: self._what("broadcast"))
        self._check_root(root, "broadcast")
        staged = host(buffers[0])
        if self.size > 1 and staged.size:
            staged = self._contiguous(staged)
            self._run("broadcast", timeout, lambda t: self._broadcast_host(staged, root, t))
        self._scatter_local(buffers, staged)
        return buffers

    def reduce(self, buffers: Sequence[Any], root: int = 0,
               timeout: float | None = None) -> list[Any]:
        buffers = list(buffers)
        self._check_open("reduce")
        check_buffers(buffers, lambda: self._what("reduce"))
        self._check_root(root, "reduce")
        if self.rank != root:  # the local sum must not clobber a non-root's copies
            total = local_sum([host(buffers[0]).copy(), *buffers[1:]])
        else:
            total = self._contiguous(local_sum(buffers))
        if self.size > 1 and total.size:
            self._run("reduce", timeout, lambda t: self._reduce_host(total, root, t))
        if self.rank == root:
            self._scatter_local(buffers, total)
        return buffers

    def allgather(self, buffers: Sequence[Any], timeout: float | None = None) -> np.ndarray:
        buffers = list(buffers)
        self._check_open("allgather")
        check_buffers(buffers, lambda: self._what("allgather"))
        local = np.stack([host(b) for b in buffers])
        if self.size == 1:
            return local
        gathered = np.empty((self.size, *local.shape), dtype=local.dtype)
        if local.size:
            self._run("allgather", timeout, lambda t: self._allgather_host(local, gathered, t))
        return gathered.reshape((self.size * len(buffers), *local.shape[1:]))

    def reduce_scatter(self, buffers: Sequence[Any], timeout: float | None = None) -> list[Any]:
        buffers = list(buffers)
        self._check_open("reduce_scatter")
        check_buffers(buffers, lambda: self._what("reduce_scatter"))
        rows = buffers[0].shape[0] if buffers[0].ndim else 0
        if rows % self.size:
            raise CollectiveError(
                f"{self._what('reduce_scatter')}: the first axis ({rows}) must divide evenly "
                f"over {self.size} ranks; pad the blob.")
        total = local_sum([host(buffers[0]).copy(), *buffers[1:]])
        if self.size > 1 and total.size:
            self._run("reduce_scatter", timeout,
                      lambda t: self._reduce_scatter_host(total, t))
        share = rows // self.size
        mine = total[self.rank * share:(self.rank + 1) * share]
        return [np.array(mine) for _ in buffers]

    def barrier(self, timeout: float | None = None) -> None:
        self._check_open("barrier")
        if self.size > 1:
            self._run("barrier", timeout, self._barrier)

    def clone(self, name: str) -> BaseBackend:
        raise CollectiveError(f"{self._what('clone')}: not supported by {self.backend}.")

    def close(self) -> None:
        self.closed = True

    # --- cross-rank parts, on one contiguous host buffer ----------------------------------
    @abstractmethod
    def _allreduce_host(self, buffer: np.ndarray, timeout: float) -> None: ...

    @abstractmethod
    def _broadcast_host(self, buffer: np.ndarray, root: int, timeout: float) -> None: ...

    @abstractmethod
    def _reduce_host(self, buffer: np.ndarray, root: int, timeout: float) -> None: ...

    @abstractmethod
    def _allgather_host(self, local: np.ndarray, out: np.ndarray, timeout: float) -> None: ...

    def _reduce_scatter_host(self, buffer: np.ndarray, timeout: float) -> None:
        self._allreduce_host(buffer, timeout)

    @abstractmethod
    def _barrier(self, timeout: float) -> None: ...

    #: Whether the point-to-point hooks below are implemented (16-bit all-reduces need them).
    exchanges = False

    def _native_16bit(self, wire: str) -> bool:
        """Whether the transport sums ``wire`` words itself (:meth:`_allreduce_words`)."""
        return False

    def _allreduce_words(self, words: np.ndarray, wire: str, timeout: float) -> None:
        """Sum 16-bit ``wire`` words across ranks with the transport's own reduction."""
        raise CollectiveError(f"{self._what('allreduce')}: no {wire} sum in {self.backend}.")

    def _post_send(self, peer: int, array: np.ndarray) -> Any:
        """Start sending ``array`` to rank ``peer``; returns a handle for :meth:`_wait_all`."""
        raise CollectiveError(f"{self._what('send')}: not supported by {self.backend}.")

    def _post_recv(self, peer: int, array: np.ndarray) -> Any:
        """Start receiving into ``array`` from rank ``peer`` (messages between two ranks
        arrive in the order they were sent); returns a handle for :meth:`_wait_all`."""
        raise CollectiveError(f"{self._what('recv')}: not supported by {self.backend}.")

    def _wait_all(self, handles: Sequence[Any], timeout: float) -> None:
        """Wait until every posted send and receive of ``handles`` completed."""
        raise CollectiveError(f"{self._what('wait')}: not supported by {self.backend}.")

    # --- shared plumbing ---------------------------------------------------------------
    def _what(self, op: str) -> str:
        return (f"{op} on common world {self.name!r} ({self.backend}, rank {self.rank} of "
                f"{self.size})")

    def _check_root(self, root: int, op: str) -> None:
        if not 0 <= root < self.size:
            raise CollectiveError(
                f"{self._what(op)}: root {root} is not a rank of this world (0..{self.size - 1}).")

    @staticmethod
    def _contiguous(array: np.ndarray) -> np.ndarray:
        if array.flags.c_contiguous and array.flags.writeable:
            return array
        return np.ascontiguousarray(array).copy()

    def _scatter_local(self, buffers: Sequence[Any], result: np.ndarray) -> None:
        for buffer in buffers:
            copy_into(buffer, result)

    def _check_open(self, op: str) -> None:
        if self.closed:
            raise CollectiveError(f"{self._what(op)}: the common world was destroyed; "
                                  "create it again with CreateCommonWorld.")

    def _run(self, op: str, timeout: float | None, fn: Callable[[float], T]) -> T:
        """Run one cross-rank step under the world's lock, translating failures."""
        self._check_open(op)
        limit = self.timeout if timeout is None or timeout <= 0 else float(timeout)
        with self._lock:
            self.sequence += 1
            start = time.monotonic()
            try:
                return fn(limit)
            except DpgraphError:
                raise
            except self.peer_failures as error:  # the transport's failure: a peer gone or late
                raise self.timeout_error(op, limit, time.monotonic() - start, error) from error

    def missing_ranks(self) -> str:
        """What is known about which ranks did not arrive (backends may refine this)."""
        return "which ranks did not arrive is unknown"

    def timeout_error(self, op: str, limit: float, elapsed: float,
                      cause: BaseException | None) -> CollectiveTimeoutError:
        reason = f" Cause: {cause}" if cause is not None else ""
        return CollectiveTimeoutError(
            f"{self._what(op)}, collective #{self.sequence}, failed after {elapsed:.1f}s "
            f"(timeout {limit:g}s): {self.missing_ranks()}. A peer died, never joined, or runs "
            f"a different sequence of collectives on this world; check the other ranks' logs, "
            f"or raise timeout_ms.{reason}")
