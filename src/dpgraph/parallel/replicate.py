"""Replication: the input and forward builders per device (with :data:`CLONE_BUILDERS`, the
first two devices run them and the rest are cloned when the second device's build is the
first's renamed; see :mod:`dpgraph.parallel.clone`), then the loss gradients and the
backward pass (cloned from the first device's; see :mod:`dpgraph.parallel.clone_gradients`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from dpgraph.errors import ParallelizeError
from dpgraph.ir import scope
from dpgraph.ir.blob import BlobReference
from dpgraph.parallel import clone
from dpgraph.parallel._emit import device_option
from dpgraph.parallel.clone_gradients import add_gradients_by_cloning
from dpgraph.parallel.passes import parallel_pass
from dpgraph.parallel.state import ParallelState

log = logging.getLogger("dpgraph.parallel")

#: Devices from which on Parallelize clones: the backward pass of the first device is
#: renamed for the others (from two devices on); builders, when :data:`CLONE_BUILDERS`
#: allows it, are cloned from three devices on (the first two are always built, the second
#: to check the first's recording).
CLONE_MIN_DEVICES = 2

#: Whether the input and forward builders may be called for the first two devices only,
#: the others being renamed copies (checked against the second device's real build).
#: Off by default: Caffe2 calls the builders once per device, and a builder's side effects
#: outside the model (counters, lists, files) cannot be seen.  Turn it on when the builders
#: are pure functions of (model, scopes) to make Parallelize of many devices faster; the
#: backward pass is cloned either way.
CLONE_BUILDERS = False


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
    if not losses:
        raise ParallelizeError(
            f"forward_pass_builder_fun returned no losses on device {device}; return the list "
            "of loss BlobReferences to minimise, e.g. [loss] (Parallelize needs at least one "
            "to seed the gradients)."
        )
    for loss in losses:
        if not isinstance(loss, BlobReference):
            raise ParallelizeError(
                f"Model builder func must return list of loss blobs; on device {device} the "
                f"list holds {type(loss).__name__} {loss!r} (return BlobReferences)."
            )


def _build(state: ParallelState, device: int) -> Any:
    """Run the input and forward builders in ``device``'s scopes; returns the losses."""
    config, model = state.config, state.model
    with device_scopes(state, device):
        assert config.input_builder_fun and config.forward_pass_builder_fun  # validated
        config.input_builder_fun(model)
        losses = config.forward_pass_builder_fun(model, config.loss_scale)
    if config.has_parameter_updates:
        _check_losses(losses, device)
    return losses


def _renamer(state: ParallelState, device: int) -> clone.Renamer:
    config = state.config
    return clone.Renamer(config.device_prefix, config.devices[0], device, config.device_type)


def _recorded_build(state: ParallelState, device: int) -> tuple[Any, clone.Additions | None]:
    """Build ``device`` while recording what its builders add (``None``: not replayable)."""
    mark = clone.watch(state.model)
    losses = _build(state, device)
    return losses, clone.additions(state.model, mark, losses)


@parallel_pass(reads=("config.input_builder_fun", "config.forward_pass_builder_fun"),
               writes=("losses_by_device", "non_datapar_params", "net", "param_init_net",
                       "model"),
               user_code=True)
def replicate(state: ParallelState) -> None:
    """Input and forward builders per device; losses collected by device.

    With more than two devices, the builders run for the first two; when the second
    device's ops, external blobs, params and losses are exactly the first's renamed, the
    other devices are copies of the first renamed through a blob-name map (no builder
    calls); otherwise every device's builders run, as in Caffe2.  Builders that change
    other model attributes or the workspace, register Python ops or build nested nets are
    always run per device.  A builder whose graph differs on a later device only (say, an
    extra op on device 2 but not on devices 0 and 1) must not rely on cloning: Caffe2's
    data parallelism assumes one graph per device up to renaming.
    """
    config, model = state.config, state.model
    state.non_datapar_params = list(model.params)
    devices = config.devices
    template: clone.Additions | None = None
    for index, device in enumerate(devices):
        log.info("Model for %s : %s", config.device_name, device)
        if template is not None and index >= 2:
            state.losses_by_device[device] = clone.apply(model, template,
                                                         _renamer(state, device))
        elif CLONE_BUILDERS and len(devices) >= max(CLONE_MIN_DEVICES, 3) and index == 0:
            losses, first = _recorded_build(state, device)
            state.losses_by_device[device] = losses
            template = first if clone.replayable(first) else None
        elif template is not None and index == 1:
            losses, second = _recorded_build(state, device)
            state.losses_by_device[device] = losses
            expected = clone.clone_for(template, _renamer(state, device))
            if second is None or not clone.same(expected, second):
                log.debug("Device %s's build differs from the first's renamed: building "
                          "every device", device)
                template = None
        else:
            state.losses_by_device[device] = _build(state, device)


def add_gradients(state: ParallelState) -> None:
    """``ConstantFill(loss, loss+"_grad", value=1.0)`` per loss (device scope only), then
    one ``model.AddGradientOperators`` over every loss (with several devices, the first
    device's backward pass and renamed copies of it for the others, when the devices'
    blocks are independent and each is the first's renamed; see
    :mod:`dpgraph.parallel.clone_gradients`)."""
    model = state.model
    forward_ops = len(model.net.proto_for_reading().op)
    loss_grad: dict[str, str] = {}
    for device in state.devices:
        option = device_option(state.config.device_type, device)
        with scope.DeviceScope(option), scope.EmptyNameScope():
            for loss in state.losses_by_device[device]:
                grad = model.net.ConstantFill(loss, str(loss) + "_grad", value=1.0)
                loss_grad[str(loss)] = str(grad)
    if len(state.devices) < CLONE_MIN_DEVICES or not add_gradients_by_cloning(
            state, forward_ops, loss_grad):
        model.AddGradientOperators(loss_grad)
