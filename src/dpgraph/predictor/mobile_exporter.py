"""Caffe2's ``predictor.mobile_exporter`` (re-exported from :mod:`dpgraph.export.mobile`)."""

from dpgraph.export.mobile import Export, add_tensor

__all__ = ["Export", "add_tensor"]
