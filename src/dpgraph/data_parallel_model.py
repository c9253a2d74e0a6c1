"""Caffe2's ``data_parallel_model``: Parallelize and its helpers, under Caffe2's names.

A thin facade: the legacy keyword arguments become one frozen
:class:`~dpgraph.parallel.config.ParallelConfig`, and :mod:`dpgraph.parallel` does the work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

# Caffe2's module globals: scripts and tests reach them through this module, e.g.
# ``mock.patch("...data_parallel_model.workspace.GetGpuPeerAccessPattern")``.
from dpgraph import core as core
from dpgraph import dyndep as dyndep
from dpgraph import model_helper as model_helper
from dpgraph import scope as scope
from dpgraph import utils as utils
from dpgraph import workspace as workspace
from dpgraph.memory.dpm import OptimizeGradientMemory
from dpgraph.parallel import collectives_control as _collectives_control
from dpgraph.parallel.bmuf import parallelize_bmuf
from dpgraph.parallel.config import (
    DEFAULT_BARRIER_NET_TIMEOUT_SEC,
    DEFAULT_TIMEOUT_SEC,
    make_config,
)
from dpgraph.parallel.grouping import stripBlobName
from dpgraph.parallel.lifecycle import (
    AddBlobSync,
    CreateNet,
    FinalizeAfterCheckpoint,
    GetCheckpointParams,
    RunInitNet,
    RunNet,
    RunWarmup,
)
from dpgraph.parallel.lifecycle import AddDistributedBlobSync as _add_distributed_blob_sync
from dpgraph.parallel.lifecycle import Synchronize as _synchronize
from dpgraph.parallel.multihost import AllCompareBlobs
from dpgraph.parallel.pipeline import parallelize
from dpgraph.parallel.predictor import (
    ConvertNetForDevice,
    ExtractPredictorNet,
    GetLearningRateBlobNames,
)
from dpgraph.parallel.validate import check_device_scope, refuse_bmuf_sharding
from dpgraph.proto import caffe2_pb2 as caffe2_pb2

log = logging.getLogger("data_parallel_model")

_DEFAULT_TIMEOUT_SEC = DEFAULT_TIMEOUT_SEC
_DEFAULT_BARRIER_NET_TIMEOUT_SEC = DEFAULT_BARRIER_NET_TIMEOUT_SEC

Builder = Callable[..., Any] | None


def Parallelize(
    model_helper_obj: Any,
    input_builder_fun: Builder,
    forward_pass_builder_fun: Builder,
    param_update_builder_fun: Builder = None,
    optimizer_builder_fun: Builder = None,
    post_sync_builder_fun: Builder = None,
    pre_grad_net_transformer_fun: Builder = None,
    net_transformer_fun: Builder = None,
    devices: Iterable[int] | None = None,
    rendezvous: Any = None,
    net_type: str = "dag",
    broadcast_computed_params: bool = True,
    optimize_gradient_memory: bool = False,
    dynamic_memory_management: bool = False,
    blobs_to_keep: Any = None,
    use_nccl: bool = False,
    max_concurrent_distributed_ops: int = 16,
    cpu_device: bool = False,
    ideep: bool = False,
    num_threads_per_device: int = 4,
    shared_model: bool = False,
    combine_spatial_bn: bool = False,
    barrier_net_timeout_sec: float = _DEFAULT_BARRIER_NET_TIMEOUT_SEC,
    gradient_bucket_mb: float | str | None = None,
    accumulate_steps: int = 1,
    gradient_dtype: str | None = None,
    gradient_error_feedback: bool = False,
    shard_optimizer_state: bool = False,
) -> None:
    """Replicate a model over ``devices`` and add synchronous-SGD gradient all-reduce.

    Each device gets ``input_builder_fun(model)`` and
    ``forward_pass_builder_fun(model, loss_scale)`` under ``DeviceScope`` and
    ``NameScope("<prefix>_<id>")``; gradients are summed across devices (reverse param
    order), then ``param_update_builder_fun`` runs per device (or
    ``optimizer_builder_fun`` once).  If anything raises, the model is left unchanged.

    ``gradient_bucket_mb`` (dpgraph's): ``None`` keeps Caffe2's one collective per gradient;
    a size in MB or ``"auto"`` (from the cost model) packs dense gradients into buckets of
    about that size, one collective each.  ``accumulate_steps=k`` (dpgraph's): each RunNet
    is one micro-batch, gradients accumulate locally and every k-th RunNet synchronises
    them and runs the optimizer once.  ``gradient_dtype`` (dpgraph's): "float16" or
    "bfloat16" casts gradients around the collective, ``gradient_error_feedback`` carries
    the quantisation error to the next step.  ``shard_optimizer_state=True`` (dpgraph's)
    gives every parameter one owner among hosts x devices: its gradient is reduced onto the
    owner, only the owner keeps its optimizer state and runs its update, and the updated
    parameter is sent back to every device (see docs/performance.md).
    """
    check_device_scope()  # first, as in Caffe2 (before devices are resolved)
    config = make_config(
        **_runtime_settings(devices, cpu_device or ideep, use_nccl),
        input_builder_fun=input_builder_fun,
        forward_pass_builder_fun=forward_pass_builder_fun,
        param_update_builder_fun=param_update_builder_fun,
        optimizer_builder_fun=optimizer_builder_fun,
        post_sync_builder_fun=post_sync_builder_fun,
        pre_grad_net_transformer_fun=pre_grad_net_transformer_fun,
        net_transformer_fun=net_transformer_fun, rendezvous=rendezvous, net_type=net_type,
        broadcast_computed_params=broadcast_computed_params,
        optimize_gradient_memory=optimize_gradient_memory,
        dynamic_memory_management=dynamic_memory_management, blobs_to_keep=blobs_to_keep,
        use_nccl=use_nccl, max_concurrent_distributed_ops=max_concurrent_distributed_ops,
        cpu_device=cpu_device, ideep=ideep, num_threads_per_device=num_threads_per_device,
        shared_model=shared_model, combine_spatial_bn=combine_spatial_bn,
        barrier_net_timeout_sec=barrier_net_timeout_sec,
        gradient_bucket_mb=gradient_bucket_mb, accumulate_steps=accumulate_steps,
        gradient_dtype=gradient_dtype, gradient_error_feedback=gradient_error_feedback,
        shard_optimizer_state=shard_optimizer_state,
    )
    parallelize(model_helper_obj, config)


def _runtime_settings(devices: Iterable[int] | None, cpu_like: bool,
                      use_nccl: bool) -> dict[str, Any]:
    """What Parallelize reads from the runtime (and this module's globals) when called:
    the default devices, the GPU type and count, the peer-access pattern (GPU all-reduce
    without NCCL) and the collective timeout."""
    gpus = workspace.NumGpuDevices()
    if devices is None:
        devices = range(os.cpu_count() or 1) if cpu_like else range(gpus)
    peer = None
    if not cpu_like and not use_nccl:
        pattern = np.asarray(workspace.GetGpuPeerAccessPattern())
        peer = pattern if pattern.ndim == 2 else np.zeros((0, 0), dtype=bool)
    return {"devices": devices, "gpu_device_type": int(workspace.GpuDeviceType),
            "gpus_available": gpus, "peer_access": peer, "timeout_sec": _DEFAULT_TIMEOUT_SEC}


def Parallelize_GPU(*args: Any, **kwargs: Any) -> None:
    """``Parallelize`` with its GPU default (a plain pass-through, as in Caffe2)."""
    Parallelize(*args, **kwargs)


def Parallelize_CPU(*args: Any, **kwargs: Any) -> None:
    """``Parallelize`` on CPU devices (``cpu_device=True``)."""
    kwargs["cpu_device"] = True
    Parallelize(*args, **kwargs)


def Parallelize_iDeep(*args: Any, **kwargs: Any) -> None:
    """``Parallelize`` on IDEEP devices (``ideep=True``)."""
    kwargs["ideep"] = True
    Parallelize(*args, **kwargs)


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
    barrier_net_timeout_sec: float = _DEFAULT_BARRIER_NET_TIMEOUT_SEC,
    gradient_bucket_mb: float | str | None = None,
    shard_optimizer_state: bool = False,
) -> None:
    """Replicate ``model`` over ``devices`` for blockwise model-update filtering (see
    :mod:`dpgraph.parallel.bmuf`): local updates per device, and a global model update net.

    ``block_momentum`` defaults to ``1 - 1/num_devices`` (devices times hosts) and
    ``master_device`` to the first device.  On any error the model is left unchanged;
    ``shard_optimizer_state=True`` is refused (BMUF keeps a full optimizer per device).
    """
    refuse_bmuf_sharding(shard_optimizer_state)
    config = make_config(
        **_runtime_settings(devices, cpu_device, use_nccl),
        input_builder_fun=input_fn, forward_pass_builder_fun=forward_fn,
        param_update_builder_fun=param_update_fn, rendezvous=rendezvous, net_type=net_type,
        use_nccl=use_nccl, optimize_gradient_memory=optimize_gradient_memory,
        max_concurrent_distributed_ops=max_concurrent_distributed_ops,
        num_threads_per_device=num_threads_per_device, cpu_device=cpu_device,
        barrier_net_timeout_sec=barrier_net_timeout_sec,
        gradient_bucket_mb=gradient_bucket_mb,
    )
    parallelize_bmuf(model, config, block_learning_rate=block_learning_rate,
                     block_momentum=block_momentum, master_device=master_device,
                     nesterov=nesterov, reset_momentum_sgd=reset_momentum_sgd,
                     warmup_iterations=warmup_iterations, add_blobs_to_sync=add_blobs_to_sync)


def Parallelize_GPU_BMUF(*args: Any, **kwargs: Any) -> None:
    """``Parallelize_BMUF`` on GPUs."""
    kwargs["cpu_device"] = False
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_CPU_BMUF(*args: Any, **kwargs: Any) -> None:
    """``Parallelize_BMUF`` on CPU devices."""
    kwargs["cpu_device"] = True
    Parallelize_BMUF(*args, **kwargs)


def AddDistributedBlobSync(model: Any, blobs: Any) -> None:
    """All-reduce ``blobs`` across hosts (not devices); its common world uses this
    module's ``_DEFAULT_TIMEOUT_SEC``, read now (a no-op on one host)."""
    _add_distributed_blob_sync(model, blobs, timeout_sec=_DEFAULT_TIMEOUT_SEC)


def Synchronize(model: Any, timeout_sec: float = _DEFAULT_BARRIER_NET_TIMEOUT_SEC) -> None:
    """Deprecated explicit barrier across hosts (warns; a no-op on one host)."""
    _synchronize(model, timeout_sec)


class CollectivesConcurrencyControl(_collectives_control.CollectivesConcurrencyControl):
    """Caffe2's class: common worlds made without an explicit timeout use this module's
    ``_DEFAULT_TIMEOUT_SEC``, read when each world is created."""

    def default_timeout_sec(self) -> float:
        return _DEFAULT_TIMEOUT_SEC


__all__ = [
    "AddBlobSync", "AddDistributedBlobSync", "AllCompareBlobs", "CollectivesConcurrencyControl",
    "ConvertNetForDevice", "CreateNet", "ExtractPredictorNet", "FinalizeAfterCheckpoint",
    "GetCheckpointParams", "GetLearningRateBlobNames", "OptimizeGradientMemory",
    "Parallelize", "Parallelize_BMUF", "Parallelize_CPU", "Parallelize_CPU_BMUF",
    "Parallelize_GPU", "Parallelize_GPU_BMUF", "Parallelize_iDeep", "RunInitNet", "RunNet",
    "RunWarmup", "Synchronize", "_DEFAULT_BARRIER_NET_TIMEOUT_SEC", "_DEFAULT_TIMEOUT_SEC",
    "stripBlobName",
]
