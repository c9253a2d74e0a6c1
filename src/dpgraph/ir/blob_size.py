"""Estimated serialized size of a blob (Caffe2's ``EstimateSerializedBlobSize``).

A tensor costs ``num_chunks * (len(name) + 50)`` bytes of per-chunk overhead (the fixed
TensorProto/BlobProto fields and the name written in every chunk) plus ``numel * item_size``,
where ``num_chunks = ceil(numel / chunk_size)`` for the blob's resolved chunk size and the
item size is the element's typical wire width: float 4 (2 when serialized as bfloat16),
double and int64 8, int32 4, 16-bit types 3 (a varint of up to 16 bits), 8-bit types and
bool 2 (a varint of up to 8 bits), strings 50 (their lengths are unknown).  A blob that is
not a tensor costs its exact serialized size; an empty blob costs 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.arrays import to_host
from dpgraph.ir.blob_serde import (
    DEFAULT_CHUNK_SIZE,
    FLOAT_BFLOAT16,
    BlobOptions,
    is_tensor,
    serialize_blob,
)

#: Save converts float32 to bfloat16 when asked (Caffe2 needed fbgemm for this): the value of
#: Caffe2's ``workspace.has_fbgemm``
HAS_BFLOAT16 = True
#: fixed bytes per chunk besides the blob name (Caffe2's ``protobuf_overhead_per_chunk``)
CHUNK_OVERHEAD = 50
#: rough size of one string element, whose length the estimate does not look at
STRING_ITEM_SIZE = 50

_ITEM_SIZE = {
    np.dtype(np.float32): 4, np.dtype(np.float64): 8, np.dtype(np.int64): 8,
    np.dtype(np.int32): 4, np.dtype(np.int16): 3, np.dtype(np.uint16): 3,
    np.dtype(np.float16): 3, np.dtype(np.int8): 2, np.dtype(np.uint8): 2,
    np.dtype(np.bool_): 2,
}


def item_size(dtype: Any, float_format: int = 0) -> int:
    """Estimated wire bytes of one element of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == np.float32 and float_format == FLOAT_BFLOAT16:
        return 2
    if dtype.kind in "OSU":
        return STRING_ITEM_SIZE
    return _ITEM_SIZE.get(dtype, dtype.itemsize)


def estimate_tensor_size(name: str, numel: int, dtype: Any, options: BlobOptions) -> int:
    """The estimate for a tensor of ``numel`` elements of ``dtype`` saved as ``name``."""
    chunk_size = options.resolved_chunk_size()
    if chunk_size <= 0:
        chunk_size = numel + 1  # no chunking (and room for an empty tensor)
    num_chunks = (numel + chunk_size - 1) // chunk_size
    return (num_chunks * (len(name) + CHUNK_OVERHEAD)
            + numel * item_size(dtype, options.float_format))


def estimate_blob_size(name: str, value: Any, options: BlobOptions | None = None) -> int:
    """Estimated serialized size in bytes of blob ``name`` holding ``value``."""
    options = options or BlobOptions()
    if value is None:
        return 0
    if is_tensor(value):
        array = np.asarray(to_host(value))
        return estimate_tensor_size(name, int(array.size), array.dtype, options)
    return len(serialize_blob(name, value))


__all__ = ["CHUNK_OVERHEAD", "DEFAULT_CHUNK_SIZE", "HAS_BFLOAT16", "STRING_ITEM_SIZE",
           "estimate_blob_size", "estimate_tensor_size", "item_size"]
