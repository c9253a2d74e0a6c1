"""Typed, frozen configuration of one ``Parallelize`` call.

The legacy keyword arguments of Caffe2's ``data_parallel_model.Parallelize`` are converted
once, at the facade, into a :class:`ParallelConfig`; every pass reads only that object.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dpgraph.collectives.rendezvous import Rendezvous, as_rendezvous
from dpgraph.errors import NotSupportedError, ParallelizeError
from dpgraph.ir.device import CPU, CUDA, IDEEP

#: Caffe2's ``_DEFAULT_TIMEOUT_SEC``: common worlds (collective contexts) time out after this.
DEFAULT_TIMEOUT_SEC = 30
#: Caffe2's ``_DEFAULT_BARRIER_NET_TIMEOUT_SEC``: the pre-training barrier's timeout.
DEFAULT_BARRIER_NET_TIMEOUT_SEC = 300

BuilderFun = Callable[..., Any] | None


@dataclass(frozen=True)
class ParallelConfig:
    """Everything ``Parallelize`` needs, validated and normalised."""

    devices: tuple[int, ...]
    device_type: int
    device_prefix: str
    input_builder_fun: BuilderFun
    forward_pass_builder_fun: BuilderFun
    param_update_builder_fun: BuilderFun = None
    optimizer_builder_fun: BuilderFun = None
    post_sync_builder_fun: BuilderFun = None
    pre_grad_net_transformer_fun: BuilderFun = None
    net_transformer_fun: BuilderFun = None
    rendezvous: Rendezvous | None = None
    rendezvous_legacy: Any = None
    net_type: str = "dag"
    broadcast_computed_params: bool = True
    optimize_gradient_memory: bool = False
    dynamic_memory_management: bool = False
    blobs_to_keep: tuple[Any, ...] | None = None
    use_nccl: bool = False
    max_concurrent_distributed_ops: int = 16
    cpu_device: bool = False
    ideep: bool = False
    num_threads_per_device: int = 4
    shared_model: bool = False
    combine_spatial_bn: bool = False
    barrier_net_timeout_sec: float = DEFAULT_BARRIER_NET_TIMEOUT_SEC
    #: None: one collective per gradient (Caffe2's graph); MB or "auto": gradient buckets
    gradient_bucket_mb: float | str | None = None
    #: micro-batches per optimizer step (1: every RunNet steps, Caffe2's graph)
    accumulate_steps: int = 1
    #: None: gradients reduced in float32; "float16"/"bfloat16": compressed for the collective
    gradient_dtype: str | None = None
    #: carry each device's quantisation error into its next gradient (with gradient_dtype)
    gradient_error_feedback: bool = False
    #: partition the optimizer state over hosts x devices (ZeRO-1); False: Caffe2's graph
    shard_optimizer_state: bool = False
    # values the facade resolves from the runtime when Parallelize is called
    timeout_sec: float = DEFAULT_TIMEOUT_SEC
    peer_access: tuple[tuple[bool, ...], ...] | None = None
    gpus_available: int | None = None
    verify: bool = False

    @property
    def is_multi_host(self) -> bool:
        return self.rendezvous is not None and self.rendezvous.is_multi_host

    @property
    def num_shards(self) -> int:
        return 1 if self.rendezvous is None else self.rendezvous.num_shards

    @property
    def loss_scale(self) -> float:
        return 1.0 / (len(self.devices) * self.num_shards * self.accumulate_steps)

    @property
    def has_parameter_updates(self) -> bool:
        return (self.param_update_builder_fun is not None
                or self.optimizer_builder_fun is not None)

    @property
    def num_workers(self) -> int:
        extra = 8 if self.rendezvous_legacy is not None else 0
        return len(self.devices) * self.num_threads_per_device + extra

    @property
    def effective_max_concurrent_ops(self) -> int:
        return min(self.max_concurrent_distributed_ops, self.num_workers - 1)

    @property
    def is_gpu(self) -> bool:
        return self.device_type not in (CPU, IDEEP)

    @property
    def device_name(self) -> str:
        names: dict[int, str] = {int(CPU): "CPU", int(IDEEP): "IDEEP"}
        return names.get(int(self.device_type), "GPU")

    def namescope(self, device: int) -> str:
        """``"gpu_3"``: the name scope of ``device`` (without the trailing ``/``)."""
        return f"{self.device_prefix}_{device}"


def _normalise_devices(devices: Iterable[int]) -> tuple[int, ...]:
    try:
        given = list(devices)
    except TypeError as error:
        raise ParallelizeError(
            f"devices must be an iterable of int device ids, got {devices!r}."
        ) from error
    bad = [d for d in given if isinstance(d, bool) or not isinstance(d, numbers.Integral)
           or d < 0]
    if bad:
        raise ParallelizeError(
            f"devices must be non-negative int device ids (e.g. range(4)), got {given!r}; "
            f"invalid: {bad!r}."
        )
    result = tuple(int(d) for d in given)
    if not result:
        raise ParallelizeError("Parallelize needs at least one device; got an empty list.")
    if len(set(result)) != len(result):
        raise ParallelizeError(f"devices contains duplicates: {list(result)}.")
    return result


def make_config(*, devices: Iterable[int], gpu_device_type: int = CUDA,
                **kwargs: Any) -> ParallelConfig:
    """Build a :class:`ParallelConfig` from Caffe2's ``Parallelize`` keyword arguments.

    ``devices`` are explicit (the facade resolves Caffe2's default: every GPU or CPU);
    ``gpu_device_type`` is the runtime's GPU type (``workspace.GpuDeviceType``).
    """
    cpu_device = bool(kwargs.get("cpu_device", False))
    ideep = bool(kwargs.get("ideep", False))
    device_type: int
    if ideep:
        device_type, prefix = int(IDEEP), "ideep"
    elif cpu_device:
        device_type, prefix = int(CPU), "cpu"
    else:
        device_type, prefix = int(gpu_device_type), "gpu"
    normalised = _normalise_devices(devices)
    given = kwargs.pop("rendezvous", None)
    rendezvous = as_rendezvous(given)
    legacy = given
    if rendezvous is not None and not isinstance(given, Mapping):
        legacy = rendezvous.to_legacy()
    keep = kwargs.pop("blobs_to_keep", None)
    peer = kwargs.pop("peer_access", None)
    return ParallelConfig(
        devices=normalised, device_type=device_type, device_prefix=prefix,
        rendezvous=rendezvous, rendezvous_legacy=legacy,
        blobs_to_keep=None if keep is None else tuple(keep),
        peer_access=None if peer is None else tuple(tuple(bool(v) for v in row)
                                                     for row in peer),
        **kwargs,
    )


def check_supported(config: ParallelConfig) -> None:
    """Refuse the features other passes own, before anything is mutated."""
    if config.param_update_builder_fun is not None and config.optimizer_builder_fun is not None:
        raise ParallelizeError(
            "Can only specify one of param_update_builder_fun, optimizer_builder_fun."
        )
    if config.shared_model and config.is_gpu:
        raise ParallelizeError("Shared model only supported on CPU (cpu_device=True).")
    if config.optimize_gradient_memory and config.dynamic_memory_management:
        raise ParallelizeError(
            "It is not advised to use gradient optimization ('memonger') with dynamic "
            "memory management; pick one of optimize_gradient_memory and "
            "dynamic_memory_management."
        )
    if config.combine_spatial_bn and not config.has_parameter_updates:
        raise ParallelizeError("combine_spatial_bn should only be used for train model.")
    check_bucket_mb(config.gradient_bucket_mb)
    check_accumulation(config)
    check_compression(config)
    check_sharding(config)


def check_bucket_mb(value: Any) -> None:
    """``gradient_bucket_mb``: None, a positive size in MB, or ``"auto"``."""
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        raise ParallelizeError(
            f"gradient_bucket_mb must be None (one collective per gradient, as Caffe2), a "
            f"positive size in MB (e.g. 25) or 'auto', got {value!r}.")


def check_accumulation(config: ParallelConfig) -> None:
    """``accumulate_steps``: a positive int; the memory passes cannot see the sync net."""
    steps = config.accumulate_steps
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ParallelizeError(
            f"accumulate_steps must be a positive int (micro-batches per optimizer step, 1 to "
            f"step on every RunNet), got {steps!r}.")
    if steps > 1 and (config.optimize_gradient_memory or config.dynamic_memory_management):
        raise ParallelizeError(
            f"accumulate_steps={steps} keeps gradients alive across RunNet calls; it cannot "
            "be combined with optimize_gradient_memory or dynamic_memory_management. Turn "
            "those off, or use accumulate_steps=1.")
    if steps > 1 and config.shared_model:
        raise ParallelizeError(
            f"accumulate_steps={steps} cannot be combined with shared_model=True (the shared "
            "parameters' remapping does not reach the synchronisation subnet); use one.")
    if steps > 1 and not config.has_parameter_updates:
        raise ParallelizeError(
            f"accumulate_steps={steps} needs a training model (param_update_builder_fun or "
            "optimizer_builder_fun).")


def check_compression(config: ParallelConfig) -> None:
    """``gradient_dtype``: None, "float16" or "bfloat16"; error feedback needs one."""
    if config.gradient_dtype not in (None, "float16", "bfloat16"):
        raise ParallelizeError(
            f"gradient_dtype must be None (float32 gradients, as Caffe2), 'float16' or "
            f"'bfloat16', got {config.gradient_dtype!r}.")
    if not isinstance(config.gradient_error_feedback, bool):
        raise ParallelizeError(
            f"gradient_error_feedback must be a bool, got {config.gradient_error_feedback!r}.")
    if config.gradient_error_feedback and config.gradient_dtype is None:
        raise ParallelizeError(
            "gradient_error_feedback=True needs gradient_dtype='float16' or 'bfloat16' (there "
            "is no quantisation error to carry with float32 gradients).")


def check_sharding(config: ParallelConfig) -> None:
    """``shard_optimizer_state``: a bool; not with a shared model or a non-GLOO engine
    across hosts."""
    flag = config.shard_optimizer_state
    if not isinstance(flag, bool):
        raise ParallelizeError(
            f"shard_optimizer_state must be a bool (True: each rank keeps the optimizer state "
            f"of its share of the parameters), got {flag!r}.")
    if not flag:
        return
    if config.shared_model:
        raise NotSupportedError(
            "shard_optimizer_state=True cannot be combined with shared_model=True (a shared "
            "model keeps one copy of every parameter on the first device already); drop one "
            "of them.")
    if not config.has_parameter_updates:
        raise ParallelizeError(
            "shard_optimizer_state=True needs a training model (optimizer_builder_fun or "
            "param_update_builder_fun).")
    rendezvous = config.rendezvous
    if config.is_multi_host and rendezvous is not None and rendezvous.engine.upper() != "GLOO":
        raise NotSupportedError(
            f"shard_optimizer_state=True across hosts needs engine='GLOO' (its Reduce and "
            f"Broadcast with a root rank span local devices and hosts); the rendezvous uses "
            f"engine={rendezvous.engine!r}. Use GLOO or shard_optimizer_state=False.")
