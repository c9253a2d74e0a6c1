"""Optimizer builders: attach update ops for every parameter of a model."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelError
from dpgraph.ir import scope
from dpgraph.ir.analysis import InferBlobDevices
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.device import CPU, DeviceOption
from dpgraph.ir.net import shared_creation_stack
from dpgraph.modeling.optimizer.adaptive import (
    AdagradOptimizer,
    AdamOptimizer,
    FtrlOptimizer,
    RmsPropOptimizer,
    YellowFinOptimizer,
)
from dpgraph.modeling.optimizer.base import _LEARNING_RATE_INJECTION, Optimizer
from dpgraph.modeling.optimizer.final import (
    AdadeltaOptimizer,
    DecayAdagradOptimizer,
    GFtrlOptimizer,
    StormOptimizer,
    WngradOptimizer,
)
from dpgraph.modeling.optimizer.sgd import (
    FP16SgdOptimizer,
    MultiPrecisionSgdOptimizer,
    SgdOptimizer,
    WeightDecayBuilder,
)
from dpgraph.modeling.parameter_info import ParameterInfo
from dpgraph.runtime import api


def _get_param_to_device(model: Any) -> dict[str, Any]:
    """Devices of blobs as produced by the ops of net, then param_init_net (which wins)."""
    param_to_device = InferBlobDevices(model.net)
    param_to_device.update(InferBlobDevices(model.param_init_net))
    return param_to_device


def _devices_for(model: Any, params: list[ParameterInfo]) -> dict[str, Any]:
    """:func:`_get_param_to_device` as far as ``params`` need it: when the init net
    produces every param, the net's producers are never looked up (the init net wins),
    so the net is not scanned."""
    init_devices = InferBlobDevices(model.param_init_net)
    if all(str(info.blob) in init_devices for info in params):
        return init_devices
    param_to_device = InferBlobDevices(model.net)
    param_to_device.update(init_devices)
    return param_to_device


def get_param_device(param_name: str, grad: Any, param_to_device: dict[str, Any] | None = None,
                     default_device: Any = None) -> Any:
    """The device of a param: from its producer, else from its gradient's producer."""
    device = default_device
    param_to_device = param_to_device or {}
    if param_name in param_to_device:
        device = param_to_device[param_name]
    elif isinstance(grad, GradientSlice):
        if str(grad.values) in param_to_device:
            device = param_to_device[str(grad.values)]
        elif str(grad.indices) in param_to_device:
            device = param_to_device[str(grad.indices)]
    elif str(grad) in param_to_device:
        device = param_to_device[str(grad)]
    if device is None:
        raise ModelError(f"Cannot infer device for {param_name}: no op creates it")
    return device


def _calc_norm_ratio(model: Any, params: list[ParameterInfo], name_scope: str,
                     param_to_device: dict[str, Any], max_gradient_norm: float) -> Any:
    """``clip_norm / max(global_norm, clip_norm)`` over all gradients, on CPU."""
    with scope.NameScope(name_scope):
        grad_squared_sums = []
        for i, param in enumerate(params):
            device = get_param_device(str(param.blob), param.grad, param_to_device)
            with scope.DeviceScope(device):
                grad = (param.grad.values if isinstance(param.grad, GradientSlice)
                        else param.grad)
                squared_sum = model.net.SumSqrElements(grad, f"grad_{i}_squared_sum")
                grad_squared_sums.append(model.net.EnsureCPUOutput(squared_sum))
        with scope.DeviceScope(DeviceOption(CPU)):
            full_sum = model.net.Sum(grad_squared_sums, "grad_squared_full_sum")
            global_norm = model.net.Pow(full_sum, "global_norm", exponent=0.5)
            clip_norm = model.param_init_net.ConstantFill(
                [], "clip_norm", shape=[], value=float(max_gradient_norm))
            max_norm = model.net.Max([global_norm, clip_norm], "max_norm")
            return model.net.Div([clip_norm, max_norm], "norm_ratio")


def _build(model: Any, optimizer: Optimizer, weights_only: bool = False,
           use_param_info_optim: bool = True, max_gradient_norm: float | None = None,
           allow_lr_injection: bool = False) -> Optimizer:
    """Run ``optimizer`` for every parameter with a gradient, each under its device scope
    (and no name scope); returns the optimizer."""
    model.Validate()
    params = [info for info in model.GetOptimizationParamInfo()
              if not weights_only or info.blob in model.weights]
    param_to_device = _devices_for(model, params)
    lr_multiplier = None
    if max_gradient_norm is not None:
        lr_multiplier = _calc_norm_ratio(model, params, "norm_clipped_grad_update",
                                         param_to_device, max_gradient_norm)
    if allow_lr_injection:
        if not model.net.BlobIsDefined(_LEARNING_RATE_INJECTION):
            lr_injection = model.param_init_net.ConstantFill(
                [], _LEARNING_RATE_INJECTION, shape=[1], value=1.0)
        else:
            lr_injection = _LEARNING_RATE_INJECTION
        if lr_multiplier is None:
            lr_multiplier = lr_injection
        else:
            lr_multiplier = model.net.Mul([lr_multiplier, lr_injection], "lr_multiplier",
                                          broadcast=1)
    optimizer.add_lr_multiplier(lr_multiplier)
    with shared_creation_stack():  # the update ops' stacks share this frame's callers
        for param_info in params:
            device = get_param_device(str(param_info.blob), param_info.grad, param_to_device)
            with scope.DeviceScope(device):
                if param_info.optimizer and use_param_info_optim:
                    param_info.optimizer(model.net, model.param_init_net, param_info)
                else:
                    optimizer(model.net, model.param_init_net, param_info)
    return optimizer


def add_weight_decay(model: Any, weight_decay: float) -> WeightDecayBuilder:
    """``grad += weight_decay * param`` for the model's weights."""
    return _build(model, WeightDecayBuilder(weight_decay=weight_decay), weights_only=True,
                  use_param_info_optim=False)  # type: ignore[return-value]


def build_sgd(model: Any, base_learning_rate: float, max_gradient_norm: float | None = None,
              allow_lr_injection: bool = False, **kwargs: Any) -> SgdOptimizer:
    sgd = SgdOptimizer(base_learning_rate, **kwargs)
    return _build(model, sgd, max_gradient_norm=max_gradient_norm,  # type: ignore[return-value]
                  allow_lr_injection=allow_lr_injection)


def build_multi_precision_sgd(model: Any, base_learning_rate: float,
                              max_gradient_norm: float | None = None,
                              allow_lr_injection: bool = False,
                              **kwargs: Any) -> MultiPrecisionSgdOptimizer:
    sgd = MultiPrecisionSgdOptimizer(base_learning_rate, **kwargs)
    return _build(model, sgd, max_gradient_norm=max_gradient_norm,  # type: ignore[return-value]
                  allow_lr_injection=allow_lr_injection)


def build_fp16_sgd(model: Any, base_learning_rate: float, **kwargs: Any) -> FP16SgdOptimizer:
    return _build(model, FP16SgdOptimizer(base_learning_rate, **kwargs))  # type: ignore


def build_adagrad(model: Any, base_learning_rate: float, parameters: Any = None,
                  max_gradient_norm: float | None = None, allow_lr_injection: bool = False,
                  **kwargs: Any) -> AdagradOptimizer:
    adagrad = AdagradOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, adagrad, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_adam(model: Any, base_learning_rate: float, max_gradient_norm: float | None = None,
               allow_lr_injection: bool = False, **kwargs: Any) -> AdamOptimizer:
    adam = AdamOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, adam, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_rms_prop(model: Any, base_learning_rate: float,
                   max_gradient_norm: float | None = None, allow_lr_injection: bool = False,
                   **kwargs: Any) -> RmsPropOptimizer:
    rms_prop = RmsPropOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, rms_prop, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_yellowfin(model: Any, base_learning_rate: float = 0.1,
                    **kwargs: Any) -> YellowFinOptimizer:
    """YellowFin for every param (needs a ``YellowFin`` kernel to run)."""
    return _build(model, YellowFinOptimizer(alpha=base_learning_rate, **kwargs))  # type: ignore


def build_ftrl(model: Any, engine: str = "SIMD", **kwargs: Any) -> FtrlOptimizer:
    """FTRL for every param (dpgraph's kernels serve every engine, SIMD included)."""
    return _build(model, FtrlOptimizer(engine=engine, **kwargs))  # type: ignore


def build_gftrl(model: Any, engine: str = "", **kwargs: Any) -> GFtrlOptimizer:
    """Group-lasso FTRL for every (dense) param."""
    return _build(model, GFtrlOptimizer(engine=engine, **kwargs))  # type: ignore


def build_wngrad(model: Any, base_learning_rate: float, parameters: Any = None,
                 max_gradient_norm: float | None = None, allow_lr_injection: bool = False,
                 **kwargs: Any) -> WngradOptimizer:
    wngrad = WngradOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, wngrad, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_storm(model: Any, base_learning_rate: float, parameters: Any = None,
                max_gradient_norm: float | None = None, allow_lr_injection: bool = False,
                **kwargs: Any) -> StormOptimizer:
    storm = StormOptimizer(lr=base_learning_rate, **kwargs)
    return _build(model, storm, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_adadelta(model: Any, base_learning_rate: float, parameters: Any = None,
                   max_gradient_norm: float | None = None, allow_lr_injection: bool = False,
                   **kwargs: Any) -> AdadeltaOptimizer:
    adadelta = AdadeltaOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, adadelta, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def build_decay_adagrad(model: Any, base_learning_rate: float,
                        max_gradient_norm: float | None = None,
                        allow_lr_injection: bool = False,
                        **kwargs: Any) -> DecayAdagradOptimizer:
    decay_adagrad = DecayAdagradOptimizer(alpha=base_learning_rate, **kwargs)
    return _build(model, decay_adagrad, max_gradient_norm=max_gradient_norm,  # type: ignore
                  allow_lr_injection=allow_lr_injection)


def get_lr_injection() -> Any:
    """The current value of the ``lr_injection`` blob in the current workspace."""
    return api.FetchBlob(_LEARNING_RATE_INJECTION)


def set_lr_injection(lr_injection_value: float) -> None:
    """Scale every learning rate built with ``allow_lr_injection`` by this value."""
    import numpy as np

    api.FeedBlob(_LEARNING_RATE_INJECTION,
                 np.array([float(lr_injection_value)], dtype=np.float32))
