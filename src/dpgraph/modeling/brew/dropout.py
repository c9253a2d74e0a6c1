"""The dropout helper."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError


def dropout(model: Any, blob_in: Any, blob_out: Any, use_cudnn: bool = False,
            **kwargs: Any) -> Any:
    """Dropout with mask ``_<out>_mask``; ``is_test`` is required."""
    kwargs["engine"] = "CUDNN" if use_cudnn else "DEFAULT"
    if "is_test" not in kwargs:
        raise ModelConfigError("brew.dropout: Argument 'is_test' is required")
    return model.net.Dropout(blob_in, [blob_out, "_" + blob_out + "_mask"], **kwargs)[0]
