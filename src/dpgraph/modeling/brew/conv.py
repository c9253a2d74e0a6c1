"""Convolution helpers: conv, conv_nd, conv_transpose, group_conv, group_conv_deprecated."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import ScopedBlobReference
from dpgraph.modeling.brew._common import check_dim, check_order, out_name
from dpgraph.modeling.initializers import ExternalInitializer, update_initializer
from dpgraph.modeling.parameter_info import ParameterTags


def _kernels(helper: str, is_nd: bool, kernel: Any) -> list[int]:
    if is_nd:
        kernels = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel]
    elif isinstance(kernel, (list, tuple)):
        if len(kernel) != 2:
            raise ModelConfigError(
                f"brew.{helper}: Conv support only a 2D kernel, got {list(kernel)}.")
        kernels = list(kernel)
    else:
        kernels = [kernel] * 2
    return [check_dim(helper, "kernel", k) for k in kernels]


def _engine_kwargs(kwargs: dict[str, Any], use_cudnn: bool, cudnn_exhaustive_search: bool,
                   ws_nbytes_limit: Any) -> None:
    requested = kwargs.get("engine")
    if requested is not None:
        if use_cudnn and requested != "CUDNN":
            raise ModelConfigError(
                'When use_cudnn=True, the only engine you can specify is "CUDNN"')
        if not use_cudnn and requested == "CUDNN":
            raise ModelConfigError('When use_cudnn=False, the only engine you can specify is ""')
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit


def _ConvBase(model: Any, is_nd: bool, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
              kernel: Any, weight_init: Any = None, bias_init: Any = None,
              WeightInitializer: Any = None, BiasInitializer: Any = None, group: int = 1,
              transform_inputs: Any = None, use_cudnn: bool = False, order: str = "NCHW",
              cudnn_exhaustive_search: bool = False, ws_nbytes_limit: Any = None,
              float16_compute: bool = False, **kwargs: Any) -> Any:
    helper = "conv_nd" if is_nd else "conv"
    check_order(helper, order)
    dim_in = check_dim(helper, "dim_in", dim_in)
    dim_out = check_dim(helper, "dim_out", dim_out)
    group = check_dim(helper, "group", group)
    if dim_in % group:
        raise ModelConfigError(f"brew.{helper}: dim_in={dim_in} is not divisible by "
                               f"group={group}.")
    kernels = _kernels(helper, is_nd, kernel)
    _engine_kwargs(kwargs, use_cudnn, cudnn_exhaustive_search, ws_nbytes_limit)
    use_bias = not kwargs.get("no_bias")
    blob_out = out_name(model, blob_out)
    if order == "NCHW":
        weight_shape = [dim_out, dim_in // group, *kernels]
    else:
        weight_shape = [dim_out, *kernels, dim_in // group]
    weight_initializer = update_initializer(WeightInitializer, weight_init, ("XavierFill", {}))
    bias_initializer = update_initializer(BiasInitializer, bias_init, ("ConstantFill", {}))
    if not model.init_params:
        weight_initializer, bias_initializer = ExternalInitializer(), ExternalInitializer()
    weight = model.create_param(param_name=blob_out + "_w", shape=weight_shape,
                                initializer=weight_initializer, tags=ParameterTags.WEIGHT)
    inputs = [blob_in, weight]
    if use_bias:
        inputs.append(model.create_param(param_name=blob_out + "_b", shape=[dim_out],
                                         initializer=bias_initializer,
                                         tags=ParameterTags.BIAS))
    if transform_inputs is not None:
        transform_inputs(model, blob_out, inputs)
    if float16_compute:
        kwargs["float16_compute"] = True
    kwargs.pop("no_bias", None)
    if group != 1:
        kwargs["group"] = group
    if is_nd:
        return model.net.Conv(inputs, blob_out, kernels=kernels, order=order, **kwargs)
    if isinstance(kernel, (list, tuple)):
        return model.net.Conv(inputs, blob_out, kernel_h=kernels[0], kernel_w=kernels[1],
                              order=order, **kwargs)
    return model.net.Conv(inputs, blob_out, kernel=kernel, order=order, **kwargs)


def conv_nd(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int, kernel: Any,
            weight_init: Any = None, bias_init: Any = None, WeightInitializer: Any = None,
            BiasInitializer: Any = None, group: int = 1, transform_inputs: Any = None,
            order: str = "NCHW", **kwargs: Any) -> Any:
    """N-d convolution (op Conv with ``kernels=[...]``)."""
    return _ConvBase(model, True, blob_in, blob_out, dim_in, dim_out, kernel, weight_init,
                     bias_init, WeightInitializer, BiasInitializer, group, transform_inputs,
                     order=order, **kwargs)


def conv(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int, kernel: Any,
         weight_init: Any = None, bias_init: Any = None, WeightInitializer: Any = None,
         BiasInitializer: Any = None, group: int = 1, transform_inputs: Any = None,
         **kwargs: Any) -> Any:
    """2-D convolution: weight ``<out>_w`` (XavierFill), bias ``<out>_b`` (ConstantFill)."""
    return _ConvBase(model, False, blob_in, blob_out, dim_in, dim_out, kernel, weight_init,
                     bias_init, WeightInitializer, BiasInitializer, group, transform_inputs,
                     **kwargs)


def group_conv(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
               kernel: Any, weight_init: Any = None, bias_init: Any = None, group: int = 1,
               **kwargs: Any) -> Any:
    """:func:`conv` with a ``group`` argument."""
    return conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=weight_init,
                bias_init=bias_init, group=group, **kwargs)


def _plain_param(model: Any, init: tuple[str, dict[str, Any]], name: Any, shape: list[int]
                 ) -> Any:
    """A parameter filled directly in param_init_net (or external without init_params)."""
    if model.init_params:
        return model.param_init_net.__getattr__(init[0])([], name, shape=shape, **init[1])
    return ScopedBlobReference(name, model.param_init_net)


def conv_transpose(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
                   kernel: int, weight_init: Any = None, bias_init: Any = None,
                   use_cudnn: bool = False, order: str = "NCHW",
                   cudnn_exhaustive_search: bool = False, ws_nbytes_limit: Any = None,
                   **kwargs: Any) -> Any:
    """ConvTranspose: weight [dim_in, dim_out, k, k] (NCHW) or [dim_in, k, k, dim_out]."""
    check_order("conv_transpose", order)
    dim_in = check_dim("conv_transpose", "dim_in", dim_in)
    dim_out = check_dim("conv_transpose", "dim_out", dim_out)
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    blob_out = out_name(model, blob_out)
    weight_shape = ([dim_in, dim_out, kernel, kernel] if order == "NCHW"
                    else [dim_in, kernel, kernel, dim_out])
    weight = _plain_param(model, weight_init, blob_out + "_w", weight_shape)
    bias = _plain_param(model, bias_init, blob_out + "_b", [dim_out])
    model.AddParameter(weight, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    return model.net.ConvTranspose([blob_in, weight, bias], blob_out, kernel=kernel,
                                   order=order, **kwargs)


def group_conv_deprecated(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
                          kernel: int, weight_init: Any = None, bias_init: Any = None,
                          group: int = 1, use_cudnn: bool = False, order: str = "NCHW",
                          cudnn_exhaustive_search: bool = False, ws_nbytes_limit: Any = None,
                          **kwargs: Any) -> Any:
    """Group convolution as DepthSplit, one Conv per group, Concat."""
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    use_bias = not kwargs.pop("no_bias", False)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    if dim_in % group:
        raise ModelConfigError("dim_in should be divisible by group.")
    if dim_out % group:
        raise ModelConfigError("dim_out should be divisible by group.")
    split = model.net.DepthSplit(
        blob_in, ["_" + blob_out + "_gconv_split_" + str(i) for i in range(group)],
        dimensions=[dim_in // group] * group, order=order)
    split = split if isinstance(split, tuple) else (split,)
    weight_shape = ([dim_out // group, dim_in // group, kernel, kernel] if order == "NCHW"
                    else [dim_out // group, kernel, kernel, dim_in // group])
    conv_blobs = []
    for i in range(group):
        weight = _plain_param(model, weight_init, blob_out + f"_gconv_{i}_w", weight_shape)
        model.AddParameter(weight, ParameterTags.WEIGHT)
        inputs = [split[i], weight]
        if use_bias:
            bias = _plain_param(model, bias_init, blob_out + f"_gconv_{i}_b",
                                [dim_out // group])
            model.AddParameter(bias, ParameterTags.BIAS)
            inputs.append(bias)
        conv_blobs.append(model.net.Conv(inputs, blob_out + f"_gconv_{i}", kernel=kernel,
                                         order=order, **kwargs))
    concat, _ = model.net.Concat(conv_blobs, [blob_out, "_" + blob_out + "_concat_dims"],
                                 order=order)
    return concat
