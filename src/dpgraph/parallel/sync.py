"""Parameter synchronisation: the initial sync appended to the param init net,
``AddBlobSync`` and the checkpoint broadcast net.

Before (2 CPU devices)::

    param_init_net: XavierFill -> cpu_0/fc_w, XavierFill -> cpu_1/fc_w

After::

    param_init_net: ..., Copy(cpu_0/fc_w) -> cpu_1/fc_w
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.parallel import multihost
from dpgraph.parallel.allreduce import broadcast
from dpgraph.parallel.grouping import compute_blobs_to_sync, group_by_device, stripBlobName
from dpgraph.parallel.passes import parallel_pass
from dpgraph.parallel.state import ParallelState


def sync_params(state: ParallelState, init_net: Any, net: Any, names: Iterable[str],
                max_concurrent_distributed_ops: int = 4) -> None:
    """Caffe2's ``_SyncAllParams``: broadcast every name from the master device.

    Names are visited sorted, so every run (and every host) emits the same op order.
    """
    ordered = sorted(names)
    if state.config.is_multi_host:
        multihost.sync_params(state, init_net, net, ordered, max_concurrent_distributed_ops)
        return
    for name in ordered:
        broadcast(state, net, name)


def blobs_to_sync(state: ParallelState) -> tuple[list[Any], list[str]]:
    """``compute_blobs_to_sync`` without sharded optimizer state (only its owner has it)."""
    blobs, names = compute_blobs_to_sync(state)
    plan = getattr(state, "shard_plan", None)
    if plan is None or not plan.state:
        return blobs, names
    return ([b for b in blobs if stripBlobName(b) not in plan.state],
            [n for n in names if n not in plan.state])


@parallel_pass(reads=("param_init_net", "param_names", "shard_plan"),
               writes=("grouped", "sync_names"))
def register_blobs_to_sync(state: ParallelState) -> None:
    """Group the blobs to sync by device and remember their names."""
    blobs, names = blobs_to_sync(state)
    grouped = group_by_device(state, blobs, [])
    _check_every_device_has(state, grouped, names)
    state.grouped.update(grouped)
    state.sync_names = names


def _check_every_device_has(state: ParallelState, grouped: dict[str, Any],
                            names: list[str]) -> None:
    """Each init blob to sync must exist on every device under the same stripped name."""
    for name in names:
        missing = [d for d in state.devices if d not in grouped.get(name, {})]
        if missing:
            blob = next(iter(grouped[name].values()))
            raise ParallelizeError(
                f"param_init_net blob {str(blob)!r} has no counterpart {name!r} on device "
                f"{missing[0]}: its name carries the device scope twice (a scoped name such "
                f"as str(param) + '_suffix' created under the device NameScope). Name it "
                f"from the BlobReference (param + '_suffix') or an unscoped string, so each "
                f"device's copy is '<prefix>_<id>/<name>'.")


@parallel_pass(reads=("grouped", "sync_names", "blob_to_device"),
               writes=("param_init_net", "broadcast_context"))
def add_initial_sync(state: ParallelState) -> None:
    """Copy ops from the first device, appended to the param init net."""
    init_net = state.model.param_init_net
    sync_params(state, init_net, init_net, state.sync_names, max_concurrent_distributed_ops=1)
