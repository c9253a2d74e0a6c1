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
from collections.abc import Callable, Iterator
from typing import Any

from dpgraph.parallel import distributed, grouping, memory, replicate, shared_model, sync
from dpgraph.parallel.allreduce import allreduce_single_host, broadcast_computed_params
from dpgraph.parallel.config import ParallelConfig
from dpgraph.parallel.spatial_bn import combine_spatial_bn
from dpgraph.parallel.state import ParallelState, publish, publish_start
from dpgraph.parallel.transaction import take_snapshot
from dpgraph.parallel.validate import validate_call

log = logging.getLogger("dpgraph.parallel")


Pass = Callable[[ParallelState], None]


def _start(state: ParallelState) -> None:
    """Model attributes Caffe2 sets first, and the main net's type and worker count."""
    publish_start(state)
    proto = state.model.net.Proto()
    proto.num_workers = state.config.num_workers
    proto.type = state.config.net_type
    log.info("Parallelizing model for devices: %s", list(state.config.devices))


def _group_params(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    state.grouped = grouping.group_by_device(state, model.params, state.non_datapar_params)
    computed = grouping.group_by_device(state, model.GetComputedParams(""), [])
    state.grouped.update(computed)
    state.param_names = list(state.grouped)
    state.computed_param_names = list(computed)
    publish(state)


def _pre_grad_transform(state: ParallelState) -> None:
    if state.config.pre_grad_net_transformer_fun is not None:
        state.config.pre_grad_net_transformer_fun(state.model)


def _add_gradients(state: ParallelState) -> None:
    if state.config.has_parameter_updates:
        replicate.add_gradients(state)


def _net_transform(state: ParallelState) -> None:
    """``net_transformer_fun(model, ndev, prefix, device_type)``, exactly once."""
    config = state.config
    if config.net_transformer_fun is not None:
        publish(state)
        config.net_transformer_fun(state.model, len(config.devices), config.device_prefix,
                                   config.device_type)


def _combine_spatial_bn(state: ParallelState) -> None:
    if state.config.combine_spatial_bn:
        combine_spatial_bn(state)


def _group_gradients(state: ParallelState) -> None:
    model = state.model
    grouping.validate_params(model.params)
    param_to_grad = model.param_to_grad
    grads = [param_to_grad[p] for p in model.params if p in param_to_grad]
    non_datapar = [param_to_grad[p] for p in state.non_datapar_params if p in param_to_grad]
    grouped = grouping.group_by_device(state, grads, non_datapar)
    state.grouped.update(grouped)
    state.grad_names = list(grouped)


def _infer_devices(state: ParallelState) -> None:
    grouping.infer_blob_device(state)
    publish(state)


def _multi_host(state: ParallelState) -> distributed.DistributedHooks | None:
    """The distributed hooks when the rendezvous spans several hosts (the one seam)."""
    rendezvous = state.config.rendezvous
    if rendezvous is not None and rendezvous.is_multi_host:
        return distributed.get_distributed_hooks(state.config)
    return None


def _reduce_gradients(state: ParallelState) -> None:
    """Broadcast computed params, then all-reduce gradients in reverse param order."""
    hooks = _multi_host(state)
    if state.config.broadcast_computed_params:
        if hooks is not None:
            hooks.broadcast_computed_params(state)
        else:
            broadcast_computed_params(state)
    if not state.grad_names:
        log.info("NOTE: Param builder function did not create any parameters.")
        return
    names = list(reversed(state.grad_names))
    if hooks is not None:
        hooks.allreduce(state, names, state.model.net)
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
        assert config.optimizer_builder_fun is not None  # has_parameter_updates
        state.optimizer = config.optimizer_builder_fun(model)
        model._optimizer = state.optimizer


def _check_operators(state: ParallelState) -> None:
    grouping.analyze_operators(state)
    # dag nets run the first iteration with one worker (allocation and NCCL safety)
    state.model.net.Proto().arg.add(name="first_iter_only_one_worker", i=1)


def _post_sync(state: ParallelState) -> None:
    if state.config.post_sync_builder_fun is not None:
        publish(state)
        replicate.per_device(state, state.config.post_sync_builder_fun)


def _lifecycle_nets(state: ParallelState) -> None:
    state.init_nets = [state.model.param_init_net]
    state.nets = [state.model.net]
    state.finished = True


def _barrier(state: ParallelState) -> None:
    hooks = _multi_host(state)
    if hooks is not None:
        hooks.add_barrier(state, state.config.barrier_net_timeout_sec)


def _remap_shared(state: ParallelState) -> None:
    if state.config.shared_model:
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
    _combine_spatial_bn, _group_gradients, _infer_devices, _reduce_gradients, _add_updates,
    sync.register_blobs_to_sync, _infer_devices, _check_operators, sync.add_initial_sync,
    _post_sync, memory.add_memory_passes, _lifecycle_nets, _barrier, _remap_shared,
)


def _run(state: ParallelState) -> None:
    tail = TRAINING_PASSES if state.config.has_parameter_updates else FORWARD_ONLY_PASSES
    for pass_ in BUILD_PASSES + tail:
        pass_(state)
        log.debug("Parallelize pass %s done", pass_.__name__)


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
