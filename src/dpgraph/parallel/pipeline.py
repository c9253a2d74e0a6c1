"""``Parallelize`` as a list of declared passes over one :class:`ParallelState`, run by
:func:`~dpgraph.parallel.passes.run_passes`.

Order (Caffe2's): validate; replicate input+forward per device; group params; the
pre-gradient transformer; loss gradients and backward pass; the net transformer;
(forward-only models stop here); combine SpatialBN; group gradients; broadcast computed
params; all-reduce gradients (reverse param order, or in buckets with
``gradient_bucket_mb``; cast around the collective with ``gradient_dtype``); shared-model
pruning; updates (with ``shard_optimizer_state``: owners assigned before the reduction,
gradients reduced onto their owner, update ops kept on the owner, params sent back); blobs
to sync; device checks; initial sync; post-sync builder; gradient
accumulation (``accumulate_steps``: the sync phase moves into an If); memory passes;
lifecycle nets; barrier; shared-model remapping.  On any error the model is restored
exactly as it was.

To add a pass, define it with :func:`~dpgraph.parallel.passes.parallel_pass` (its contract)
and insert it into :data:`TRAINING_PASSES` (or :data:`BUILD_PASSES`) where it belongs.
"""

from __future__ import annotations

import logging
from typing import Any

from dpgraph.parallel import grouping, memory, multihost, replicate, shared_model, sync
from dpgraph.parallel.accumulate import accumulate_gradients, gate_barrier, mark_sync_phase
from dpgraph.parallel.allreduce import allreduce_single_host, broadcast_computed_params
from dpgraph.parallel.buckets import Reducer, reduce_in_buckets
from dpgraph.parallel.compress import compressing
from dpgraph.parallel.config import ParallelConfig
from dpgraph.parallel.passes import Pass, parallel_pass, run_passes
from dpgraph.parallel.shard import assign_shards, mark_updates, shard_updates
from dpgraph.parallel.shard_reduce import reducing_to_owners
from dpgraph.parallel.spatial_bn import combine_spatial_bn
from dpgraph.parallel.state import ParallelState, start_attributes

log = logging.getLogger("dpgraph.parallel")


@parallel_pass(reads=("config.devices", "config.num_workers", "config.net_type"),
               writes=("model_attrs", "net"))
def _start(state: ParallelState) -> None:
    """Model attributes Caffe2 sets first, and the main net's type and worker count."""
    state.model_attrs.update(start_attributes(state))
    proto = state.model.net.Proto()
    proto.num_workers = state.config.num_workers
    proto.type = state.config.net_type
    log.info("Parallelizing model for devices: %s", list(state.config.devices))


@parallel_pass(reads=("model", "non_datapar_params", "config.device_prefix"),
               writes=("grouped", "param_names", "computed_param_names"))
def _group_params(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    state.grouped = grouping.group_by_device(state, model.params, state.non_datapar_params)
    computed = grouping.group_by_device(state, model.GetComputedParams(""), [])
    state.grouped.update(computed)
    state.param_names = list(state.grouped)
    state.computed_param_names = list(computed)


@parallel_pass(reads=("config.pre_grad_net_transformer_fun",), writes=("model",),
               user_code=True,
               enabled=lambda config: config.pre_grad_net_transformer_fun is not None)
def _pre_grad_transform(state: ParallelState) -> None:
    assert state.config.pre_grad_net_transformer_fun is not None
    state.config.pre_grad_net_transformer_fun(state.model)


@parallel_pass(reads=("losses_by_device", "config.device_type"), writes=("net", "model"),
               enabled=lambda config: config.has_parameter_updates)
def _add_gradients(state: ParallelState) -> None:
    replicate.add_gradients(state)


@parallel_pass(reads=("config.net_transformer_fun",), writes=("model",), user_code=True,
               enabled=lambda config: config.net_transformer_fun is not None)
def _net_transform(state: ParallelState) -> None:
    """``net_transformer_fun(model, ndev, prefix, device_type)``, exactly once."""
    config = state.config
    assert config.net_transformer_fun is not None
    config.net_transformer_fun(state.model, len(config.devices), config.device_prefix,
                               config.device_type)


@parallel_pass(reads=("config.devices",), writes=("net",),
               enabled=lambda config: config.combine_spatial_bn)
def _combine_spatial_bn(state: ParallelState) -> None:
    combine_spatial_bn(state)


@parallel_pass(reads=("model", "non_datapar_params"), writes=("grouped", "grad_names"))
def _group_gradients(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    param_to_grad = model.param_to_grad
    grads = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar = [param_to_grad[p] for p in state.non_datapar_params if p in param_to_grad]
    grouped = grouping.group_by_device(state, grads, non_datapar)
    state.grouped.update(grouped)
    state.grad_names = list(grouped)


@parallel_pass(reads=("net", "param_init_net"), writes=("blob_to_device",))
def _infer_devices(state: ParallelState) -> None:
    grouping.infer_blob_device(state)


@parallel_pass(reads=("grouped", "computed_param_names", "blob_to_device", "config"),
               writes=("net", "param_init_net"),
               enabled=lambda config: config.broadcast_computed_params)
def _broadcast_computed_params(state: ParallelState) -> None:
    """Computed params (SpatialBN statistics) from the master device (and rank 0)."""
    if state.config.is_multi_host:
        multihost.broadcast_computed_params(state)
    else:
        broadcast_computed_params(state)


def gradient_reducer(state: ParallelState) -> Reducer:
    """The per-blob reducer of this configuration: across hosts, or on this host; with
    ``shard_optimizer_state``, onto each gradient's owner; with ``gradient_dtype``,
    compressed around the collective."""
    reducer: Reducer = (multihost.allreduce if state.config.is_multi_host
                        else allreduce_single_host)
    if state.config.shard_optimizer_state:
        reducer = reducing_to_owners(reducer)
    return reducer if state.config.gradient_dtype is None else compressing(reducer)


def _owner_group(state: ParallelState) -> Any:
    """With ``shard_optimizer_state``: a gradient's owner, so buckets hold one owner's
    gradients (None otherwise)."""
    plan = state.shard_plan
    if plan is None:
        return None
    return lambda name: plan.owner[plan.grads[name]] if name in plan.grads else None


@parallel_pass(reads=("grouped", "grad_names", "blob_to_device", "config", "shard_plan"),
               writes=("net", "param_init_net"),
               enabled=lambda config: config.gradient_bucket_mb is None)
def _reduce_gradients(state: ParallelState) -> None:
    """All-reduce gradients in reverse param order (across hosts too when the rendezvous
    spans several), one collective per gradient as in Caffe2."""
    if not state.grad_names:
        log.info("NOTE: Param builder function did not create any parameters.")
        return
    names = list(reversed(state.grad_names))
    gradient_reducer(state)(state, names, state.model.net)


@parallel_pass(reads=("grouped", "grad_names", "blob_to_device", "config", "net",
                      "param_init_net", "model", "shard_plan"),
               writes=("net", "param_init_net", "model_attrs"),
               enabled=lambda config: config.gradient_bucket_mb is not None)
def _reduce_gradients_in_buckets(state: ParallelState) -> None:
    """``gradient_bucket_mb``: dense gradients packed into buckets in the order the
    backward pass produces them, one collective per bucket (see
    :mod:`dpgraph.parallel.buckets`); sparse ones keep the per-blob path."""
    if not state.grad_names:
        log.info("NOTE: Param builder function did not create any parameters.")
        return
    assert state.config.gradient_bucket_mb is not None
    names = list(reversed(state.grad_names))
    reduce_in_buckets(state, names, state.model.net, gradient_reducer(state),
                      state.config.gradient_bucket_mb, group_of=_owner_group(state))


@parallel_pass(reads=("model",), writes=("model", "all_params_before_prune"),
               enabled=lambda config: config.shared_model)
def _prune_shared(state: ParallelState) -> None:
    shared_model.prune_parameters(state)


@parallel_pass(reads=("config.param_update_builder_fun", "config.optimizer_builder_fun"),
               writes=("net", "param_init_net", "model", "optimizer"), user_code=True)
def _add_updates(state: ParallelState) -> None:
    config = state.config
    if config.param_update_builder_fun is not None:
        replicate.per_device(state, config.param_update_builder_fun)
    else:
        log.info("Calling optimizer builder function")
        assert config.optimizer_builder_fun is not None  # has_parameter_updates
        state.optimizer = config.optimizer_builder_fun(state.model)


@parallel_pass(reads=("net", "config.device_prefix"), writes=("net",))
def _check_operators(state: ParallelState) -> None:
    grouping.analyze_operators(state)
    # dag nets run the first iteration with one worker (allocation and NCCL safety)
    state.model.net.Proto().arg.add(name="first_iter_only_one_worker", i=1)


@parallel_pass(reads=("config.post_sync_builder_fun",), writes=("model",), user_code=True,
               enabled=lambda config: config.post_sync_builder_fun is not None)
def _post_sync(state: ParallelState) -> None:
    assert state.config.post_sync_builder_fun is not None
    replicate.per_device(state, state.config.post_sync_builder_fun)


@parallel_pass(reads=("net", "losses_by_device", "model"), writes=("net",),
               enabled=lambda config: config.optimize_gradient_memory)
def _optimize_gradient_memory(state: ParallelState) -> None:
    memory.optimize_gradient_memory(state)


@parallel_pass(reads=("net", "config.blobs_to_keep", "model"), writes=("net",),
               enabled=lambda config: config.dynamic_memory_management)
def _dynamic_memory_management(state: ParallelState) -> None:
    memory.dynamic_memory_management(state)


@parallel_pass(writes=("init_nets", "nets", "finished"))
def _lifecycle_nets(state: ParallelState) -> None:
    state.init_nets = [state.model.param_init_net]
    state.nets = [state.model.net]
    state.finished = True


@parallel_pass(reads=("config.rendezvous", "config.barrier_net_timeout_sec"),
               writes=("init_nets", "nets", "model_attrs"),
               enabled=lambda config: config.is_multi_host)
def _barrier(state: ParallelState) -> None:
    multihost.add_barrier(state, state.config.barrier_net_timeout_sec)


@parallel_pass(reads=("all_params_before_prune", "model"), writes=("net", "param_init_net"),
               enabled=lambda config: config.shared_model)
def _remap_shared(state: ParallelState) -> None:
    shared_model.remap_parameter_blobs(state)


#: Passes every Parallelize call runs, in order.
BUILD_PASSES: tuple[Pass, ...] = (
    _start, replicate.replicate, _group_params, _pre_grad_transform, _add_gradients,
    _net_transform,
)
#: Then, for a model without update builders (test/eval models).
FORWARD_ONLY_PASSES: tuple[Pass, ...] = (_infer_devices, _lifecycle_nets)
#: Then, for a training model.
TRAINING_PASSES: tuple[Pass, ...] = (
    _combine_spatial_bn, _group_gradients, _infer_devices, mark_sync_phase,
    _broadcast_computed_params, assign_shards, _reduce_gradients,
    _reduce_gradients_in_buckets, _prune_shared, mark_updates, _add_updates, shard_updates,
    sync.register_blobs_to_sync, _infer_devices,
    _check_operators, sync.add_initial_sync, _post_sync, accumulate_gradients,
    _optimize_gradient_memory, _dynamic_memory_management,
    _lifecycle_nets, _barrier, gate_barrier, _remap_shared,
)


def passes_for(config: ParallelConfig) -> tuple[Pass, ...]:
    """The Parallelize pipeline for ``config``."""
    tail = TRAINING_PASSES if config.has_parameter_updates else FORWARD_ONLY_PASSES
    return BUILD_PASSES + tail


def parallelize(model: Any, config: ParallelConfig) -> ParallelState:
    """Run the Parallelize pipeline; on any exception restore ``model`` and re-raise."""
    return run_passes(model, config, passes_for(config))
