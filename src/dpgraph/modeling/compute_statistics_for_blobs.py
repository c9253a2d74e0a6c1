"""Caffe2's ``modeling.compute_statistics_for_blobs`` (logic in
:mod:`dpgraph.modeling.blob_monitors`)."""

from dpgraph.modeling.blob_monitors import ComputeStatisticsForBlobs

__all__ = ["ComputeStatisticsForBlobs"]
