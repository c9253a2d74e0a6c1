"""Algebra helpers: transpose, sum, reduce_sum, sub, mat_mul, arg_min, batch_mat_mul."""

from __future__ import annotations

from typing import Any


def transpose(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
              **kwargs: Any) -> Any:
    """Transpose."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.Transpose(blob_in, blob_out, **kwargs)


def sum(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:  # noqa: A001
    """Sum."""
    return model.net.Sum(blob_in, blob_out, **kwargs)


def reduce_sum(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """ReduceSum."""
    return model.net.ReduceSum(blob_in, blob_out, **kwargs)


def sub(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Sub."""
    return model.net.Sub(blob_in, blob_out, **kwargs)


def mat_mul(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """MatMul."""
    return model.net.MatMul(blob_in, blob_out, **kwargs)


def arg_min(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """ArgMin."""
    return model.net.ArgMin(blob_in, blob_out, **kwargs)


def batch_mat_mul(model: Any, blob_in: Any, blob_out: Any, enable_tensor_core: bool = False,
                  **kwargs: Any) -> Any:
    """BatchMatMul (engine TENSORCORE when enable_tensor_core)."""
    if enable_tensor_core:
        kwargs["engine"] = "TENSORCORE"
    return model.net.BatchMatMul(blob_in, blob_out, **kwargs)
