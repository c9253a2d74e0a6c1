"""Caffe2's ``predictor.serde`` (re-exported from :mod:`dpgraph.export.metanet`)."""

from dpgraph.export.metanet import deserialize_protobuf_struct, serialize_protobuf_struct

__all__ = ["deserialize_protobuf_struct", "serialize_protobuf_struct"]
