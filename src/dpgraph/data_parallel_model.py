"""Caffe2's ``data_parallel_model``: Parallelize and its helpers, under Caffe2's names.

A thin facade: the legacy keyword arguments become one frozen
:class:`~dpgraph.parallel.config.ParallelConfig`, and :mod:`dpgraph.parallel` does the work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

# Caffe2's module globals: scripts and tests reach them through this module, e.g.
# ``mock.patch("...data_parallel_model.workspace.GetGpuPeerAccessPattern")``.
from dpgraph import core as core
from dpgraph import dyndep as dyndep
from dpgraph import model_helper as model_helper
from dpgraph import scope as scope
from dpgraph import utils as utils
from dpgraph import workspace as workspace
from dpgraph.memory.dpm import OptimizeGradientMemory
from dpgraph.parallel.bmuf import Parallelize_BMUF, Parallelize_CPU_BMUF, Parallelize_GPU_BMUF
from dpgraph.parallel.collectives_control import CollectivesConcurrencyControl
from dpgraph.parallel.config import make_config
from dpgraph.parallel.grouping import stripBlobName
from dpgraph.parallel.lifecycle import (
    AddBlobSync,
    AddDistributedBlobSync,
    CreateNet,
    FinalizeAfterCheckpoint,
    GetCheckpointParams,
    RunInitNet,
    RunNet,
    RunWarmup,
)
from dpgraph.parallel.lifecycle import Synchronize as _synchronize
from dpgraph.parallel.multihost import AllCompareBlobs
from dpgraph.parallel.pipeline import parallelize
from dpgraph.parallel.predictor import (
    ConvertNetForDevice,
    ExtractPredictorNet,
    GetLearningRateBlobNames,
)
from dpgraph.parallel.validate import check_device_scope
from dpgraph.proto import caffe2_pb2 as caffe2_pb2

log = logging.getLogger("data_parallel_model")

_DEFAULT_TIMEOUT_SEC = 30
_DEFAULT_BARRIER_NET_TIMEOUT_SEC = 300

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
) -> None:
    """Replicate a model over ``devices`` and add synchronous-SGD gradient all-reduce.

    Each device gets ``input_builder_fun(model)`` and
    ``forward_pass_builder_fun(model, loss_scale)`` under ``DeviceScope`` and
    ``NameScope("<prefix>_<id>")``; gradients are summed across devices (reverse param
    order), then ``param_update_builder_fun`` runs per device (or
    ``optimizer_builder_fun`` once).  If anything raises, the model is left unchanged.
    """
    check_device_scope()  # first, as in Caffe2 (before devices are resolved)
    config = make_config(
        devices=devices, input_builder_fun=input_builder_fun,
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
    )
    parallelize(model_helper_obj, config)


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


def Synchronize(model: Any, timeout_sec: float = _DEFAULT_BARRIER_NET_TIMEOUT_SEC) -> None:
    """Deprecated explicit barrier across hosts (warns; a no-op on one host)."""
    _synchronize(model, timeout_sec)


__all__ = [
    "AddBlobSync", "AddDistributedBlobSync", "AllCompareBlobs", "CollectivesConcurrencyControl",
    "ConvertNetForDevice", "CreateNet", "ExtractPredictorNet", "FinalizeAfterCheckpoint",
    "GetCheckpointParams", "GetLearningRateBlobNames", "OptimizeGradientMemory",
    "Parallelize", "Parallelize_BMUF", "Parallelize_CPU", "Parallelize_CPU_BMUF",
    "Parallelize_GPU", "Parallelize_GPU_BMUF", "Parallelize_iDeep", "RunInitNet", "RunNet",
    "RunWarmup", "Synchronize", "_DEFAULT_BARRIER_NET_TIMEOUT_SEC", "_DEFAULT_TIMEOUT_SEC",
    "stripBlobName",
]
