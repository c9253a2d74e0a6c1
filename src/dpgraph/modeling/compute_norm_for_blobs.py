"""Caffe2's ``modeling.compute_norm_for_blobs`` (logic in :mod:`dpgraph.modeling.blob_monitors`)."""

from dpgraph.modeling.blob_monitors import ComputeNormForBlobs

__all__ = ["ComputeNormForBlobs"]
