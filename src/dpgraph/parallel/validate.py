"""Up-front validation of a Parallelize call (nothing is mutated before it passes)."""

from __future__ import annotations

import logging
import os
from typing import Any

from dpgraph.errors import MissingGpuError, NotSupportedError, ParallelizeError
from dpgraph.ir import scope
from dpgraph.ir.device import IsGPUDeviceType, device_name
from dpgraph.parallel.config import ParallelConfig, check_supported
from dpgraph.proto import caffe2_pb2

log = logging.getLogger("dpgraph.parallel")


def check_device_scope() -> None:
    """Caffe2's first assertion: no device scope, or a CPU one, may be active."""
    current = scope.CurrentDeviceScope()
    if current is not None and current.device_type != caffe2_pb2.PROTO_CPU:
        raise ParallelizeError(
            f"Parallelize must be called without device-scope, device scope was: "
            f"{device_name(current)}; call it outside `with core.DeviceScope(...)`."
        )


def validate_call(model: Any, config: ParallelConfig) -> None:
    """Device scope, builder exclusivity, model type and unsupported features."""
    check_device_scope()
    for attr in ("net", "param_init_net", "params", "AddGradientOperators"):
        if not hasattr(model, attr):
            raise ParallelizeError(
                f"Parallelize needs a model_helper.ModelHelper; {type(model).__name__} has no "
                f"{attr!r}."
            )
    if config.input_builder_fun is None or config.forward_pass_builder_fun is None:
        raise ParallelizeError("Parallelize needs input_builder_fun and "
                               "forward_pass_builder_fun.")
    check_supported(config)
    _warn_gpus(config)
    if not config.has_parameter_updates and getattr(model, "init_params", False):
        log.warning(
            "Parallelize without param_update_builder_fun/optimizer_builder_fun on a model "
            "with init_params=True: running its param_init_net would overwrite parameters "
            "synchronised by the training model; create test models with init_params=False."
        )


#: Set to 1 to only log missing GPUs, as Caffe2 did, instead of raising MissingGpuError.
ENV_ALLOW_MISSING_GPUS = "DPGRAPH_ALLOW_MISSING_GPUS"


def _warn_gpus(config: ParallelConfig) -> None:
    available = config.gpus_available
    if not IsGPUDeviceType(config.device_type) or available is None:
        return
    missing = [d for d in config.devices if d >= available]
    if not missing:
        return
    if os.environ.get(ENV_ALLOW_MISSING_GPUS, "") not in ("", "0"):
        log.warning("** Only %d GPUs available, GPUs %s requested", available, missing)
        return
    raise MissingGpuError(
        f"Parallelize: only {available} GPU(s) available, GPU devices {missing} requested "
        f"(devices={list(config.devices)}); pass devices=range(workspace.NumGpuDevices()), "
        "use Parallelize_CPU / cpu_device=True, enable virtual GPUs with "
        "workspace.SetVirtualGpus(n), or set DPGRAPH_ALLOW_MISSING_GPUS=1 to only log a "
        "warning as Caffe2 did.")


def refuse_bmuf_sharding(shard_optimizer_state: bool) -> None:
    """BMUF keeps a full model and optimizer per device by design: no sharded state."""
    if shard_optimizer_state:
        raise NotSupportedError(
            "Parallelize_BMUF cannot shard the optimizer state (BMUF runs a full local "
            "optimizer on every device between block updates); use "
            "Parallelize(..., shard_optimizer_state=True) for synchronous SGD, or drop "
            "shard_optimizer_state.")
