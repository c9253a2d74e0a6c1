"""Sharded optimizer state: gradients reduced onto their owner, parameters sent back.

On one host a gradient's copies are summed onto the owner's copy only — a graph reduction,
no all-reduce: a ``Sum`` (named ``dpm``) in device order on CPU (the same order as Caffe2's
all-reduce, so the owner's sum is bitwise the one every device had before), Caffe2's
pairwise trees for 4/8/16 GPUs with the last sum written to the owner, or ``NCCLReduce``
with ``use_nccl``.  Across hosts (GLOO) one ``Reduce`` per gradient sums every device of
every host into the owner host's copies (``root``; the ``ReduceScatter`` op splits one
buffer by rows, which does not fit whole-parameter ownership).  After the update the owner's
parameter goes back with ``Copy`` (``NCCLBroadcast`` with ``use_nccl``) to the other local
devices and one ``Broadcast`` (root: the owner's host, the owner's copy listed first) across
hosts.  Gradients the plan does not shard (sparse ones) go to Caffe2's reducer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.parallel import multihost
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.allreduce import peer_access_pattern, sum_tree
from dpgraph.parallel.buckets import Reducer
from dpgraph.parallel.collectives_control import CollectivesConcurrencyControl
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

CPU, IDEEP = caffe2_pb2.PROTO_CPU, caffe2_pb2.PROTO_IDEEP


def owner_rank(state: ParallelState, name: str) -> int | None:
    """The owning rank of a reduced name: a sharded gradient, a bucket of one owner's
    gradients (``state.reduce_groups``), or a compressed copy ``<name>_<dtype>``."""
    plan = state.shard_plan
    if name in plan.grads:
        return int(plan.owner[plan.grads[name]])
    if name in state.reduce_groups:
        group = state.reduce_groups[name]
        return None if group is None else int(group)
    dtype = state.config.gradient_dtype
    if dtype and name.endswith(f"_{dtype}"):
        return owner_rank(state, name[:-len(dtype) - 1])
    return None


def _copies(state: ParallelState, name: str) -> list[str]:
    group = state.grouped[name]
    return [str(group[d]) for d in state.devices]


def _local_option(state: ParallelState, name: str, device: int) -> caffe2_pb2.DeviceOption:
    if state.is_gpu_blob(name):
        return device_option(state.config.device_type, device)
    return device_option(IDEEP if state.is_ideep_blob(name) else CPU, 0)


# --- gradients ---------------------------------------------------------------------------------
def _gpu_sum(state: ParallelState, net: Any, name: str, blobs: list[str], owner: int) -> None:
    """Caffe2's GPU sum order with the last sum written to ``owner``'s copy."""
    devices = list(state.devices)
    pattern = peer_access_pattern(state)
    dtype = state.config.device_type
    steps = sum_tree(len(blobs))
    for number, indices in enumerate(steps):
        inputs = [blobs[i] for i in indices]
        output_device = owner if number == len(steps) - 1 else devices[indices[0]]
        output = blobs[devices.index(output_device)] if output_device == owner else inputs[0]
        option = device_option(dtype, output_device)
        ops = []
        for k, i in enumerate(indices):
            peer = devices[i]
            if (peer != output_device and pattern is not None and pattern.size
                    and not pattern[output_device, peer]):
                copy = f"{state.namescope(output_device)}/{name}_gpu{peer}_copy"
                ops.append(make_op("Copy", [inputs[k]], [copy], option))
                inputs[k] = copy
        ops.append(make_op("Sum", inputs, [output], option, name="dpm"))
        emit(net, *ops)


def _reduce_local(state: ParallelState, net: Any, name: str, owner: int) -> None:
    blobs = _copies(state, name)
    target = blobs[list(state.devices).index(owner)]
    if not state.is_gpu_blob(name):
        emit(net, make_op("Sum", blobs, [target], _local_option(state, name, owner),
                          name="dpm"))
    elif state.config.use_nccl:  # device order: the sum order of NCCLAllreduce
        emit(net, make_op("NCCLReduce", blobs, [target],
                          device_option(state.config.device_type, owner),
                          root=list(state.devices).index(owner)))
    else:
        _gpu_sum(state, net, name, blobs, owner)


def _context(state: ParallelState, name: str) -> CollectivesConcurrencyControl:
    return multihost.collective_context(state, name, state.config.effective_max_concurrent_ops)


def _reduce_across_hosts(state: ParallelState, net: Any, names: Sequence[tuple[str, int]]
                         ) -> None:
    rendezvous = state.config.rendezvous
    assert rendezvous is not None
    context = _context(state, "shard_reduce")
    plan = state.shard_plan
    for name, rank in names:
        blobs = _copies(state, name)
        world, control = context.get_control_and_context([blobs[0]])
        emit(net, make_op("Reduce", [world, *blobs], blobs, multihost.master_option(state),
                          name=name, engine=rendezvous.engine, control_input=control,
                          root=plan.host_of(rank)))


def reducing_to_owners(fallback: Reducer) -> Reducer:
    """A reducer that sums each sharded name onto its owner (``fallback`` for the rest)."""
    def reduce_to_owners(state: ParallelState, names: Sequence[str], net: Any) -> None:
        owned = [(n, r) for n in names if (r := owner_rank(state, n)) is not None]
        rest = [n for n in names if owner_rank(state, n) is None]
        if state.config.is_multi_host:
            _reduce_across_hosts(state, net, owned)
        elif len(state.devices) > 1:
            for name, rank in owned:
                _reduce_local(state, net, name, state.shard_plan.device_of(rank))
        if rest:
            fallback(state, rest, net)
    return reduce_to_owners


# --- updated parameters back -------------------------------------------------------------------
def _copy_back(state: ParallelState, net: Any, name: str, owner: int) -> None:
    blobs = _copies(state, name)
    devices = list(state.devices)
    source = blobs[devices.index(owner)]
    if state.is_gpu_blob(name) and state.config.use_nccl:
        emit(net, make_op("NCCLBroadcast", blobs, blobs,
                          device_option(state.config.device_type, owner),
                          root=devices.index(owner)))
        return
    emit(net, *[make_op("Copy", [source], [blob], _local_option(state, name, device))
                for device, blob in zip(devices, blobs) if device != owner])


def _broadcast_across_hosts(state: ParallelState, net: Any,
                            context: CollectivesConcurrencyControl, name: str, rank: int) -> None:
    plan = state.shard_plan
    rendezvous = state.config.rendezvous
    assert rendezvous is not None
    blobs = _copies(state, name)
    first = blobs[list(state.devices).index(plan.device_of(rank))]
    ordered = [first, *[b for b in blobs if b != first]]
    world, control = context.get_control_and_context(ordered)
    emit(net, make_op("Broadcast", [world, *ordered], ordered,
                      multihost.blob_option(state, name), name=name,
                      engine=rendezvous.engine, control_input=control,
                      root=plan.host_of(rank)))


def broadcast_params(state: ParallelState, net: Any) -> None:
    """Every sharded param from its owner to every device (and host), sorted by name."""
    plan = state.shard_plan
    if plan.ranks == 1:
        return
    context = _context(state, "shard_broadcast") if state.config.is_multi_host else None
    for param in sorted(plan.owner):
        rank = plan.owner[param]
        if context is not None:
            _broadcast_across_hosts(state, net, context, param, rank)
        else:
            _copy_back(state, net, param, plan.device_of(rank))
