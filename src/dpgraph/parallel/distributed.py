"""Seam for multi-host data parallelism (``rendezvous`` with ``num_shards > 1``).

Cross-host all-reduce, parameter sync, computed-param broadcast and the barrier net are
provided through :func:`register_distributed_hooks`; :mod:`dpgraph.parallel.multihost`
registers dpgraph's own (Caffe2's collective ops) whenever :mod:`dpgraph.parallel` is
imported.  Single-host ``Parallelize`` never calls into here; with ``num_shards > 1`` and no
hooks registered it raises :class:`~dpgraph.errors.NotSupportedError` before touching the
model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dpgraph.errors import NotSupportedError

if TYPE_CHECKING:
    from dpgraph.ir.net import Net
    from dpgraph.parallel.config import ParallelConfig
    from dpgraph.parallel.state import ParallelState


class DistributedHooks(Protocol):
    """The passes a multi-host backend plugs into the pipeline."""

    def allreduce(self, state: ParallelState, blob_names: Sequence[str], net: Net) -> None: ...

    def broadcast_computed_params(self, state: ParallelState) -> None: ...

    def sync_params(self, state: ParallelState, init_net: Net | None, net: Net,
                    names: Sequence[str], max_concurrent_distributed_ops: int) -> None: ...

    def add_barrier(self, state: ParallelState, timeout_sec: float) -> None: ...

    def add_blob_sync(self, model: Any, blobs: Sequence[Any]) -> None: ...

    def synchronize(self, model: Any, timeout_sec: float) -> None: ...


_HOOKS: list[DistributedHooks] = []


def register_distributed_hooks(hooks: DistributedHooks) -> None:
    """Install the multi-host passes (the last registration wins)."""
    _HOOKS.append(hooks)


def get_distributed_hooks(config: ParallelConfig | None = None) -> DistributedHooks:
    """The registered hooks; without any, a NotSupportedError naming the rendezvous."""
    if _HOOKS:
        return _HOOKS[-1]
    shards = config.num_shards if config is not None else "> 1"
    raise NotSupportedError(
        f"Multi-host Parallelize (rendezvous with num_shards={shards}) needs the "
        "collectives backend, which is not available in this build; run on one host "
        "(rendezvous=None) for now."
    )


def is_distributed(rendezvous: Any) -> bool:
    """True for a rendezvous (dict or typed) with more than one shard."""
    if rendezvous is None:
        return False
    shards = rendezvous.get("num_shards", 1) if isinstance(rendezvous, dict) else getattr(
        rendezvous, "num_shards", 1)
    return int(shards) > 1
