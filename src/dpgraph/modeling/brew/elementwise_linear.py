"""The elementwise_linear helper."""

from __future__ import annotations

from typing import Any

from dpgraph.ir.blob import ScopedBlobReference
from dpgraph.modeling.brew._common import check_dim, out_name
from dpgraph.modeling.parameter_info import ParameterTags


def elementwise_linear(model: Any, blob_in: Any, blob_out: Any, dim: int,
                       weight_init: Any = None, bias_init: Any = None, **kwargs: Any) -> Any:
    """ElementwiseLinear with ``<out>_w`` (1.0) and ``<out>_b`` (0.0), both [dim]."""
    dim = check_dim("elementwise_linear", "dim", dim)
    weight_init = weight_init or ("ConstantFill", {"value": 1.0})
    bias_init = bias_init or ("ConstantFill", {"value": 0.0})
    blob_out = out_name(model, blob_out)
    if model.init_params:
        weight = model.param_init_net.__getattr__(weight_init[0])(
            [], blob_out + "_w", shape=[dim], **weight_init[1])
        bias = model.param_init_net.__getattr__(bias_init[0])(
            [], blob_out + "_b", shape=[dim], **bias_init[1])
    else:
        weight = ScopedBlobReference(blob_out + "_w", model.param_init_net)
        bias = ScopedBlobReference(blob_out + "_b", model.param_init_net)
    model.AddParameter(weight, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    return model.net.ElementwiseLinear([blob_in, weight, bias], blob_out, **kwargs)
