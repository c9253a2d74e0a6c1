"""Multi-host Parallelize (a rendezvous with ``num_shards > 1``): the passes that emit
Caffe2's cross-host collectives, called by the pipeline, BMUF and the lifecycle helpers.

With a rendezvous of ``num_shards > 1`` and the GLOO engine, one op per blob spans the local
devices and the hosts::

    param_init_net: CreateCommonWorld(store -> allreduce_0_cw, size=2, rank=r, timeout_ms)
                    CloneCommonWorld(allreduce_0_cw -> allreduce_1_cw) ...
                    Broadcast([broadcast_0_cw, cpu_0/w, cpu_1/w]) -> same     (rank 0's w)
    net:            Allreduce([allreduce_1_cw, cpu_0/w_grad, cpu_1/w_grad]) -> same

Other engines (NCCL with GPUs) reduce locally first and stage one copy per host::

    ConstantFill(gpu_0/g -> gpu_0/g_red); NCCLAllreduce(gpu_*/g); Copy(gpu_0/g -> gpu_0/g_red)
    Allreduce([allreduce_k_cw, gpu_0/g_red]); Copy(gpu_0/g_red -> gpu_0/g); Copy to gpu_1.. .

Collectives are spread over at most ``max_concurrent_distributed_ops`` common worlds and
chained per world (:class:`CollectivesConcurrencyControl`), so every host issues them in the
same order.  The engine is compared case-insensitively (``"gloo"`` is the GLOO engine).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from dpgraph.collectives.rendezvous import Rendezvous, as_rendezvous
from dpgraph.errors import CollectiveError, NotSupportedError, ParallelizeError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.net import Net
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.allreduce import broadcast as local_broadcast
from dpgraph.parallel.collectives_control import (
    CollectivesConcurrencyControl,
    concurrency_control,
    create_or_clone_common_world,
)
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as runtime

log = logging.getLogger("dpgraph.parallel")

CPU = caffe2_pb2.PROTO_CPU


def is_distributed(rendezvous: Any) -> bool:
    """True for a rendezvous (dict or typed) with more than one shard."""
    typed = as_rendezvous(rendezvous)
    return typed is not None and typed.is_multi_host


def _rendezvous(state: ParallelState) -> Rendezvous:
    rendezvous = state.config.rendezvous
    assert rendezvous is not None and rendezvous.is_multi_host  # callers check is_multi_host
    return rendezvous


def collective_context(state: ParallelState, name: str, max_ops: int,
             init_net: Net | None = None) -> CollectivesConcurrencyControl:
    return concurrency_control(
        name, max_ops, state.model.param_init_net if init_net is None else init_net,
        _rendezvous(state), state.config.timeout_sec)


def is_gloo(rendezvous: Rendezvous) -> bool:
    """Whether one Gloo op can span local devices and hosts (Caffe2's ``engine == 'GLOO'``)."""
    return rendezvous.engine.upper() == "GLOO"


def master_option(state: ParallelState) -> caffe2_pb2.DeviceOption:
    return device_option(state.config.device_type, state.master)


def blob_option(state: ParallelState, name: str) -> caffe2_pb2.DeviceOption:
    """The master device for GPU blobs, the CPU otherwise (Caffe2's ``_SyncAllParams``)."""
    return master_option(state) if state.is_gpu_blob(name) else device_option(CPU, 0)


def _copies(state: ParallelState, name: str) -> list[str]:
    """Every local device copy of ``name``, master first."""
    group = state.grouped[name]
    return [str(group[d]) for d in state.devices if d in group]


# --- gradient all-reduce ---------------------------------------------------------------------
def _check_dense(state: ParallelState, name: str) -> None:
    group = state.grouped[name]
    if isinstance(group[state.master], GradientSlice):
        raise NotSupportedError(
            f"Multi-host Parallelize cannot all-reduce the sparse gradient {name} (a "
            "GradientSlice, e.g. from Gather) across hosts; use a dense gradient (e.g. "
            "SparseToDense) or train on one host.")
    if len(group) != len(state.devices):
        raise ParallelizeError(f"Each device of {list(state.devices)} should have a copy of "
                               f"{name}; found it on {sorted(group)}.")


def _gloo_allreduce(state: ParallelState, net: Net, context: CollectivesConcurrencyControl,
                    name: str) -> None:
    """One Allreduce over every local copy and every host."""
    rendezvous = _rendezvous(state)
    blobs = _copies(state, name)
    world, control = context.get_control_and_context([blobs[0]])
    emit(net, make_op("Allreduce", [world, *blobs], blobs, master_option(state), name=name,
                      engine=rendezvous.engine, control_input=control,
                      gpu_direct=rendezvous.transport == "ibverbs"))


def _local_reduce(state: ParallelState, blobs: list[str], control: str | None) -> Any:
    """The sum of the local copies into the master copy (NCCLAllreduce on GPUs)."""
    option = master_option(state)
    if state.config.is_gpu:
        return make_op("NCCLAllreduce", blobs, blobs, option,
                       control_input=[control] if control else None)
    return make_op("Sum", blobs, [blobs[0]], option)


def _staged_allreduce(state: ParallelState, net: Net, context: CollectivesConcurrencyControl,
                      name: str, control: str | None) -> str:
    """Reduce locally, all-reduce the master's ``_red`` copy across hosts, copy it back and
    broadcast it locally; returns the blob that chains the next local reduction."""
    rendezvous = _rendezvous(state)
    blobs = _copies(state, name)
    master, reduced = blobs[0], f"{blobs[0]}_red"
    option = master_option(state)
    emit(net, make_op("ConstantFill", [master], [reduced], option, value=0.0),
         _local_reduce(state, blobs, control), make_op("Copy", [master], [reduced], option))
    world, world_control = context.get_control_and_context([reduced])
    emit(net, make_op("Allreduce", [world, reduced], [reduced], option, name=name,
                      engine=rendezvous.engine, control_input=world_control),
         make_op("Copy", [reduced], [master], option))
    local_broadcast(state, net, name, state.config.use_nccl)
    return master


def allreduce(state: ParallelState, names: Sequence[str], net: Net) -> None:
    """Caffe2's ``_AllReduceBlobsDistributed``: sum ``names`` over devices and hosts."""
    rendezvous = _rendezvous(state)
    context = collective_context(state, "allreduce", state.config.effective_max_concurrent_ops)
    control: str | None = None
    for name in names:
        _check_dense(state, name)
        if is_gloo(rendezvous):
            _gloo_allreduce(state, net, context, name)
        else:
            control = _staged_allreduce(state, net, context, name, control)


# --- broadcasts from rank 0 ------------------------------------------------------------------
def _gloo_broadcast(state: ParallelState, net: Net, context: CollectivesConcurrencyControl,
                    name: str) -> None:
    """One Broadcast of rank 0's master copy into every copy on every host."""
    blobs = _copies(state, name)
    world, control = context.get_control_and_context(blobs)
    emit(net, make_op("Broadcast", [world, *blobs], blobs, blob_option(state, name), name=name,
                      engine=_rendezvous(state).engine, control_input=control))


def _staged_broadcast(state: ParallelState, net: Net, context: CollectivesConcurrencyControl,
                      name: str) -> None:
    """Broadcast a CPU copy (``<blob>cpu``) of the master across hosts, then locally."""
    master = _copies(state, name)[0]
    staged = f"{master}cpu"
    gpu = state.is_gpu_blob(name)
    option = blob_option(state, name)
    emit(net, make_op("CopyGPUToCPU" if gpu else "Copy", [master], [staged], option))
    world, control = context.get_control_and_context([staged])
    emit(net, make_op("Broadcast", [world, staged], [staged], device_option(CPU, 0),
                      name=name, engine=_rendezvous(state).engine, control_input=control),
         make_op("CopyCPUToGPU" if gpu else "Copy", [staged], [master], option))
    local_broadcast(state, net, name)


def _broadcast_all(state: ParallelState, net: Net, context: CollectivesConcurrencyControl,
                   names: Sequence[str]) -> None:
    one = _gloo_broadcast if is_gloo(_rendezvous(state)) else _staged_broadcast
    for name in names:
        one(state, net, context, name)


def _broadcast_context(state: ParallelState, init_net: Net | None,
                       max_ops: int) -> CollectivesConcurrencyControl:
    """The model's broadcast context, made on first use (Caffe2's
    ``model._broadcast_context``, published from the state): later syncs reuse its common
    worlds and chains."""
    if state.broadcast_context is None:
        state.broadcast_context = collective_context(state, "broadcast", max_ops, init_net)
    return state.broadcast_context


def sync_params(state: ParallelState, init_net: Net | None, net: Net, names: Sequence[str],
                max_concurrent_distributed_ops: int) -> None:
    """Caffe2's ``_SyncAllParamsDistributed``: rank 0's master copy of each (sorted) name
    to every device of every host."""
    context = _broadcast_context(state, init_net, max_concurrent_distributed_ops)
    _broadcast_all(state, net, context, sorted(names))


def broadcast_computed_params(state: ParallelState) -> None:
    """Computed params (e.g. SpatialBN running stats) from rank 0's master to every device
    and host, each iteration (Caffe2 only broadcast them locally)."""
    names = state.computed_param_names
    if not names:
        return
    context = collective_context(state, "broadcast_computed",
                                 state.config.effective_max_concurrent_ops)
    _broadcast_all(state, state.model.net, context, names)


# --- barriers, blob syncs, checks ------------------------------------------------------------
def _model_rendezvous(model: Any) -> Rendezvous:
    rendezvous = as_rendezvous(getattr(model, "_rendezvous", None))
    if rendezvous is None or not rendezvous.is_multi_host:
        raise ParallelizeError("This helper needs a model parallelized with a rendezvous of "
                               "num_shards > 1.")
    return rendezvous


def barrier_net(rendezvous: Rendezvous, init_net: Net, prefix: str, timeout_sec: float) -> Net:
    """Caffe2's ``_CreateBarrierNet``: the barrier common world in ``init_net`` and a net
    holding one ``Barrier`` on it."""
    if not is_gloo(rendezvous):
        raise NotSupportedError(f"Engine {rendezvous.engine!r} does not support barrier; use "
                                "engine='GLOO'.")
    world = create_or_clone_common_world(init_net, f"{prefix}_barrier_cw", rendezvous,
                                         timeout_sec=timeout_sec)
    net = Net(f"{prefix}_barrier_net")
    emit(net, make_op("Barrier", [world], [], engine=rendezvous.engine))
    return net


def add_barrier(state: ParallelState, timeout_sec: float) -> None:
    """With GLOO, prepend the barrier init net and the barrier net, so fast hosts wait for
    slow ones before each run instead of timing out."""
    rendezvous = _rendezvous(state)
    if not is_gloo(rendezvous):
        return
    init_net = Net("barrier_init_net")
    net = barrier_net(rendezvous, init_net, "pre_training", timeout_sec)
    state.model_attrs.update(_barrier_init_net=init_net, _barrier_net=net)
    state.init_nets.insert(0, init_net)
    state.nets.insert(0, net)


def add_blob_sync(model: Any, blobs: Sequence[Any], timeout_sec: float | None = None) -> None:
    """``AddDistributedBlobSync``: one Allreduce of ``blobs`` across hosts (not devices)."""
    rendezvous = _model_rendezvous(model)
    names = [str(b) for b in blobs]
    world = create_or_clone_common_world(model.param_init_net, f"{'_'.join(names)}_cw",
                                         rendezvous, timeout_sec=timeout_sec)
    emit(model.net, make_op("Allreduce", [world, *names], names, engine=rendezvous.engine))


def synchronize(model: Any, timeout_sec: float) -> None:
    """The deprecated explicit barrier: build it once (fixed timeout), then run it."""
    if getattr(model, "_sync_barrier_net", None) is None:
        init_net = Net("sync_barrier_init_net")
        model._sync_barrier_net = barrier_net(_model_rendezvous(model), init_net, "sync",
                                              timeout_sec)
        runtime.RunNetOnce(init_net)
        runtime.CreateNet(model._sync_barrier_net)
        model._sync_barrier_net_timeout = timeout_sec
    if model._sync_barrier_net_timeout != timeout_sec:
        raise ParallelizeError(
            f"Synchronize: the barrier was built with timeout_sec="
            f"{model._sync_barrier_net_timeout}; it cannot change to {timeout_sec}.")
    runtime.RunNet(model._sync_barrier_net.Proto().name)


def _allcompare_net(model: Any, names: tuple[str, ...]) -> Net:
    """Per blob: ``SumSqrElements`` then ``Allgather`` of that checksum over the hosts."""
    cache = model.__dict__.setdefault("_allcompare_nets", {})
    if names not in cache:
        rendezvous = _model_rendezvous(model)
        init_net, net = Net("allcompare_init_net"), Net(f"allcompare_net_{len(cache)}")
        world = create_or_clone_common_world(init_net, f"allcompare_{len(cache)}_cw",
                                             rendezvous)
        placement = getattr(model, "_blob_to_device", {})
        for name in names:
            option = placement.get(name)
            emit(net, make_op("SumSqrElements", [name], [f"{name}_allcompare_sumsq"], option),
                 make_op("Allgather", [world, f"{name}_allcompare_sumsq"],
                         [f"{name}_allcompare"], engine=rendezvous.engine))
        runtime.RunNetOnce(init_net)
        runtime.CreateNet(net)
        cache[names] = net
    return cache[names]


def AllCompareBlobs(model: Any, blobs: Sequence[Any]) -> None:
    """Check that every host holds the same value of each blob (a sum-of-squares checksum,
    compared exactly); a no-op on one host.

    Raises:
        CollectiveError: naming the blob and every host's checksum, when hosts disagree.
    """
    if not is_distributed(getattr(model, "_rendezvous", None)):
        return
    names = tuple(str(b) for b in blobs)
    runtime.RunNet(_allcompare_net(model, names).Proto().name)
    for name in names:
        sums = [float(s) for s in runtime.FetchBlob(f"{name}_allcompare").reshape(-1)]
        if any(s != sums[0] for s in sums):
            raise CollectiveError(
                f"AllCompareBlobs: blob {name!r} differs across hosts (sum of squares by "
                f"rank: {sums}); the hosts' models diverged. Check that every host ran the "
                "same init nets (parameter sync) and the same number of iterations.")
