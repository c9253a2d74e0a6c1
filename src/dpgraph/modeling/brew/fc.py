"""Fully connected helpers: fc, packed_fc, fc_decomp, fc_prune, fc_sparse."""

from __future__ import annotations

from typing import Any

from dpgraph.ir.blob import ScopedBlobReference
from dpgraph.modeling.brew._common import check_dim, out_name
from dpgraph.modeling.initializers import ExternalInitializer, update_initializer
from dpgraph.modeling.parameter_info import ParameterTags


def _initializers(model: Any, weight_init: Any, bias_init: Any, WeightInitializer: Any,
                  BiasInitializer: Any) -> tuple[Any, Any]:
    weight = update_initializer(WeightInitializer, weight_init, ("XavierFill", {}))
    bias = update_initializer(BiasInitializer, bias_init, ("ConstantFill", {}))
    if not model.init_params:
        return ExternalInitializer(), ExternalInitializer()
    return weight, bias


def _FC_or_packed_FC(model: Any, op_call: Any, helper: str, blob_in: Any, blob_out: Any,
                     dim_in: int, dim_out: int, weight_init: Any = None, bias_init: Any = None,
                     WeightInitializer: Any = None, BiasInitializer: Any = None,
                     enable_tensor_core: bool = False, float16_compute: bool = False,
                     **kwargs: Any) -> Any:
    dim_in = check_dim(helper, "dim_in", dim_in)
    dim_out = check_dim(helper, "dim_out", dim_out)
    weight_initializer, bias_initializer = _initializers(
        model, weight_init, bias_init, WeightInitializer, BiasInitializer)
    blob_out = out_name(model, blob_out)
    bias_tags = [ParameterTags.BIAS]
    if "freeze_bias" in kwargs:
        bias_tags.append(ParameterTags.COMPUTED_PARAM)
    weight = model.create_param(param_name=blob_out + "_w", shape=[dim_out, dim_in],
                                initializer=weight_initializer, tags=ParameterTags.WEIGHT)
    bias = model.create_param(param_name=blob_out + "_b", shape=[dim_out],
                              initializer=bias_initializer, tags=bias_tags)
    if enable_tensor_core:
        kwargs["engine"] = "TENSORCORE"
    if float16_compute:
        kwargs["float16_compute"] = True
    return op_call([blob_in, weight, bias], blob_out, **kwargs)


def fc(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
       weight_init: Any = None, bias_init: Any = None, WeightInitializer: Any = None,
       BiasInitializer: Any = None, enable_tensor_core: bool = False,
       float16_compute: bool = False, **kwargs: Any) -> Any:
    """``FC([blob_in, <out>_w, <out>_b], blob_out)``; weight [dim_out, dim_in]."""
    return _FC_or_packed_FC(model, model.net.FC, "fc", blob_in, blob_out, dim_in, dim_out,
                            weight_init, bias_init, WeightInitializer, BiasInitializer,
                            enable_tensor_core, float16_compute, **kwargs)


def packed_fc(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
              weight_init: Any = None, bias_init: Any = None, WeightInitializer: Any = None,
              BiasInitializer: Any = None, enable_tensor_core: bool = False,
              float16_compute: bool = False, **kwargs: Any) -> Any:
    """Like :func:`fc` with the PackedFC op."""
    return _FC_or_packed_FC(model, model.net.PackedFC, "packed_fc", blob_in, blob_out, dim_in,
                            dim_out, weight_init, bias_init, WeightInitializer,
                            BiasInitializer, enable_tensor_core, float16_compute, **kwargs)


def fc_decomp(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
              rank_approx: int = 5, weight_init: Any = None, bias_init: Any = None,
              WeightInitializer: Any = None, BiasInitializer: Any = None,
              **kwargs: Any) -> Any:
    """Low-rank FC: ``<out>_u`` [dim_out, rank], ``<out>_v`` [dim_in, rank], ``<out>_b``."""
    weight_initializer, bias_initializer = _initializers(
        model, weight_init, bias_init, WeightInitializer, BiasInitializer)
    blob_out = out_name(model, blob_out)
    u = model.create_param(param_name=blob_out + "_u", shape=[dim_out, rank_approx],
                           initializer=weight_initializer)
    v = model.create_param(param_name=blob_out + "_v", shape=[dim_in, rank_approx],
                           initializer=weight_initializer)
    bias = model.create_param(param_name=blob_out + "_b", shape=[dim_out],
                              initializer=bias_initializer)
    return model.net.FC_Decomp([blob_in, u, v, bias], blob_out, **kwargs)


def fc_prune(model: Any, blob_in: Any, blob_out: Any, dim_in: int, dim_out: int,
             weight_init: Any = None, bias_init: Any = None, mask_init: Any = None,
             threshold: float = 0.00001, need_compress_rate: bool = False,
             comp_lb: float = 0.05, **kwargs: Any) -> Any:
    """FC_Prune: FC with a pruning mask ``<out>_m`` and its bookkeeping blobs
    (``_ag_dw``, ``_mask_seq``, ``_thres``, ``_lb``); ``<out>_w`` and ``<out>_b`` are params."""
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    mask_init = mask_init or ("ConstantFill", {})
    blob_out = out_name(model, blob_out)
    full = [dim_out, dim_in]
    specs = [("_lb", ("ConstantFill", {"value": comp_lb}), [1]),
             ("_w", weight_init, full),
             ("_m", ("ConstantFill", {"value": 1.0}), full),
             ("_ag_dw", mask_init, full),
             ("_b", bias_init, [dim_out]),
             ("_mask_seq", mask_init, full),
             ("_thres", ("ConstantFill", {"value": threshold}), [1])]
    blobs = {suffix: _plain_blob(model, init, blob_out + suffix, shape)
             for suffix, init, shape in specs}
    model.AddParameter(blobs["_w"])
    model.AddParameter(blobs["_b"])
    inputs = [blob_in] + [blobs[s] for s in ("_w", "_m", "_b", "_ag_dw", "_mask_seq",
                                              "_thres", "_lb")]
    if need_compress_rate:
        return model.net.FC_Prune(inputs, [blob_out, blob_out + "_compress_rate"], **kwargs)
    return model.net.FC_Prune(inputs, blob_out, **kwargs)


def fc_sparse(model: Any, blob_in: Any, blob_out: Any, w_csr: Any, iw: Any, jw: Any,
              bias: Any, **kwargs: Any) -> Any:
    """FC_Sparse on already-allocated CSR weights (``w_csr``, ``iw``, ``jw``) and bias."""
    for param in (w_csr, iw, jw, bias):
        model.AddParameter(param)
    return model.net.FC_Sparse([blob_in, w_csr, iw, jw, bias], blob_out, **kwargs)


def _plain_blob(model: Any, init: tuple[str, dict[str, Any]], name: str, shape: list[int]
                ) -> Any:
    """A blob filled directly in param_init_net (a scoped reference without init_params)."""
    if model.init_params:
        return model.param_init_net.__getattr__(init[0])([], name, shape=shape, **init[1])
    return ScopedBlobReference(name, model.param_init_net)
