"""Caffe2's ``modeling.get_entry_from_blobs`` (logic in :mod:`dpgraph.modeling.blob_monitors`)."""

from dpgraph.modeling.blob_monitors import GetEntryFromBlobs

__all__ = ["GetEntryFromBlobs"]
