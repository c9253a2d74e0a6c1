"""Data input helpers: ``brew.db_input``, ``brew.image_input`` (``video_input`` is not
supported)."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError, NotSupportedError


def db_input(model: Any, blobs_out: Any, batch_size: int, db: str, db_type: str) -> Any:
    """``CreateDB`` (reader ``dbreader_<db>``) in ``param_init_net`` and a
    ``TensorProtosDBInput`` reading ``batch_size`` records into ``blobs_out`` in ``net``."""
    dbreader_name = "dbreader_" + db
    dbreader = model.param_init_net.CreateDB([], dbreader_name, db=db, db_type=db_type)
    return model.net.TensorProtosDBInput(dbreader, blobs_out, batch_size=batch_size)


def image_input(model: Any, blob_in: Any, blob_out: Any, order: str = "NCHW",
                use_gpu_transform: bool = False, **kwargs: Any) -> Any:
    """``ImageInput``; with ``order="NCHW"`` (and no GPU transform) it writes
    ``<data>_nhwc`` and adds ``NHWC2NCHW`` into ``blob_out[0]``.  ``is_test`` is required."""
    if "is_test" not in kwargs:
        raise ModelConfigError("Argument 'is_test' is required")
    if not isinstance(blob_out, list):
        raise ModelConfigError(f"brew.image_input: blob_out must be a list of blob names, got "
                               f"{type(blob_out).__name__}.")
    if order == "NCHW":
        if use_gpu_transform:
            kwargs["use_gpu_transform"] = 1 if use_gpu_transform else 0
            return model.net.ImageInput(blob_in, blob_out, **kwargs)
        data, *rest = model.net.ImageInput(
            blob_in, [str(blob_out[0]) + "_nhwc"] + list(blob_out[1:]), **kwargs)
        data = model.net.NHWC2NCHW(data, blob_out[0])
        return (data, *rest)
    return model.net.ImageInput(blob_in, blob_out, **kwargs)


def video_input(model: Any, blob_in: Any, blob_out: Any, **kwargs: Any) -> Any:
    """Not supported: raises NotSupportedError."""
    raise NotSupportedError(
        "brew.video_input: dpgraph has no VideoInput op (it needs Caffe2's video decoders); "
        "decode the clips in Python and feed them with data_workers or workspace.FeedBlob.")
