"""Data input helpers.  dpgraph has no DB or image readers: these raise NotSupportedError."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NotSupportedError


def _unsupported(what: str) -> NotSupportedError:
    return NotSupportedError(
        f"brew.{what}: dpgraph has no DB/image/video readers; feed batches with "
        "workspace.FeedBlob (or a blobs queue) and start the model from the data blobs.")


def db_input(model: Any, blobs_out: Any, batch_size: int, db: str, db_type: str,
             **kwargs: Any) -> Any:
    """Not supported: raises NotSupportedError."""
    raise _unsupported("db_input")


def image_input(model: Any, blob_in: Any, blob_out: Any, order: str = "NCHW",
                use_gpu_transform: bool = False, **kwargs: Any) -> Any:
    """Not supported: raises NotSupportedError."""
    raise _unsupported("image_input")


def video_input(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Not supported: raises NotSupportedError."""
    raise _unsupported("video_input")
