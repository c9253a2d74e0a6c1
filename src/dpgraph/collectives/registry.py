"""Collective backends by name; each is imported only when first used.

>>> world = create_backend("cpu", name="allreduce_0_cw")
>>> backend_for_engine("GLOO")
'gloo'

A backend whose dependency is missing raises :class:`~dpgraph.errors.MissingDependencyError`
saying what to install.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, Backend
from dpgraph.errors import CollectiveError, MissingDependencyError, did_you_mean


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend lives and what it needs."""

    name: str
    module: str
    requirement: str
    description: str


_BACKENDS: dict[str, BackendEntry] = {}

# Graph engines (OperatorDef.engine) and the backend serving them.
_ENGINES: dict[str, str] = {"": "cpu", "DEFAULT": "cpu", "CPU": "cpu", "GLOO": "gloo",
                            "NCCL": "nccl"}


def register_backend(name: str, module: str, requirement: str = "",
                     description: str = "", engines: tuple[str, ...] = ()) -> None:
    """Add a backend: ``module`` must define ``create(store, rank, size, name, timeout, ...)``."""
    if name in _BACKENDS:
        raise CollectiveError(f"Collective backend {name!r} is already registered.")
    _BACKENDS[name] = BackendEntry(name, module, requirement, description)
    for engine in engines:
        _ENGINES[engine.upper()] = name


register_backend("cpu", "dpgraph.collectives.cpu", "",
                 "in process, across the local devices of one host")
register_backend("gloo", "dpgraph.collectives.gloo", "pip install 'dpgraph[gloo]' (torch)",
                 "torch.distributed Gloo process groups across processes and hosts")
register_backend("nccl", "dpgraph.collectives.nccl",
                 "pip install cupy-cuda12x (one process) or torch with CUDA (several)",
                 "NCCL across real GPUs")


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def backend_for_engine(engine: str | None) -> str:
    """The backend serving a graph engine name (``"GLOO"`` -> ``"gloo"``)."""
    key = (engine or "").upper()
    if key in _ENGINES:
        return _ENGINES[key]
    if key.lower() in _BACKENDS:
        return key.lower()
    raise CollectiveError(f"No collective backend serves engine {engine!r}; known engines: "
                          f"{sorted(e for e in _ENGINES if e)}." + did_you_mean(key, _ENGINES))


def _load(name: str) -> Any:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise CollectiveError(f"Unknown collective backend {name!r}; known: "
                              f"{backend_names()}." + did_you_mean(name, _BACKENDS))
    try:
        return importlib.import_module(entry.module)
    except ImportError as error:
        raise MissingDependencyError(
            f"Collective backend {name!r} cannot be imported ({error}); "
            f"{entry.requirement or 'reinstall dpgraph'}.") from error


def create_backend(name: str, store: Any = None, rank: int = 0, size: int = 1,
                   world: str | None = None, timeout: float = DEFAULT_TIMEOUT_SEC,
                   transport: str = "tcp", interface: str = "", **options: Any) -> Backend:
    """Create one common world of backend ``name`` (``"cpu"``, ``"gloo"``, ``"nccl"``).

    Args:
        store: the rendezvous store (multi-process backends).
        rank, size: this process's rank and the number of ranks.
        world: the world's name (the common world blob); defaults to the backend name.
        timeout: seconds each collective (and the creation) may wait for peers.
        transport, interface: network options of the gloo backend.
        options: backend-specific extras (``devices`` for nccl).
    """
    module = _load(name)
    return module.create(store=store, rank=rank, size=size, name=world or name,
                         timeout=timeout, transport=transport, interface=interface,
                         **options)


def check_available(name: str) -> None:
    """Raise MissingDependencyError if backend ``name`` cannot be used here."""
    module = _load(name)
    check = getattr(module, "check_available", None)
    if check is not None:
        check()
