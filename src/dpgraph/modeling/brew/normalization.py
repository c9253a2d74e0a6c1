"""Normalization helpers: spatial_bn, spatial_gn, layer_norm, instance_norm, lrn, softmax."""

from __future__ import annotations

from typing import Any

from dpgraph.ir import scope
from dpgraph.ir.device import CPU
from dpgraph.modeling.brew._common import check_dim, check_order, out_name
from dpgraph.modeling.initializers import (
    ExternalInitializer,
    Initializer,
    update_initializer,
)
from dpgraph.modeling.parameter_info import ParameterTags


def lrn(model: Any, blob_in: Any, blob_out: Any, order: str = "NCHW", use_cudnn: bool = False,
        **kwargs: Any) -> Any:
    """LRN; on CPU (or without cuDNN) it also outputs ``_<out>_scale``."""
    dev = kwargs["device_option"] if "device_option" in kwargs else scope.CurrentDeviceScope()
    is_cpu = dev is None or dev.device_type == CPU
    if use_cudnn and not is_cpu:
        kwargs["engine"] = "CUDNN"
        return model.net.LRN(blob_in, blob_out, order=order, **kwargs)
    return model.net.LRN(blob_in, [blob_out, "_" + blob_out + "_scale"], order=order,
                         **kwargs)[0]


def softmax(model: Any, blob_in: Any, blob_out: Any = None, use_cudnn: bool = False,
            **kwargs: Any) -> Any:
    """Softmax."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    if blob_out is not None:
        return model.net.Softmax(blob_in, blob_out, **kwargs)
    return model.net.Softmax(blob_in, **kwargs)


def instance_norm(model: Any, blob_in: Any, blob_out: Any, dim_in: int, order: str = "NCHW",
                  **kwargs: Any) -> Any:
    """InstanceNorm with ``<out>_s`` (1.0, WEIGHT) and ``<out>_b`` (0.0, BIAS)."""
    dim_in = check_dim("instance_norm", "dim_in", dim_in)
    blob_out = out_name(model, blob_out)

    def init_blob(value: float, suffix: str) -> Any:
        return model.param_init_net.ConstantFill(
            [], blob_out + "_" + suffix, shape=[dim_in], value=value)

    scale, bias = init_blob(1.0, "s"), init_blob(0.0, "b")
    model.AddParameter(scale, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    if kwargs.get("is_test"):
        return model.net.InstanceNorm([blob_in, scale, bias], [blob_out], order=order,
                                      **kwargs)
    outputs = [blob_out, blob_out + "_sm", blob_out + "_siv"]
    return model.net.InstanceNorm([blob_in, scale, bias], outputs, order=order, **kwargs)[0]


def _constant_init(model: Any, initializer: Any, value: float) -> Any:
    if not model.init_params:
        return ExternalInitializer()
    return update_initializer(initializer, ("ConstantFill", {"value": value}),
                              ("ConstantFill", {}))


def spatial_bn(model: Any, blob_in: Any, blob_out: Any, dim_in: int, init_scale: float = 1.,
               init_bias: float = 0., ScaleInitializer: Any = None, BiasInitializer: Any = None,
               RunningMeanInitializer: Any = None, RunningVarianceInitializer: Any = None,
               order: str = "NCHW", **kwargs: Any) -> Any:
    """SpatialBN with ``_s``, ``_b`` (params) and ``_rm``, ``_riv`` (computed params)."""
    check_order("spatial_bn", order)
    dim_in = check_dim("spatial_bn", "dim_in", dim_in)
    blob_out = out_name(model, blob_out)
    specs = [("_s", ScaleInitializer, init_scale, ParameterTags.WEIGHT),
             ("_b", BiasInitializer, init_bias, ParameterTags.BIAS),
             ("_rm", RunningMeanInitializer, 0.0, ParameterTags.COMPUTED_PARAM),
             ("_riv", RunningVarianceInitializer, 1.0, ParameterTags.COMPUTED_PARAM)]
    scale, bias, running_mean, running_inv_var = [
        model.create_param(param_name=blob_out + suffix, shape=[dim_in],
                           initializer=_constant_init(model, init, value), tags=tag)
        for suffix, init, value, tag in specs]
    inputs = [blob_in, scale, bias, running_mean, running_inv_var]
    if kwargs.get("is_test"):
        return model.net.SpatialBN(inputs, [blob_out], order=order, **kwargs)
    outputs = [blob_out, running_mean, running_inv_var, blob_out + "_sm", blob_out + "_siv"]
    return model.net.SpatialBN(inputs, outputs, order=order, **kwargs)[0]


def spatial_gn(model: Any, blob_in: Any, blob_out: Any, dim_in: int, init_scale: float = 1.,
               init_bias: float = 0., ScaleInitializer: Any = None, BiasInitializer: Any = None,
               RunningMeanInitializer: Any = None, RunningVarianceInitializer: Any = None,
               order: str = "NCHW", **kwargs: Any) -> Any:
    """GroupNorm with ``_s`` and ``_b``; outputs ``<out>``, ``_mean``, ``_std``."""
    dim_in = check_dim("spatial_gn", "dim_in", dim_in)
    blob_out = out_name(model, blob_out)
    scale = model.create_param(param_name=blob_out + "_s", shape=[dim_in],
                               initializer=_constant_init(model, ScaleInitializer, init_scale),
                               tags=ParameterTags.WEIGHT)
    bias = model.create_param(param_name=blob_out + "_b", shape=[dim_in],
                              initializer=_constant_init(model, BiasInitializer, init_bias),
                              tags=ParameterTags.BIAS)
    outputs = [blob_out, blob_out + "_mean", blob_out + "_std"]
    return model.net.GroupNorm([blob_in, scale, bias], outputs, **kwargs)[0]


def layer_norm(model: Any, blob_in: Any, blob_out: Any, dim_in: Any, axis: int = 1,
               epsilon: float = 1e-4, initial_scale: float = 1.0, initial_bias: float = 0.0
               ) -> tuple[Any, Any, Any]:
    """``LayerNorm([in, <out>_scale, <out>_bias], [<out>, <out>_mean, <out>_std],
    elementwise_affine=True)`` (Caffe2's late form); returns the three outputs."""
    shape = [dim_in] if isinstance(dim_in, int) else dim_in
    scale = model.create_param(param_name=f"{blob_out}_scale", shape=shape,
                               initializer=Initializer("ConstantFill", value=initial_scale),
                               tags=ParameterTags.WEIGHT)
    bias = model.create_param(param_name=f"{blob_out}_bias", shape=shape,
                              initializer=Initializer("ConstantFill", value=initial_bias),
                              tags=ParameterTags.BIAS)
    normalized, mean, std = model.net.LayerNorm(
        [blob_in, scale, bias], [blob_out, blob_out + "_mean", blob_out + "_std"],
        axis=axis, epsilon=epsilon, elementwise_affine=True)
    return normalized, mean, std


def moments_with_running_stats(model: Any, blob_in: Any, blob_out: Any, dim_in: int,
                               RunningMeanInitializer: Any = None,
                               RunningVarianceInitializer: Any = None, order: str = "NCHW",
                               **kwargs: Any) -> Any:
    """Computed params ``<out>_rm`` (0.0) and ``<out>_riv`` (1.0), then ``Moments`` over the
    non-channel axes into ``[<out>_sm, <out>_sv]``; returns both outputs."""
    check_order("moments_with_running_stats", order)
    dim_in = check_dim("moments_with_running_stats", "dim_in", dim_in)
    for suffix, init, value in [("_rm", RunningMeanInitializer, 0.0),
                                ("_riv", RunningVarianceInitializer, 1.0)]:
        model.create_param(param_name=blob_out + suffix, shape=[dim_in],
                           initializer=_constant_init(model, init, value),
                           tags=ParameterTags.COMPUTED_PARAM)
    axes = [0, 2, 3] if order == "NCHW" else [0, 1, 2]
    return model.net.Moments([blob_in], [blob_out + "_sm", blob_out + "_sv"], axes=axes,
                             order=order, keepdims=False, **kwargs)
