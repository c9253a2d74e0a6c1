"""The one mutable result object the Parallelize passes fill in.

Passes read the frozen :class:`~dpgraph.parallel.config.ParallelConfig` and write only to
a :class:`ParallelState` (and to the nets they rewrite); :func:`publish` copies the results
onto the model under the attribute names Caffe2 uses (``model._device_grouped_blobs``,
``model._devices``, ...).  The pass driver (:func:`~dpgraph.parallel.passes.run_passes`)
publishes before each pass that calls user code (builders may read them) and once at the
end.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from dpgraph.ir.device import IsGPUDeviceType
from dpgraph.parallel.config import ParallelConfig
from dpgraph.proto import caffe2_pb2


@dataclass
class ParallelState:
    """Results of the Parallelize pipeline for one model."""

    model: Any
    config: ParallelConfig
    non_datapar_params: list[Any] = field(default_factory=list)
    losses_by_device: dict[int, Any] = field(default_factory=dict)
    grouped: OrderedDict[str, dict[int, Any]] = field(default_factory=OrderedDict)
    param_names: list[str] = field(default_factory=list)
    computed_param_names: list[str] = field(default_factory=list)
    grad_names: list[str] = field(default_factory=list)
    blob_to_device: dict[str, caffe2_pb2.DeviceOption] = field(default_factory=dict)
    sync_names: list[str] = field(default_factory=list)
    optimizer: Any = None
    all_params_before_prune: set[str] = field(default_factory=set)
    init_nets: list[Any] = field(default_factory=list)
    nets: list[Any] = field(default_factory=list)
    finished: bool = False
    #: the multi-host broadcast context, reused by later syncs (``model._broadcast_context``)
    broadcast_context: Any = None
    #: accumulate_steps > 1: index of the first main-net op of the synchronisation phase
    accumulate_split: int | None = None
    #: shard_optimizer_state: the owner of each parameter (a shard.ShardPlan)
    shard_plan: Any = None
    #: shard_optimizer_state: (net ops, init ops) before the update builders ran
    update_split: tuple[int, int] | None = None
    #: while a reducer runs: the group (owner rank) of each bucket name it reduces
    reduce_groups: dict[str, Any] = field(default_factory=dict)
    #: further model attributes to publish (``model.<name> = value``), in order
    model_attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> tuple[int, ...]:
        return self.config.devices

    @property
    def master(self) -> int:
        return self.config.devices[0]

    def namescope(self, device: int) -> str:
        return self.config.namescope(device)

    def blob_device_type(self, name: str) -> int:
        """The device type of a full or stripped blob name (a stripped one: its copy on
        the master device); the configured type for a blob no op touches."""
        option = self.blob_to_device.get(name)
        if option is None:
            option = self.blob_to_device.get(f"{self.namescope(self.master)}/{name}")
            if option is None:
                return self.config.device_type
        return option.device_type

    def is_gpu_blob(self, name: str) -> bool:
        """Caffe2's ``_IsGPUBlob``: the device of a full or stripped blob name."""
        return IsGPUDeviceType(self.blob_device_type(name))

    def is_ideep_blob(self, name: str) -> bool:
        return self.blob_device_type(name) == caffe2_pb2.PROTO_IDEEP


def start_attributes(state: ParallelState) -> dict[str, Any]:
    """The attributes Caffe2 sets on the model before any builder runs."""
    model, config = state.model, state.config
    attrs: dict[str, Any] = {
        "_device_type": config.device_type, "_device_prefix": config.device_prefix,
        "_shared_model": config.shared_model, "_devices": list(config.devices),
        "_rendezvous": config.rendezvous_legacy, "_sync_barrier_net": None,
        "_broadcast_context": None, "_grad_names": [],
    }
    if not hasattr(model, "_optimizer"):
        attrs["_optimizer"] = None
    attrs["_net_transformer_fun"] = config.net_transformer_fun
    return attrs


def publish(state: ParallelState) -> None:
    """Copy the current results onto the model (idempotent); the only place the Parallelize
    passes set model attributes."""
    model = state.model
    for name, value in state.model_attrs.items():
        setattr(model, name, value)
    state.model_attrs.clear()
    model._device_grouped_blobs = state.grouped
    model._param_names = list(state.param_names)
    model._computed_param_names = list(state.computed_param_names)
    model._grad_names = list(state.grad_names)
    model._losses_by_gpu = state.losses_by_device
    model._blob_to_device = state.blob_to_device
    if state.broadcast_context is not None:
        model._broadcast_context = state.broadcast_context
    if state.optimizer is not None:
        model._optimizer = state.optimizer
    if state.shard_plan is not None:
        model._shard_plan = state.shard_plan
    if state.finished:
        model._data_parallel_model_init_nets = list(state.init_nets)
        model._data_parallel_model_nets = list(state.nets)
