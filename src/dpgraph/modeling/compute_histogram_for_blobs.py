"""Caffe2's ``modeling.compute_histogram_for_blobs`` (logic in
:mod:`dpgraph.modeling.blob_monitors`)."""

from dpgraph.modeling.blob_monitors import ComputeHistogramForBlobs

__all__ = ["ComputeHistogramForBlobs"]
