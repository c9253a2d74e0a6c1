"""How the ranks of a multi-host job find each other.

* :class:`Rendezvous`: the typed, frozen form of Caffe2's legacy rendezvous dict
  (``{kv_handler, shard_id, num_shards, engine, transport, interface, mpi_rendezvous}``);
  :meth:`Rendezvous.from_legacy` / :meth:`Rendezvous.to_legacy` convert.
* :func:`rendezvous_from_env`: torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR`` and ``MASTER_PORT``.
* :func:`file_store`, :func:`tcp_store`: key-value stores (torch.distributed's, imported
  lazily) that ranks meet through.
* :func:`join_world`: the membership check every multi-process common world runs first: each
  rank publishes ``(size, engine, transport, host, pid)`` and waits for all the others, so a
  mismatch raises :class:`~dpgraph.errors.RendezvousError` and a rank that never arrives
  raises :class:`~dpgraph.errors.CollectiveTimeoutError` naming it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC
from dpgraph.errors import (
    CollectiveError,
    CollectiveTimeoutError,
    MissingDependencyError,
    RendezvousError,
)
from dpgraph.ir.blob import BlobReference

logger = logging.getLogger("dpgraph.collectives.rendezvous")

_LEGACY_KEYS = ("kv_handler", "shard_id", "num_shards", "engine", "transport", "interface",
                "mpi_rendezvous")
_TRANSPORTS = ("tcp", "ibverbs")


@dataclass(frozen=True)
class Rendezvous:
    """Where this host stands in a multi-host job.

    Attributes:
        store: the key-value store the ranks meet through: the name of a blob holding a store
            handler (made by ``FileStoreHandlerCreate``/``TCPStoreHandlerCreate`` in an init
            net, as in Caffe2), or a store object (``file_store(...)``, ``tcp_store(...)``).
        shard_id: this host's rank, ``0 <= shard_id < num_shards``.
        num_shards: the number of hosts; ``1`` means single host.
        engine: the collective engine (``"GLOO"``; ``"NCCL"`` across processes with GPUs).
        transport: ``"tcp"`` or ``"ibverbs"`` (Gloo in torch speaks tcp only).
        interface: network interface for Gloo (``""``: the host name's address).
        timeout: seconds every common world waits for its peers.
        mpi_rendezvous: Caffe2's MPI rendezvous flag (not supported by dpgraph).
        local_rank: torchrun's ``LOCAL_RANK`` when known (selects this process's GPU).
    """

    store: Any
    shard_id: int
    num_shards: int
    engine: str = "GLOO"
    transport: str = "tcp"
    interface: str = ""
    timeout: float = DEFAULT_TIMEOUT_SEC
    mpi_rendezvous: bool = False
    local_rank: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise RendezvousError(f"Rendezvous: num_shards must be an int >= 1, got "
                                  f"{self.num_shards!r}.")
        if not isinstance(self.shard_id, int) or not 0 <= self.shard_id < self.num_shards:
            raise RendezvousError(
                f"Rendezvous: shard_id must be an int in 0..{self.num_shards - 1}, got "
                f"{self.shard_id!r}.")
        if not self.engine or not isinstance(self.engine, str):
            raise RendezvousError(f"Rendezvous: engine must name a collective engine such as "
                                  f"'GLOO', got {self.engine!r}.")
        if self.transport not in _TRANSPORTS:
            raise RendezvousError(f"Rendezvous: transport must be one of {_TRANSPORTS}, got "
                                  f"{self.transport!r}.")
        if self.timeout <= 0:
            raise RendezvousError(f"Rendezvous: timeout must be positive, got {self.timeout}.")
        if self.num_shards > 1 and self.store is None:
            raise RendezvousError("Rendezvous: several shards need a store (kv_handler) to "
                                  "meet through; create one with FileStoreHandlerCreate.")

    @property
    def kv_handler(self) -> Any:
        """Caffe2's name for :attr:`store`."""
        return self.store

    @property
    def is_multi_host(self) -> bool:
        return self.num_shards > 1

    @property
    def store_is_blob(self) -> bool:
        """True when :attr:`store` names a blob rather than holding a store object."""
        return isinstance(self.store, (str, BlobReference))

    @classmethod
    def from_legacy(cls, legacy: Mapping[str, Any]) -> Rendezvous:
        """Convert Caffe2's rendezvous dict; missing required keys raise RendezvousError."""
        missing = [k for k in ("kv_handler", "shard_id", "num_shards") if k not in legacy]
        if missing:
            raise RendezvousError(
                f"Rendezvous dict lacks {missing}; Caffe2's form is {{'kv_handler': ..., "
                f"'shard_id': ..., 'num_shards': ..., 'engine': 'GLOO'}}.")
        extra = sorted(set(legacy) - set(_LEGACY_KEYS) - {"timeout", "local_rank"})
        if extra:
            logger.debug("Rendezvous dict: ignoring keys %s", extra)
        try:
            shard_id, num_shards = int(legacy["shard_id"]), int(legacy["num_shards"])
            timeout = float(legacy.get("timeout") or DEFAULT_TIMEOUT_SEC)
        except (TypeError, ValueError):
            raise RendezvousError(
                f"Rendezvous dict: shard_id and num_shards must be ints and timeout a number, "
                f"got shard_id={legacy['shard_id']!r}, num_shards={legacy['num_shards']!r}, "
                f"timeout={legacy.get('timeout')!r}.") from None
        return cls(
            store=legacy["kv_handler"], engine=str(legacy.get("engine") or "GLOO"),
            transport=str(legacy.get("transport") or "tcp"),
            interface=str(legacy.get("interface") or ""),
            mpi_rendezvous=bool(legacy.get("mpi_rendezvous", False)),
            local_rank=legacy.get("local_rank"), shard_id=shard_id, num_shards=num_shards,
            timeout=timeout)

    def to_legacy(self) -> dict[str, Any]:
        """Caffe2's dict form (the keys ``data_parallel_model`` reads)."""
        return {"kv_handler": self.store, "shard_id": self.shard_id,
                "num_shards": self.num_shards, "engine": self.engine,
                "transport": self.transport, "interface": self.interface,
                "mpi_rendezvous": self.mpi_rendezvous}


def as_rendezvous(value: Rendezvous | Mapping[str, Any] | None) -> Rendezvous | None:
    """Accept a Rendezvous, Caffe2's dict form, or None (single host)."""
    if value is None or isinstance(value, Rendezvous):
        return value
    if isinstance(value, Mapping):
        return Rendezvous.from_legacy(value)
    raise RendezvousError(f"rendezvous must be a Rendezvous, a dict or None, got "
                          f"{type(value).__name__}.")


# --- stores --------------------------------------------------------------------------------
def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as error:  # pragma: no cover - torch is a test dependency
        raise MissingDependencyError(
            "Multi-process collectives need torch.distributed: pip install 'dpgraph[gloo]' "
            "(or pip install torch).") from error
    return dist


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def file_store(path: str, prefix: str = "", timeout: float = 300.0) -> Any:
    """A store in the file system: ``path`` is a directory (created if missing, as Caffe2's
    FileStoreHandler) holding the store file, or an existing file; ``prefix`` scopes keys."""
    dist = _dist()
    try:
        if not os.path.isfile(path):  # one test: ranks race to create the directory
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, "dpgraph.store")
        store = dist.FileStore(path, -1)
    except (OSError, RuntimeError) as error:
        raise RendezvousError(
            f"FileStore: cannot use {path!r} as the rendezvous store ({error}); pass a "
            "directory on a file system every rank can write (or an existing store file)."
        ) from error
    store.set_timeout(_delta(timeout))
    return dist.PrefixStore(prefix + "/", store) if prefix else store


def tcp_store(host: str, port: int, is_master: bool | None = None,
              world_size: int | None = None, prefix: str = "", timeout: float = 300.0) -> Any:
    """A store served over TCP by one rank (``is_master``) and reached by the others.

    ``is_master=None`` tries to serve on ``host:port`` and connects as a client when the port
    is already taken (by another rank or by torchrun's agent).
    """
    dist = _dist()
    if isinstance(port, bool) or not hasattr(type(port), "__index__") or \
            not 0 <= int(port) <= 65535:
        raise RendezvousError(f"TCPStore: port must be an int in 0..65535, got {port!r}; pass "
                              "the port rank 0 serves on (e.g. MASTER_PORT).")
    serve = True if is_master is None else is_master
    try:
        store = dist.TCPStore(host, int(port), world_size, serve, _delta(timeout),
                              wait_for_workers=False)
    except (RuntimeError, OSError) as error:
        if is_master is not None and is_master:
            raise RendezvousError(f"TCPStore: cannot serve on {host}:{port}: {error}") from error
        if is_master is None:
            store = dist.TCPStore(host, int(port), world_size, False, _delta(timeout))
        else:
            raise RendezvousError(f"TCPStore: cannot reach {host}:{port} within {timeout:g}s "
                                  f"(is rank 0 running?): {error}") from error
    return dist.PrefixStore(prefix + "/", store) if prefix else store


ENV_STORE_BLOB = "dpgraph_env_kv_handler"


def put_store_blob(name: str, store: Any) -> str:
    """Place a store object in the current workspace as blob ``name`` (FeedBlob takes arrays
    only), so ``CreateCommonWorld([name], ...)`` can read it; return ``name``."""
    from dpgraph.runtime.api import current

    current().set_blob(name, store, None)
    return name


def rendezvous_from_env(engine: str = "GLOO", timeout: float = DEFAULT_TIMEOUT_SEC,
                        environ: Mapping[str, str] | None = None,
                        blob: str | None = ENV_STORE_BLOB) -> Rendezvous:
    """The rendezvous torchrun describes: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR`` (default ``127.0.0.1``) and ``MASTER_PORT``.

    Rank 0 serves a TCPStore on ``MASTER_PORT`` unless torchrun's agent already serves one.
    With ``blob`` (the default) the store is put in the current workspace under that name
    and the rendezvous names the blob, as Caffe2's ``kv_handler`` does; ``blob=None`` keeps
    the store object in :attr:`Rendezvous.store`.
    """
    env = os.environ if environ is None else environ
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise RendezvousError(f"rendezvous_from_env: {missing} not set; launch with torchrun "
                              "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.")
    try:
        rank, size, port = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
        local_rank = int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK") else None
    except ValueError as error:
        raise RendezvousError(f"rendezvous_from_env: a variable is not an int ({error}); set "
                              "RANK, WORLD_SIZE, MASTER_PORT (and LOCAL_RANK) to integers, as "
                              "torchrun does.") from None
    store: Any = None
    if size > 1:
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        master = None if rank == 0 and not agent else False
        store = tcp_store(env.get("MASTER_ADDR") or "127.0.0.1", port, master, None,
                          prefix="dpgraph", timeout=max(timeout, 60.0))
        if blob is not None:
            store = put_store_blob(blob, store)
    return Rendezvous(store=store, shard_id=rank, num_shards=size, engine=engine,
                      timeout=timeout, local_rank=local_rank)


# --- world membership ----------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """What one rank published when it joined a common world."""

    rank: int
    size: int
    engine: str
    transport: str
    host: str
    pid: int

    def is_alive(self) -> bool | None:
        """Whether its process still runs: known only on this host."""
        if self.host != socket.gethostname():
            return None
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] not in ("Z", "X")
        except OSError:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except OSError:
                return None
            return True


def _publish(store: Any, key: str, info: dict[str, Any]) -> None:
    store.set(key, json.dumps(info))


def _read(store: Any, key: str) -> dict[str, Any]:
    return json.loads(bytes(store.get(key)).decode())


def join_world(store: Any, name: str, rank: int, size: int, engine: str, transport: str,
               timeout: float) -> tuple[str, dict[int, Member]]:
    """Publish this rank and wait for every other one; return a fresh key prefix for the world
    (unique per creation, the same on every rank) and the members.

    Raises:
        RendezvousError: a peer disagrees on the size, engine or transport, or two processes
            claim the same rank at once (a later duplicate waits for its own generation and
            times out).
        CollectiveTimeoutError: some ranks did not join within ``timeout`` (named).
    """
    if not 0 <= rank < size:
        raise RendezvousError(f"Common world {name!r}: rank {rank} is outside 0..{size - 1}; "
                              "check shard_id and num_shards.")
    me = Member(rank, size, engine.upper(), transport, socket.gethostname(), os.getpid())
    try:
        return _join(store, name, me, timeout)
    except RuntimeError as error:  # the store itself failed (its server is gone, I/O error)
        if isinstance(error, CollectiveError):
            raise
        raise CollectiveTimeoutError(
            f"CreateCommonWorld {name!r} (rank {rank} of {size}): the rendezvous store "
            f"failed: {error}. Check that the store's server (rank 0 for a TCPStore) runs and "
            "that every rank reaches the same path or host:port.") from error


def _join(store: Any, name: str, me: Member, timeout: float) -> tuple[str, dict[int, Member]]:
    base = f"dpgraph/cw/{name}/"
    generation = store.add(f"{base}generation/{me.rank}", 1)
    prefix = f"{base}{generation}/"
    if store.add(f"{prefix}claims/{me.rank}", 1) > 1:
        raise RendezvousError(
            f"Common world {name!r}: another process already claimed rank {me.rank} "
            f"(this is {me.host} pid {me.pid}); give every process its own shard_id.")
    _publish(store, f"{prefix}member/{me.rank}", me.__dict__)
    return prefix, _wait_members(store, name, prefix, me, timeout)


def _wait_members(store: Any, name: str, prefix: str, me: Member,
                  timeout: float) -> dict[int, Member]:
    members: dict[int, Member] = {}
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        for rank in range(me.size):
            key = f"{prefix}member/{rank}"
            if rank not in members and store.check([key]):
                members[rank] = _check_peer(name, me, Member(**_read(store, key)))
        if len(members) == me.size:
            return members
        if time.monotonic() > deadline:
            absent = sorted(set(range(me.size)) - set(members))
            raise CollectiveTimeoutError(
                f"CreateCommonWorld {name!r} (rank {me.rank} of {me.size}, engine "
                f"{me.engine}): ranks {absent} did not join within the timeout of "
                f"{timeout:g}s. Start every rank with the same store, or raise timeout_ms.")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _check_peer(name: str, me: Member, peer: Member) -> Member:
    for what in ("size", "engine", "transport"):
        if getattr(peer, what) != getattr(me, what):
            label = "num_shards (size)" if what == "size" else what
            raise RendezvousError(
                f"CreateCommonWorld {name!r}: rank {peer.rank} ({peer.host} pid {peer.pid}) has "
                f"{label}={getattr(peer, what)!r} but rank {me.rank} has "
                f"{getattr(me, what)!r}; every rank must use the same rendezvous settings.")
    return peer


def describe_missing(members: Mapping[int, Member], rank: int, grace: float = 1.0) -> str:
    """Which peers are known to be gone, from their process state on this host.

    A peer's connection drops a moment before its process finishes exiting, so a peer that
    still looks alive is re-checked for up to ``grace`` seconds.
    """
    deadline = time.monotonic() + grace
    while True:
        dead, unknown = _peer_states(members, rank)
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    parts = []
    if dead:
        parts.append(f"ranks that did not arrive (their process is gone): {', '.join(dead)}")
    if unknown:
        parts.append(f"ranks {unknown} run on other hosts, their state is unknown")
    return "; ".join(parts) or "every peer process is still running, so a peer is late or stuck"


def _peer_states(members: Mapping[int, Member], rank: int) -> tuple[list[str], list[int]]:
    dead, unknown = [], []
    for peer in members.values():
        if peer.rank == rank:
            continue
        alive = peer.is_alive()
        if alive is False:
            dead.append(f"{peer.rank} (pid {peer.pid} on {peer.host})")
        elif alive is None:
            unknown.append(peer.rank)
    return dead, unknown
