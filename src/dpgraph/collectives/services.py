"""What the distributed ops use of this layer, handed to their kernels by the runtime.

The distributed ops (:mod:`dpgraph.ops.distributed`) sit in the ops layer, below the
collectives; their kernels reach stores and backends through ``ctx.workspace.collectives``
(an instance of :class:`CollectiveServices` that every runtime workspace carries), so no op
module imports this package.
"""

from __future__ import annotations

from typing import Any

from dpgraph.collectives.base import DEFAULT_TIMEOUT_SEC, Backend, BaseBackend
from dpgraph.collectives.registry import backend_for_engine, create_backend
from dpgraph.collectives.rendezvous import file_store, tcp_store


class CollectiveServices:
    """Stores, common worlds and the default timeout, for op kernels."""

    default_timeout_sec: float = DEFAULT_TIMEOUT_SEC

    @staticmethod
    def file_store(path: str, prefix: str, timeout: float) -> Any:
        """A rendezvous store in the shared directory ``path``."""
        return file_store(path, prefix, timeout)

    @staticmethod
    def tcp_store(host: str, port: int, is_master: bool | None, world_size: int | None,
                  prefix: str, timeout: float) -> Any:
        """A rendezvous store served (or reached) over TCP."""
        return tcp_store(host, port, is_master, world_size, prefix, timeout)

    @staticmethod
    def create_world(engine: str, **options: Any) -> Backend:
        """One common world of the backend serving graph engine ``engine``."""
        return create_backend(backend_for_engine(engine), engine=engine, **options)

    @staticmethod
    def as_world(value: Any) -> Backend | None:
        """``value`` if it is a common world, else ``None``."""
        if isinstance(value, BaseBackend):  # the fast, common case (Protocol checks are slow)
            return value
        return value if isinstance(value, Backend) else None


SERVICES = CollectiveServices()
