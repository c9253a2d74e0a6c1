"""Collective backends: one protocol, chosen by name (``cpu``, ``gloo``, ``nccl``).

The graph names an engine (``engine="GLOO"``); :func:`backend_for_engine` maps it to a
backend, and :func:`create_backend` makes one common world of it.  Heavy dependencies (torch,
CuPy) are imported only by the backends that need them.
"""

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, Backend, BaseBackend
from dpgraph.collectives.registry import (
    backend_for_engine,
    backend_names,
    check_available,
    create_backend,
    register_backend,
)
from dpgraph.collectives.rendezvous import (
    Rendezvous,
    as_rendezvous,
    file_store,
    put_store_blob,
    rendezvous_from_env,
    tcp_store,
)

__all__ = [
    "DEFAULT_TIMEOUT_SEC", "Backend", "BaseBackend", "Rendezvous", "as_rendezvous",
    "backend_for_engine", "backend_names", "check_available", "create_backend", "file_store",
    "put_store_blob", "register_backend", "rendezvous_from_env", "tcp_store",
]
