"""Pooling helpers: max_pool, average_pool, max_pool_with_index."""

from __future__ import annotations

from typing import Any

from dpgraph.modeling.brew._common import check_order


def max_pool(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
             order: str = "NCHW", **kwargs: Any) -> Any:
    """MaxPool."""
    return _pool(model, "max_pool", "MaxPool", blob_in, blob_out, use_cudnn, order, kwargs)


def average_pool(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
                 order: str = "NCHW", **kwargs: Any) -> Any:
    """AveragePool."""
    return _pool(model, "average_pool", "AveragePool", blob_in, blob_out, use_cudnn, order,
                 kwargs)


def _pool(model: Any, helper: str, op_type: str, blob_in: Any, blob_out: Any, use_cudnn: bool,
          order: str, kwargs: dict[str, Any]) -> Any:
    """One pooling op of ``op_type``; ``use_cudnn`` picks the CUDNN engine."""
    check_order(helper, order)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return getattr(model.net, op_type)(blob_in, blob_out, order=order, **kwargs)


def max_pool_with_index(model: Any, blob_in: Any, blob_out: Any, order: str = "NCHW",
                        **kwargs: Any) -> Any:
    """MaxPoolWithIndex; the index goes to ``<out>_index``."""
    return model.net.MaxPoolWithIndex(blob_in, [blob_out, blob_out + "_index"], order=order,
                                      **kwargs)[0]
