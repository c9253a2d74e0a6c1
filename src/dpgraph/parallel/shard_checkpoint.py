"""Checkpoints of a model with sharded optimizer state: complete on save, re-sharded on load.

A checkpoint names every parameter and every optimizer-state blob under the master device's
names, as Caffe2's (``cpu_0/fc_w``, ``cpu_0/fc_w_momentum``, ``optimizer_iteration``), so it
does not depend on the number of devices or hosts:

* :func:`gather_state` (run by ``GetCheckpointParams``) copies each state blob from its owner
  to the master's name — ``Copy`` on this host, then (across hosts) one ``Broadcast`` from
  the owner's host; a rank that owns nothing of a blob first builds its buffer with the
  optimizer's own init op.  Across hosts every rank must call it (as every rank calls
  ``FinalizeAfterCheckpoint``).  The gathered copies are dropped again by
  :func:`release_gathered` (the next ``data_parallel_model.RunNet``, or
  ``FinalizeAfterCheckpoint``).
* :func:`reshard_state` (run by ``FinalizeAfterCheckpoint`` after a load) sends rank 0's
  master copies to the other hosts (``Broadcast``), copies each blob to its owner in this
  model's plan — which may have another number of devices than the saving one — and drops
  the master's copies of what it does not own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dpgraph.collectives.rendezvous import as_rendezvous
from dpgraph.ir.device import IsGPUDeviceType
from dpgraph.ir.net import Net
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.collectives_control import create_or_clone_common_world
from dpgraph.parallel.shard import ShardPlan
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as runtime

CPU = caffe2_pb2.PROTO_CPU


def plan_of(model: Any) -> ShardPlan | None:
    return getattr(model, "_shard_plan", None)


def master_names(plan: ShardPlan) -> set[str]:
    """Every state blob under the master device's name."""
    return {plan.blob(plan.devices[0], name) for name in plan.state}


def _option(model: Any, device: int) -> caffe2_pb2.DeviceOption:
    if IsGPUDeviceType(model._device_type):
        return device_option(model._device_type, device)
    return device_option(model._device_type, 0)


def _local_owner(plan: ShardPlan, name: str) -> int | None:
    return plan.local_owner(plan.state[name])


def _init_ops(plan: ShardPlan, name: str) -> list[caffe2_pb2.OperatorDef]:
    return [caffe2_pb2.OperatorDef.FromString(op) for op in plan.state_init.get(name, ())]


def _world(model: Any, init_net: Net, name: str) -> str | None:
    rendezvous = as_rendezvous(getattr(model, "_rendezvous", None))
    if rendezvous is None or not rendezvous.is_multi_host:
        return None
    return create_or_clone_common_world(init_net, name, rendezvous)


def _broadcast(model: Any, net: Net, world: str, blob: str, root: int) -> None:
    rendezvous = as_rendezvous(model._rendezvous)
    assert rendezvous is not None
    emit(net, make_op("Broadcast", [world, blob], [blob], _option(model, model._devices[0]),
                      name=blob, engine=rendezvous.engine, root=root))


def _run_once(model: Any, attribute: str, build: Any) -> None:
    """Build the net (and run its init net) on first use, then run it."""
    net = model.__dict__.get(attribute)
    if net is None:
        init_net, net = Net(f"{attribute[1:]}_init"), Net(attribute[1:])
        build(init_net, net)
        if init_net.Proto().op:
            runtime.RunNetOnce(init_net)
        runtime.CreateNet(net)
        setattr(model, attribute, net)
    runtime.RunNet(net.Proto().name)


def _sorted_state(plan: ShardPlan) -> list[str]:
    return sorted(plan.state)


# --- save --------------------------------------------------------------------------------------
def _owners_present(plan: ShardPlan) -> bool:
    ws = runtime.current()
    for name in plan.state:
        device = _local_owner(plan, name)
        if device is not None and not ws.has_blob(plan.blob(device, name)):
            return False
    return True


def _build_gather(model: Any, plan: ShardPlan) -> Any:
    master = plan.devices[0]

    def build(init_net: Net, net: Net) -> None:
        world = _world(model, init_net, "shard_gather_cw")
        for name in _sorted_state(plan):
            target = plan.blob(master, name)
            device = _local_owner(plan, name)
            if device is None:
                emit(net, *_init_ops(plan, name))
            elif device != master:
                emit(net, make_op("Copy", [plan.blob(device, name)], [target],
                                  _option(model, master)))
            if world is not None:
                _broadcast(model, net, world, target, plan.host_of(plan.owner[plan.state[name]]))
    return build


def gather_state(model: Any) -> set[str]:
    """Copy every state blob to the master's name (when the owners hold it: after
    ``RunInitNet``) and return those names."""
    plan = plan_of(model)
    if plan is None or not plan.state:
        return set()
    names = master_names(plan)
    if _owners_present(plan):
        _run_once(model, "_shard_gather_net", _build_gather(model, plan))
        model._shard_gathered = sorted(
            plan.blob(plan.devices[0], n) for n in plan.state
            if _local_owner(plan, n) != plan.devices[0])
    return names


def release_gathered(model: Any) -> None:
    """Drop the master's gathered copies of state it does not own."""
    _remove(getattr(model, "_shard_gathered", ()))
    model.__dict__.pop("_shard_gathered", None)


def _remove(blobs: Iterable[str]) -> None:
    ws = runtime.current()
    for blob in blobs:
        if ws.has_blob(blob):
            ws.remove_blob(blob)


# --- load --------------------------------------------------------------------------------------
def _ensure_master_buffers(plan: ShardPlan) -> None:
    """A rank that did not load a state blob builds its buffer (the Broadcast fills it)."""
    ws = runtime.current()
    missing = [n for n in _sorted_state(plan)
               if not ws.has_blob(plan.blob(plan.devices[0], n))]
    ops = [op for name in missing for op in _init_ops(plan, name)]
    if ops:
        runtime.RunOperatorsOnce(ops)


def _build_reshard(model: Any, plan: ShardPlan) -> Any:
    master = plan.devices[0]

    def build(init_net: Net, net: Net) -> None:
        world = _world(model, init_net, "shard_reshard_cw")
        for name in _sorted_state(plan):
            source = plan.blob(master, name)
            if world is not None:
                _broadcast(model, net, world, source, 0)
            device = _local_owner(plan, name)
            if device is not None and device != master:
                emit(net, make_op("Copy", [source], [plan.blob(device, name)],
                                  _option(model, device)))
    return build


def reshard_state(model: Any) -> None:
    """After a load: rank 0's master copies to every host, each to its owner, then drop
    the master's copies of state it does not own."""
    plan = plan_of(model)
    if plan is None or not plan.state:
        return
    model.__dict__.pop("_shard_gathered", None)
    if plan.num_hosts > 1:
        _ensure_master_buffers(plan)
    _run_once(model, "_shard_reshard_net", _build_reshard(model, plan))
    _remove(plan.blob(plan.devices[0], n) for n in plan.state
            if _local_owner(plan, n) != plan.devices[0])
