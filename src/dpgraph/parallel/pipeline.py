"""``Parallelize`` as a pipeline of small passes over one :class:`ParallelState`.

Order (Caffe2's): validate; replicate input+forward per device; group params; the
pre-gradient transformer; loss gradients and backward pass; the net transformer;
(forward-only models stop here); combine SpatialBN; group gradients; broadcast computed
params; all-reduce gradients (reverse param order); shared-model pruning; updates; blobs to
sync; device checks; initial sync; post-sync builder; memory passes; lifecycle nets;
shared-model remapping.  On any error the model is restored exactly as it was.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

from dpgraph.parallel import distributed, grouping, memory, replicate, shared_model, sync
from dpgraph.parallel.allreduce import allreduce_single_host, broadcast_computed_params
from dpgraph.parallel.config import ParallelConfig
from dpgraph.parallel.spatial_bn import combine_spatial_bn
from dpgraph.parallel.state import ParallelState, publish, publish_start
from dpgraph.parallel.transaction import take_snapshot
from dpgraph.parallel.validate import validate_call

log = logging.getLogger("dpgraph.parallel")


def _configure_net(state: ParallelState) -> None:
    proto = state.model.net.Proto()
    proto.num_workers = state.config.num_workers
    proto.type = state.config.net_type


def _group_params(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    state.grouped = grouping.group_by_device(state, model.params, state.non_datapar_params)
    computed = grouping.group_by_device(state, model.GetComputedParams(""), [])
    state.grouped.update(computed)
    state.param_names = list(state.grouped)
    state.computed_param_names = list(computed)


def _group_gradients(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    param_to_grad = model.param_to_grad
    grads = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar = [param_to_grad[p] for p in state.non_datapar_params if p in param_to_grad]
    grouped = grouping.group_by_device(state, grads, non_datapar)
    state.grouped.update(grouped)
    state.grad_names = list(grouped)


def _reduce_gradients(state: ParallelState) -> None:
    config = state.config
    if config.broadcast_computed_params:
        if config.rendezvous is not None and config.rendezvous.is_multi_host:
            distributed.get_distributed_hooks(config).broadcast_computed_params(state)
        else:
            broadcast_computed_params(state)
    if not state.grad_names:
        log.info("NOTE: Param builder function did not create any parameters.")
        return
    names = list(reversed(state.grad_names))
    if config.rendezvous is not None and config.rendezvous.is_multi_host:
        distributed.get_distributed_hooks(config).allreduce(state, names, state.model.net)
    else:
        allreduce_single_host(state, names, state.model.net)


def _add_updates(state: ParallelState) -> None:
    config, model = state.config, state.model
    if config.shared_model:
        shared_model.prune_parameters(state)
    publish(state)
    if config.param_update_builder_fun is not None:
        replicate.per_device(state, config.param_update_builder_fun)
    else:
        log.info("Calling optimizer builder function")
        state.optimizer = config.optimizer_builder_fun(model)
        model._optimizer = state.optimizer


def _finish(state: ParallelState) -> None:
    config, model = state.config, state.model
    sync.register_blobs_to_sync(state)
    grouping.infer_blob_device(state)
    grouping.analyze_operators(state)
    model.net.Proto().arg.add(name="first_iter_only_one_worker", i=1)
    sync.add_initial_sync(state)
    if config.post_sync_builder_fun is not None:
        publish(state)
        replicate.per_device(state, config.post_sync_builder_fun)
    memory.add_memory_passes(state)
    state.init_nets = [model.param_init_net]
    state.nets = [model.net]
    state.finished = True
    if config.rendezvous is not None and config.rendezvous.is_multi_host:
        distributed.get_distributed_hooks(config).add_barrier(
            state, config.barrier_net_timeout_sec)
    if config.shared_model:
        shared_model.remap_parameter_blobs(state)


def _run(state: ParallelState) -> None:
    config, model = state.config, state.model
    publish_start(state)
    _configure_net(state)
    log.info("Parallelizing model for devices: %s", list(config.devices))
    replicate.replicate(state)
    _group_params(state)
    publish(state)
    if config.pre_grad_net_transformer_fun is not None:
        config.pre_grad_net_transformer_fun(model)
    if config.has_parameter_updates:
        replicate.add_gradients(state)
    if config.net_transformer_fun is not None:
        publish(state)
        config.net_transformer_fun(model, len(config.devices), config.device_prefix,
                                   config.device_type)
    if not config.has_parameter_updates:
        log.info("Parameter update function not defined --> only forward")
        grouping.infer_blob_device(state)
        state.init_nets, state.nets = [model.param_init_net], [model.net]
        state.finished = True
        return
    if config.combine_spatial_bn:
        combine_spatial_bn(state)
    _group_gradients(state)
    grouping.infer_blob_device(state)
    publish(state)
    _reduce_gradients(state)
    _add_updates(state)
    _finish(state)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the graph is built.

    Building a large graph allocates hundreds of thousands of small objects and no
    garbage cycles; full collections would rescan the growing heap again and again and
    make the pass superlinear in the number of devices.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parallelize(model: Any, config: ParallelConfig) -> ParallelState:
    """Run the pipeline; on any exception restore ``model`` and re-raise."""
    validate_call(model, config)
    snapshot = take_snapshot(model)
    state = ParallelState(model=model, config=config)
    with _gc_paused():
        try:
            _run(state)
            publish(state)
        except BaseException:
            snapshot.restore()
            raise
    return state
