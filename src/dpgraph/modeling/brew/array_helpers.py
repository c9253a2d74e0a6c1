"""Array helpers: concat, depth_concat."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("dpgraph.modeling.brew")


def concat(model: Any, blobs_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Concat (``order`` is dropped when ``axis`` is also given)."""
    if kwargs.get("order") and kwargs.get("axis"):
        kwargs.pop("order")
    return model.net.Concat(blobs_in, [blob_out, "_" + blob_out + "_concat_dims"],
                            **kwargs)[0]


def depth_concat(model: Any, blobs_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Deprecated alias of :func:`concat`."""
    logger.warning("DepthConcat is deprecated. use Concat instead.")
    return concat(model, blobs_in, blob_out, **kwargs)
