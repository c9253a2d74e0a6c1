"""Pooling helpers: max_pool, average_pool, max_pool_with_index."""

from __future__ import annotations

from typing import Any

from dpgraph.modeling.brew._common import check_order


def max_pool(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
             order: str = "NCHW", **kwargs: Any) -> Any:
    """MaxPool."""
    check_order("max_pool", order)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.MaxPool(blob_in, blob_out, order=order, **kwargs)


def average_pool(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
                 order: str = "NCHW", **kwargs: Any) -> Any:
    """AveragePool."""
    check_order("average_pool", order)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.AveragePool(blob_in, blob_out, order=order, **kwargs)


def max_pool_with_index(model: Any, blob_in: Any, blob_out: Any, order: str = "NCHW",
                        **kwargs: Any) -> Any:
    """MaxPoolWithIndex; the index goes to ``<out>_index``."""
    return model.net.MaxPoolWithIndex(blob_in, [blob_out, blob_out + "_index"], order=order,
                                      **kwargs)[0]
