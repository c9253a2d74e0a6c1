"""Replication: run the builders once per device, then add the loss gradients."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir import scope
from dpgraph.ir.blob import BlobReference
from dpgraph.parallel._emit import device_option
from dpgraph.parallel.passes import parallel_pass
from dpgraph.parallel.state import ParallelState

log = logging.getLogger("dpgraph.parallel")


@contextlib.contextmanager
def device_scopes(state: ParallelState, device: int) -> Iterator[None]:
    """DeviceScope(type, device) and NameScope("<prefix>_<device>"), as Caffe2 nests them."""
    option = device_option(state.config.device_type, device)
    with scope.DeviceScope(option), scope.NameScope(state.namescope(device)):
        yield


def per_device(state: ParallelState, fun: Callable[[Any], Any]) -> None:
    """Call ``fun(model)`` inside each device's scopes."""
    for device in state.devices:
        with device_scopes(state, device):
            fun(state.model)


def _check_losses(losses: Any, device: int) -> None:
    if not isinstance(losses, list):
        raise ParallelizeError(
            f"Model builder function must return list of loss blobs; on device {device} it "
            f"returned {type(losses).__name__} {losses!r}."
        )
    for loss in losses:
        if not isinstance(loss, BlobReference):
            raise ParallelizeError(
                f"Model builder func must return list of loss blobs; on device {device} the "
                f"list holds {type(loss).__name__} {loss!r} (return BlobReferences)."
            )


@parallel_pass(reads=("config.input_builder_fun", "config.forward_pass_builder_fun"),
               writes=("losses_by_device", "non_datapar_params", "net", "param_init_net",
                       "model"),
               user_code=True)
def replicate(state: ParallelState) -> None:
    """Input and forward builders per device; losses collected by device."""
    config, model = state.config, state.model
    state.non_datapar_params = list(model.params)
    for device in config.devices:
        with device_scopes(state, device):
            log.info("Model for %s : %s", config.device_name, device)
            assert config.input_builder_fun and config.forward_pass_builder_fun  # validated
            config.input_builder_fun(model)
            losses = config.forward_pass_builder_fun(model, config.loss_scale)
            if config.has_parameter_updates:
                _check_losses(losses, device)
            state.losses_by_device[device] = losses


def add_gradients(state: ParallelState) -> None:
    """``ConstantFill(loss, loss+"_grad", value=1.0)`` per loss (device scope only), then
    one ``model.AddGradientOperators`` over every loss."""
    model = state.model
    loss_grad: dict[str, str] = {}
    for device in state.devices:
        option = device_option(state.config.device_type, device)
        with scope.DeviceScope(option), scope.EmptyNameScope():
            for loss in state.losses_by_device[device]:
                grad = model.net.ConstantFill(loss, str(loss) + "_grad", value=1.0)
                loss_grad[str(loss)] = str(grad)
    model.AddGradientOperators(loss_grad)
