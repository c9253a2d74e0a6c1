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
from dpgraph.parallel import distributed, grouping, replicate
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.allreduce import allreduce_single_host, broadcast
from dpgraph.parallel.config import ParallelConfig, make_config
from dpgraph.parallel.state import ParallelState, publish, publish_start
from dpgraph.parallel.transaction import take_snapshot
from dpgraph.parallel.validate import validate_call

log = logging.getLogger("dpgraph.parallel")

Builder = Any


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


def _master_first(state: ParallelState, master: int) -> ParallelState:
    """A view of ``state`` whose device order starts with ``master`` (reductions land on
    and broadcasts leave from the first device), sharing the grouped blobs."""
    devices = (master,) + tuple(d for d in state.devices if d != master)
    config = dataclasses.replace(state.config, devices=devices)
    view = ParallelState(model=state.model, config=config)
    view.grouped = OrderedDict(
        (name, {d: group[d] for d in devices if d in group})
        for name, group in state.grouped.items())
    view.blob_to_device = state.blob_to_device
    view.param_names = state.param_names
    return view


def _is_multi_host(config: ParallelConfig) -> bool:
    return config.rendezvous is not None and config.rendezvous.is_multi_host


def _allreduce(view: ParallelState, names: Sequence[str], net: Net) -> None:
    if _is_multi_host(view.config):
        distributed.get_distributed_hooks(view.config).allreduce(view, list(names), net)
    else:
        allreduce_single_host(view, list(names), net)


def _broadcast(view: ParallelState, init_net: Net | None, net: Net,
               names: Iterable[str], max_ops: int) -> None:
    ordered = sorted(names)
    if _is_multi_host(view.config):
        distributed.get_distributed_hooks(view.config).sync_params(view, init_net, net,
                                                                  ordered, max_ops)
        return
    for name in ordered:
        broadcast(view, net, name)


def _build_replicas(state: ParallelState, param_update_fn: Builder) -> None:
    """Input, forward, backward and local updates per device; params grouped."""
    model = state.model
    replicate.replicate(state)
    grouping.validate_params(model.params)
    state.grouped = grouping.group_by_device(state, model.params, state.non_datapar_params)
    state.param_names = list(state.grouped)
    publish(state)
    replicate.add_gradients(state)
    if state.config.optimize_gradient_memory:
        from dpgraph.parallel.memory import get_memory_hooks

        hooks = get_memory_hooks()
        if hooks is not None:
            hooks.optimize_gradient_memory(state)
    publish(state)
    replicate.per_device(state, param_update_fn)
    grouping.infer_blob_device(state)
    _check_params_initialised(state)


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


def _sync_extra_blobs(view: ParallelState, net: Net, blobs: Sequence[str]) -> None:
    prefix = view.config.device_prefix
    for b in blobs:
        if b.startswith(prefix):
            raise ParallelizeError(f"add_blobs_to_sync takes unprefixed names; got {b}.")
        group = {d: BlobReference(f"{prefix}_{d}/{b}") for d in view.devices}
        view.grouped[b] = group
        view.model._device_grouped_blobs[b] = group
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


def _run(state: ParallelState, param_update_fn: Builder, options: BmufOptions) -> None:
    config, model = state.config, state.model
    publish_start(state)
    proto = model.net.Proto()
    proto.type, proto.num_workers = config.net_type, config.num_workers
    _build_replicas(state, param_update_fn)
    view = _master_first(state, options.master_device)
    _broadcast(view, model.param_init_net, model.param_init_net, view.param_names, 1)
    num_devices = len(config.devices) * config.num_shards
    init_net = _global_init_net(view, options)
    update_net = _global_update_net(view, options, num_devices)
    publish(state)
    if options.add_blobs_to_sync:
        _sync_extra_blobs(view, update_net, options.add_blobs_to_sync)
    if options.reset_momentum_sgd:
        _reset_momentum(model, update_net)
    if options.warmup_iterations is not None:
        model._warmup_iterations = options.warmup_iterations
        model._warmup_broadcast = _warmup_net(view, options)
    model._global_model_init_net = init_net
    model._global_model_param_updates_net = update_net
    model._bmuf_master_device = options.master_device
    state.init_nets = [model.param_init_net, init_net]
    state.nets = [model.net, (update_net, 1)]
    state.finished = True
    if _is_multi_host(config):
        distributed.get_distributed_hooks(config).add_barrier(
            state, config.barrier_net_timeout_sec)


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


def Parallelize_BMUF(
    model: Any,
    input_fn: Builder,
    forward_fn: Builder,
    param_update_fn: Builder,
    block_learning_rate: float = 1.0,
    block_momentum: float | None = None,
    devices: Iterable[int] | None = None,
    rendezvous: Any = None,
    net_type: str = "dag",
    master_device: int | None = None,
    use_nccl: bool = False,
    nesterov: bool = False,
    optimize_gradient_memory: bool = False,
    reset_momentum_sgd: bool = False,
    warmup_iterations: int | None = None,
    max_concurrent_distributed_ops: int = 4,
    add_blobs_to_sync: Iterable[Any] | None = None,
    num_threads_per_device: int = 4,
    cpu_device: bool = False,
    barrier_net_timeout_sec: float = 300,
) -> None:
    """Replicate ``model`` over ``devices`` for BMUF training (see the module docstring).

    ``block_momentum`` defaults to ``1 - 1/num_devices`` (devices times hosts) and
    ``master_device`` to the first device.  A rendezvous with ``num_shards > 1`` needs the
    multi-host collectives (else :class:`~dpgraph.errors.NotSupportedError` before the
    model is touched).  On any error the model is left unchanged.
    """
    if param_update_fn is None:
        raise ParallelizeError("Parallelize_BMUF needs param_update_fn (the local update "
                               "each device runs).")
    config = make_config(
        devices=devices, input_builder_fun=input_fn, forward_pass_builder_fun=forward_fn,
        param_update_builder_fun=param_update_fn, rendezvous=rendezvous, net_type=net_type,
        use_nccl=use_nccl, optimize_gradient_memory=optimize_gradient_memory,
        max_concurrent_distributed_ops=max_concurrent_distributed_ops,
        num_threads_per_device=num_threads_per_device, cpu_device=cpu_device,
        barrier_net_timeout_sec=barrier_net_timeout_sec,
    )
    validate_call(model, config)
    options = _options(config, block_learning_rate, block_momentum, master_device, nesterov,
                       reset_momentum_sgd, warmup_iterations, add_blobs_to_sync)
    snapshot = take_snapshot(model)
    state = ParallelState(model=model, config=config)
    try:
        _run(state, param_update_fn, options)
        publish(state)
    except BaseException:
        snapshot.restore()
        raise


def Parallelize_GPU_BMUF(*args: Any, **kwargs: Any) -> None:
    """``Parallelize_BMUF`` on GPUs."""
    kwargs["cpu_device"] = False
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_CPU_BMUF(*args: Any, **kwargs: Any) -> None:
    """``Parallelize_BMUF`` on CPU devices."""
    kwargs["cpu_device"] = True
    Parallelize_BMUF(*args, **kwargs)
