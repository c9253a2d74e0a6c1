"""Running a parallelized model: init nets, nets, checkpoints, blob syncs."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from dpgraph.collectives.rendezvous import as_rendezvous
from dpgraph.errors import NotParallelizedError, ParallelizeError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.device import IsGPUDeviceType
from dpgraph.ir.net import Net
from dpgraph.parallel import multihost
from dpgraph.parallel._emit import walk_ops
from dpgraph.parallel.config import DEFAULT_BARRIER_NET_TIMEOUT_SEC, ParallelConfig
from dpgraph.parallel.grouping import compute_blobs_to_sync, stripBlobName
from dpgraph.parallel.multihost import is_distributed
from dpgraph.parallel.shard_checkpoint import gather_state, release_gathered, reshard_state
from dpgraph.parallel.state import ParallelState
from dpgraph.parallel.sync import blobs_to_sync, sync_params
from dpgraph.runtime import api as runtime

log = logging.getLogger("dpgraph.parallel")


def _require_parallelized(model: Any, what: str, attribute: str = "_device_grouped_blobs"
                          ) -> None:
    if not hasattr(model, attribute) or not getattr(model, "_devices", None):
        name = getattr(model, "name", None) or type(model).__name__
        raise NotParallelizedError(
            f"{what} needs a model built with data_parallel_model.Parallelize, but model "
            f"{name!r} has no {attribute}; call Parallelize(model, ...) first."
        )


def state_of(model: Any, what: str = "This helper") -> ParallelState:
    """A ParallelState view of an already parallelized model (for the helpers below)."""
    _require_parallelized(model, what)
    rendezvous = getattr(model, "_rendezvous", None)
    config = ParallelConfig(
        devices=tuple(model._devices), device_type=model._device_type,
        device_prefix=model._device_prefix, input_builder_fun=None,
        forward_pass_builder_fun=None, rendezvous=as_rendezvous(rendezvous),
        rendezvous_legacy=rendezvous, shared_model=getattr(model, "_shared_model", False),
        cpu_device=not IsGPUDeviceType(model._device_type),
    )
    state = ParallelState(model=model, config=config, grouped=model._device_grouped_blobs)
    state.param_names = list(getattr(model, "_param_names", []))
    state.blob_to_device = getattr(model, "_blob_to_device", {})
    state.broadcast_context = getattr(model, "_broadcast_context", None)
    state.shard_plan = getattr(model, "_shard_plan", None)
    return state


def _sync(state: ParallelState, init_net: Any, net: Any, names: Iterable[str],
          max_concurrent_distributed_ops: int = 4) -> None:
    """``sync_params`` on an already parallelized model; a broadcast context made on the way
    is kept on the model for later syncs (as Caffe2's ``model._broadcast_context``)."""
    sync_params(state, init_net, net, names, max_concurrent_distributed_ops)
    if state.broadcast_context is not None:
        state.model._broadcast_context = state.broadcast_context


def RunInitNet(model: Any) -> None:
    """Run every init net once, then create the nets."""
    _require_parallelized(model, "RunInitNet", "_data_parallel_model_nets")
    for init_net in model._data_parallel_model_init_nets:
        runtime.RunNetOnce(init_net)
    CreateNet(model)


def RunWarmup(model: Any) -> None:
    """Run the main net ``_warmup_iterations`` times, then the warmup broadcast net."""
    _require_parallelized(model, "RunWarmup", "_data_parallel_model_nets")
    runtime.RunNet(model.net, model._warmup_iterations)
    runtime.RunNetOnce(model._warmup_broadcast)


def RunNet(model: Any, num_iterations: int) -> None:
    """Run each net: a plain net ``num_iterations`` times, a ``(net, k)`` pair k times
    (first dropping optimizer state a checkpoint gathered onto the master device)."""
    _require_parallelized(model, "RunNet", "_data_parallel_model_nets")
    release_gathered(model)
    for entry in model._data_parallel_model_nets:
        if isinstance(entry, tuple):
            runtime.RunNet(entry[0].Proto().name, entry[1])
        else:
            runtime.RunNet(entry, num_iterations)


def CreateNet(model: Any, overwrite: bool = False) -> None:
    """Create every net of the model in the current workspace."""
    _require_parallelized(model, "CreateNet", "_data_parallel_model_nets")
    for entry in model._data_parallel_model_nets:
        net = entry[0] if isinstance(entry, tuple) else entry
        runtime.CreateNet(net, overwrite=overwrite)


def GetCheckpointParams(model: Any) -> set[Any]:
    """The first device's synced blobs plus every unprefixed Iter/AtomicIter output (and
    the micro-batch counter of ``accumulate_steps``), subnets included.

    With ``shard_optimizer_state`` also every optimizer-state blob under the first device's
    name, gathered there from its owner (across hosts: call it on every rank); the next
    ``RunNet`` drops the gathered copies again."""
    state = state_of(model, "GetCheckpointParams")
    blobs, _ = compute_blobs_to_sync(state)
    first = f"{state.namescope(state.master)}/"
    result: set[Any] = {b for b in blobs if str(b).startswith(first)}
    result.update(gather_state(model))
    prefix = f"{model._device_prefix}_"
    for op in walk_ops(model.net.Proto()):
        if op.type in ("Iter", "AtomicIter", "GradientAccumulationStep") and \
                not op.output[0].startswith(prefix):
            result.add(op.output[0])
    return result


def _ensure_grouped(model: Any, names: Iterable[str]) -> None:
    for name in names:
        if name not in model._device_grouped_blobs:
            model._device_grouped_blobs[name] = {
                d: BlobReference(f"{model._device_prefix}_{d}/{name}") for d in model._devices
            }


def FinalizeAfterCheckpoint(model: Any, blobs: Sequence[Any] | None = None,
                            cpu_mode: bool = False) -> None:
    """Broadcast the master device's (checkpoint-loaded) blobs to every device; with
    ``shard_optimizer_state``, copy each optimizer-state blob to its owner instead (see
    :mod:`dpgraph.parallel.shard_checkpoint`)."""
    if not hasattr(model, "_checkpoint_net"):
        state = state_of(model)
        sharded = set(state.shard_plan.state) if state.shard_plan is not None else set()
        if blobs is None:
            _, names = blobs_to_sync(state)
        else:
            names = [n for n in (stripBlobName(b) for b in blobs) if n not in sharded]
        _ensure_grouped(model, names)
        model._checkpoint_net = Net("checkpoint_sync_net")
        if not cpu_mode and IsGPUDeviceType(model._device_type):
            model._checkpoint_net.RunAllOnGPU()
        init_net = None
        if is_distributed(model._rendezvous):
            init_net = Net("checkpoint_init_net")
        _sync(state, init_net, model._checkpoint_net, names, max_concurrent_distributed_ops=1)
        if init_net is not None:
            runtime.RunNetOnce(init_net)
        runtime.CreateNet(model._checkpoint_net)
    log.info("Run checkpoint net")
    runtime.RunNet(model._checkpoint_net.Proto().name)
    reshard_state(model)


def AddBlobSync(model: Any, blobs: Sequence[Any], net: Any = None) -> None:
    """Copy each (unprefixed) blob from the master device to the others, on ``net``."""
    if len(blobs) == 0:
        return
    _require_parallelized(model, "AddBlobSync")
    net = model.net if net is None else net
    for b in blobs:
        if str(b).startswith(model._device_prefix):
            raise ParallelizeError(f"Provide unprefixed blob name: {b}")
    model._device_grouped_blobs.update({
        str(b): {d: BlobReference(f"{model._device_prefix}_{d}/{b}") for d in model._devices}
        for b in blobs
    })
    _sync(state_of(model), model.param_init_net, net, {str(b) for b in blobs})


def AddDistributedBlobSync(model: Any, blobs: Sequence[Any],
                           timeout_sec: float | None = None) -> None:
    """All-reduce blobs across hosts (not devices); nothing to do on one host."""
    if not is_distributed(getattr(model, "_rendezvous", None)):
        return
    multihost.add_blob_sync(model, blobs, timeout_sec)


def Synchronize(model: Any, timeout_sec: float = DEFAULT_BARRIER_NET_TIMEOUT_SEC) -> None:
    """Deprecated explicit barrier across hosts; a no-op on one host."""
    warnings.warn("The Synchronize API has been deprecated. We now have a barrier net "
                  "which runs before training to ensure all hosts wait before training.",
                  category=DeprecationWarning, stacklevel=3)
    if not is_distributed(getattr(model, "_rendezvous", None)):
        return
    multihost.synchronize(model, timeout_sec)
