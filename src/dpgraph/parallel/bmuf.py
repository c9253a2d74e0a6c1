"""Blockwise model-update filtering (BMUF, Chen & Huo, ICASSP 2016) on the Parallelize
passes.

Each device trains its own replica with ``param_update_fn`` (no gradient all-reduce).
After every block of local iterations, ``model._global_model_param_updates_net`` merges
the replicas on the master device, per param ``p`` (``p_v`` block momentum, ``p_g`` the
global model, ``p_prev`` the previous momentum for Nesterov)::

    p = sum of p over devices (and hosts)
    p = block_learning_rate * (p / num_devices - p_g)        # the block gradient
    p_v = block_momentum * p_v + p
    p_g = p_g + p_v
    nesterov:  p_prev = block_momentum * (p_v - p_prev); p_g = p_g - p_prev; p_prev = p_v
    p = p_g, broadcast to every device

Nets: init nets ``[param_init_net, _global_model_init_net]`` (``p_v = 0``, ``p_g = p``,
``p_prev = 0``); nets ``[net, (_global_model_param_updates_net, 1)]``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.net import Net
from dpgraph.parallel import grouping, memory, multihost, replicate
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.allreduce import allreduce_single_host, broadcast
from dpgraph.parallel.buckets import reduce_in_buckets
from dpgraph.parallel.config import ParallelConfig
from dpgraph.parallel.passes import Pass, parallel_pass, run_passes
from dpgraph.parallel.state import ParallelState, start_attributes
from dpgraph.parallel.validate import validate_call

log = logging.getLogger("dpgraph.parallel")


def _v(param: Any) -> str:
    return f"{param}_v"


def _g(param: Any) -> str:
    return f"{param}_g"


def _prev(param: Any) -> str:
    return f"{param}_prev"


@dataclasses.dataclass(frozen=True)
class BmufOptions:
    """The BMUF-only arguments of ``Parallelize_BMUF``."""

    block_learning_rate: float
    block_momentum: float
    master_device: int
    nesterov: bool
    reset_momentum_sgd: bool
    warmup_iterations: int | None
    add_blobs_to_sync: tuple[str, ...]


@dataclasses.dataclass
class BmufState(ParallelState):
    """The Parallelize state plus BMUF's options and nets."""

    options: BmufOptions | None = None
    global_init_net: Net | None = None
    update_net: Net | None = None

    @property
    def opts(self) -> BmufOptions:
        assert self.options is not None
        return self.options

    def master_first(self) -> ParallelState:
        """A view whose device order starts with the master device (reductions land on and
        broadcasts leave from the first device), sharing the grouped blobs' entries."""
        master = self.opts.master_device
        devices = (master,) + tuple(d for d in self.devices if d != master)
        view = ParallelState(model=self.model,
                             config=dataclasses.replace(self.config, devices=devices))
        view.grouped = OrderedDict(
            (name, {d: group[d] for d in devices if d in group})
            for name, group in self.grouped.items())
        view.blob_to_device = self.blob_to_device
        view.param_names = self.param_names
        view.broadcast_context = self.broadcast_context
        return view

    def adopt(self, view: ParallelState) -> None:
        """Keep what a pass made on a view (the multi-host broadcast context)."""
        self.broadcast_context = view.broadcast_context


def _allreduce(view: ParallelState, names: Sequence[str], net: Net) -> None:
    reducer = multihost.allreduce if view.config.is_multi_host else allreduce_single_host
    if view.config.gradient_bucket_mb is None:
        reducer(view, list(names), net)
    else:  # the params, in buckets (one collective per bucket)
        reduce_in_buckets(view, list(names), net, reducer, view.config.gradient_bucket_mb)


def _broadcast(view: ParallelState, init_net: Net | None, net: Net,
               names: Iterable[str], max_ops: int) -> None:
    ordered = sorted(names)
    if view.config.is_multi_host:
        multihost.sync_params(view, init_net, net, ordered, max_ops)
        return
    for name in ordered:
        broadcast(view, net, name)


def _check_params_initialised(state: ParallelState) -> None:
    init_outputs = {o for op in state.model.param_init_net.Proto().op for o in op.output}
    missing = sorted(name for name, group in state.grouped.items()
                     if any(str(b) not in init_outputs for b in group.values()))
    if missing:
        raise ParallelizeError(
            f"Some params not instantiated in param init net: {missing}; create every param "
            "with an init op in model.param_init_net inside the device scope."
        )


def _global_init_net(view: ParallelState, options: BmufOptions) -> Net:
    net = Net("global_model_init")
    option = device_option(view.config.device_type, options.master_device)
    for name in view.param_names:
        param = view.grouped[name][options.master_device]
        ops = [make_op("ConstantFill", [param], [_v(param)], option, value=0.0),
               make_op("Copy", [param], [_g(param)], option)]
        if options.nesterov:
            ops.append(make_op("ConstantFill", [param], [_prev(param)], option, value=0.0))
        emit(net, *ops)
    return net


def _update_ops(param: str, options: BmufOptions, num_devices: int, option: Any) -> list[Any]:
    v, g, prev = _v(param), _g(param), _prev(param)
    momentum = options.block_momentum
    ops = [make_op("Scale", [param], [param], option, scale=1.0 / num_devices),
           make_op("Sub", [param, g], [param], option),
           make_op("Scale", [param], [param], option, scale=options.block_learning_rate),
           make_op("Scale", [v], [v], option, scale=momentum),
           make_op("Add", [v, param], [v], option),
           make_op("Add", [g, v], [g], option)]
    if options.nesterov:
        ops += [make_op("Sub", [v, prev], [prev], option),
                make_op("Scale", [prev], [prev], option, scale=momentum),
                make_op("Sub", [g, prev], [g], option),
                make_op("Copy", [v], [prev], option)]
    ops.append(make_op("Copy", [g], [param], option))
    return ops


def _global_update_net(view: ParallelState, options: BmufOptions, num_devices: int) -> Net:
    net = Net("global_model")
    _allreduce(view, view.param_names, net)
    option = device_option(view.config.device_type, options.master_device)
    for name in view.param_names:
        param = str(view.grouped[name][options.master_device])
        emit(net, *_update_ops(param, options, num_devices, option))
    _broadcast(view, view.model.param_init_net, net, view.param_names, 1)
    return net


def _sync_extra_blobs(state: BmufState, view: ParallelState, net: Net,
                      blobs: Sequence[str]) -> None:
    prefix = view.config.device_prefix
    for b in blobs:
        if b.startswith(prefix):
            raise ParallelizeError(f"add_blobs_to_sync takes unprefixed names; got {b}.")
        group = {d: BlobReference(f"{prefix}_{d}/{b}") for d in view.devices}
        view.grouped[b] = group
        state.grouped[b] = group
    _broadcast(view, None, net, blobs, 1)


def _reset_momentum(model: Any, net: Net) -> None:
    for op in list(model.net.Proto().op):
        if op.type == "MomentumSGDUpdate":
            momentum = op.input[1]
            emit(net, make_op("ConstantFill", [momentum], [momentum], op.device_option,
                              value=0.0))


def _warmup_net(view: ParallelState, options: BmufOptions) -> Net:
    net = Net("warmup-broadcast")
    net.Proto().type = view.config.net_type
    net.Proto().num_workers = view.config.num_workers
    _broadcast(view, view.model.param_init_net, net, view.param_names,
               view.config.effective_max_concurrent_ops)
    option = device_option(view.config.device_type, options.master_device)
    for name in view.param_names:
        param = view.grouped[name][options.master_device]
        emit(net, make_op("Copy", [param], [_g(param)], option))
    return net


# --- the passes ---------------------------------------------------------------------------------
@parallel_pass(reads=("config",), writes=("model_attrs", "net"))
def _start(state: ParallelState) -> None:
    state.model_attrs.update(start_attributes(state))
    proto = state.model.net.Proto()
    proto.type, proto.num_workers = state.config.net_type, state.config.num_workers


@parallel_pass(reads=("model", "non_datapar_params"), writes=("grouped", "param_names"))
def _group_params(state: ParallelState) -> None:
    grouping.validate_params(state.model.params)
    state.grouped = grouping.group_by_device(state, state.model.params,
                                             state.non_datapar_params)
    state.param_names = list(state.grouped)


@parallel_pass(reads=("losses_by_device",), writes=("net", "model"))
def _add_gradients(state: ParallelState) -> None:
    replicate.add_gradients(state)


@parallel_pass(reads=("net", "losses_by_device", "model"), writes=("net",),
               enabled=lambda config: config.optimize_gradient_memory)
def _optimize_gradient_memory(state: ParallelState) -> None:
    memory.optimize_gradient_memory(state)


@parallel_pass(reads=("config.param_update_builder_fun",),
               writes=("net", "param_init_net", "model"), user_code=True)
def _local_updates(state: ParallelState) -> None:
    assert state.config.param_update_builder_fun is not None  # checked by parallelize_bmuf
    replicate.per_device(state, state.config.param_update_builder_fun)


@parallel_pass(reads=("net", "param_init_net", "grouped"), writes=("blob_to_device",))
def _infer_devices(state: ParallelState) -> None:
    grouping.infer_blob_device(state)
    _check_params_initialised(state)


@parallel_pass(reads=("grouped", "param_names", "blob_to_device"),
               writes=("param_init_net", "broadcast_context"))
def _initial_broadcast(state: BmufState) -> None:
    view = state.master_first()
    init_net = state.model.param_init_net
    _broadcast(view, init_net, init_net, view.param_names, 1)
    state.adopt(view)


@parallel_pass(reads=("grouped", "param_names", "blob_to_device"),
               writes=("global_init_net", "update_net", "param_init_net", "broadcast_context"))
def _global_model_nets(state: BmufState) -> None:
    view = state.master_first()
    num_devices = len(state.config.devices) * state.config.num_shards
    state.global_init_net = _global_init_net(view, state.opts)
    state.update_net = _global_update_net(view, state.opts, num_devices)
    state.adopt(view)


@parallel_pass(reads=("update_net",), writes=("update_net", "grouped", "broadcast_context"))
def _add_blobs_to_sync(state: BmufState) -> None:
    if state.opts.add_blobs_to_sync:
        assert state.update_net is not None
        view = state.master_first()
        _sync_extra_blobs(state, view, state.update_net, state.opts.add_blobs_to_sync)
        state.adopt(view)


@parallel_pass(reads=("net", "update_net"), writes=("update_net",))
def _reset_momentum_sgd(state: BmufState) -> None:
    if state.opts.reset_momentum_sgd:
        assert state.update_net is not None
        _reset_momentum(state.model, state.update_net)


@parallel_pass(reads=("grouped", "param_names"),
               writes=("model_attrs", "param_init_net", "broadcast_context"))
def _warmup(state: BmufState) -> None:
    if state.opts.warmup_iterations is not None:
        view = state.master_first()
        state.model_attrs.update(_warmup_iterations=state.opts.warmup_iterations,
                                 _warmup_broadcast=_warmup_net(view, state.opts))
        state.adopt(view)


@parallel_pass(reads=("global_init_net", "update_net"),
               writes=("model_attrs", "init_nets", "nets", "finished"))
def _finish(state: BmufState) -> None:
    model = state.model
    state.model_attrs.update(_global_model_init_net=state.global_init_net,
                             _global_model_param_updates_net=state.update_net,
                             _bmuf_master_device=state.opts.master_device)
    state.init_nets = [model.param_init_net, state.global_init_net]
    state.nets = [model.net, (state.update_net, 1)]
    state.finished = True


@parallel_pass(reads=("config.rendezvous",), writes=("init_nets", "nets", "model_attrs"),
               enabled=lambda config: config.is_multi_host)
def _barrier(state: ParallelState) -> None:
    multihost.add_barrier(state, state.config.barrier_net_timeout_sec)


#: The Parallelize_BMUF pipeline, in order.
BMUF_PASSES: tuple[Pass, ...] = (
    _start, replicate.replicate, _group_params, _add_gradients, _optimize_gradient_memory,
    _local_updates, _infer_devices, _initial_broadcast, _global_model_nets,
    _add_blobs_to_sync, _reset_momentum_sgd, _warmup, _finish, _barrier,
)


def bmuf_options(config: ParallelConfig, block_learning_rate: float = 1.0,
                 block_momentum: float | None = None, master_device: int | None = None,
                 nesterov: bool = False, reset_momentum_sgd: bool = False,
                 warmup_iterations: int | None = None,
                 add_blobs_to_sync: Iterable[Any] | None = None) -> BmufOptions:
    """The BMUF-only arguments, validated (``block_momentum`` defaults to
    ``1 - 1/num_devices``, devices times hosts, and ``master_device`` to the first device)."""
    return _options(config, block_learning_rate, block_momentum, master_device, nesterov,
                    reset_momentum_sgd, warmup_iterations, add_blobs_to_sync)


def parallelize_bmuf(model: Any, config: ParallelConfig, **options: Any) -> BmufState:
    """Run the BMUF pipeline (``options``: the arguments of :func:`bmuf_options`); on any
    error the model is left unchanged."""
    if config.param_update_builder_fun is None:
        raise ParallelizeError("Parallelize_BMUF needs param_update_fn (the local update "
                               "each device runs).")
    validate_call(model, config)
    state = BmufState(model=model, config=config, options=bmuf_options(config, **options))
    run_passes(model, config, BMUF_PASSES, state=state, validate=None)
    return state


def _options(config: ParallelConfig, block_learning_rate: float,
             block_momentum: float | None, master_device: int | None, nesterov: bool,
             reset_momentum_sgd: bool, warmup_iterations: int | None,
             add_blobs_to_sync: Iterable[Any] | None) -> BmufOptions:
    num_devices = len(config.devices) * config.num_shards
    master = config.devices[0] if master_device is None else int(master_device)
    if master not in config.devices:
        raise ParallelizeError(f"master_device {master} is not one of the devices "
                               f"{list(config.devices)}.")
    if warmup_iterations is not None and int(warmup_iterations) < 0:
        raise ParallelizeError(f"warmup_iterations must be >= 0, got {warmup_iterations}.")
    return BmufOptions(
        block_learning_rate=float(block_learning_rate),
        block_momentum=(1.0 - 1.0 / num_devices if block_momentum is None
                        else float(block_momentum)),
        master_device=master, nesterov=bool(nesterov),
        reset_momentum_sgd=bool(reset_momentum_sgd),
        warmup_iterations=None if warmup_iterations is None else int(warmup_iterations),
        add_blobs_to_sync=tuple(str(b) for b in add_blobs_to_sync or ()),
    )
