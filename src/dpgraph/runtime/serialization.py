"""Blob serialization for the runtime: re-exports :mod:`dpgraph.ir.blob_serde`, the one
(de)serializer of the package, so older imports keep working."""

from __future__ import annotations

from dpgraph.ir.blob_serde import (
    DATA_TYPE_TO_NUMPY,
    deserialize_blob,
    numpy_to_data_type,
    numpy_to_tensor_proto,
    serialize_blob,
    tensor_proto_to_numpy,
    value_data_type,
)

__all__ = ["DATA_TYPE_TO_NUMPY", "deserialize_blob", "numpy_to_data_type",
           "numpy_to_tensor_proto", "serialize_blob", "tensor_proto_to_numpy",
           "value_data_type"]
