"""Activation helpers: relu, prelu, tanh, sigmoid."""

from __future__ import annotations

from typing import Any

from dpgraph.ir.blob import ScopedBlobReference


def prelu(model: Any, blob_in: Any, blob_out: Any, num_channels: int = 1,
          slope_init: Any = None, **kwargs: Any) -> Any:
    """PRelu with slope ``<out>_slope`` [num_channels] (default ConstantFill 0.25)."""
    slope_init = slope_init or ("ConstantFill", {"value": 0.25})
    if model.init_params:
        slope = model.param_init_net.__getattr__(slope_init[0])(
            [], blob_out + "_slope", shape=[num_channels], **slope_init[1])
    else:
        slope = ScopedBlobReference(blob_out + "_slope", model.param_init_net)
    model.AddParameter(slope)
    return model.net.PRelu([blob_in, slope], [blob_out])


def relu(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
         order: str = "NCHW", **kwargs: Any) -> Any:
    """Relu (engine CUDNN when use_cudnn)."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Relu(blob_in, blob_out, order=order, **kwargs)


def tanh(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
         order: str = "NCHW", **kwargs: Any) -> Any:
    """Tanh (engine CUDNN when use_cudnn)."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Tanh(blob_in, blob_out, order=order, **kwargs)


def sigmoid(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
            order: str = "NCHW", **kwargs: Any) -> Any:
    """Sigmoid (engine CUDNN when use_cudnn)."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Sigmoid(blob_in, blob_out, order=order, **kwargs)
