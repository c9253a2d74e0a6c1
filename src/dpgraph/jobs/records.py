"""Records of blobs in nets and workspaces: NewRecord, FeedRecord, FetchRecord,
ConstRecord and InitEmptyRecord (Caffe2's ``schema`` record functions)."""

from __future__ import annotations

import logging
from typing import Any

from dpgraph.ir.blob import BlobReference
from dpgraph.jobs.schema import Field, Scalar, data_type_for_dtype, from_blob_list

logger = logging.getLogger("dpgraph.schema")


def FetchRecord(blob_record: Field, ws: Any = None,
                throw_on_type_mismatch: bool = False) -> Field:
    """A value record: each blob of ``blob_record`` fetched as a numpy array."""
    def fetch(v: Any) -> Any:
        if ws is None:
            from dpgraph.runtime import api

            return api.FetchBlob(str(v))
        return ws.blobs[str(v)].fetch()

    if not isinstance(blob_record, Field):
        raise TypeError(f"FetchRecord takes a schema Field, got {type(blob_record).__name__}")
    field_blobs = blob_record.field_blobs()
    if not all(isinstance(v, BlobReference) for v in field_blobs):
        raise TypeError("FetchRecord needs a record of BlobReferences.")
    return from_blob_list(blob_record, [fetch(v) for v in field_blobs],
                          throw_on_type_mismatch)


def FeedRecord(blob_record: Field, arrays: Any, ws: Any = None) -> None:
    """Feed ``arrays`` (a list, or a value record) into the blobs of ``blob_record``."""
    def feed(b: Any, v: Any) -> None:
        if ws is None:
            from dpgraph.runtime import api

            api.FeedBlob(str(b), v)
        else:
            ws.create_blob(str(b))
            ws.blobs[str(b)].feed(v)

    if not isinstance(blob_record, Field):
        raise TypeError(f"FeedRecord takes a schema Field, got {type(blob_record).__name__}")
    field_blobs = blob_record.field_blobs()
    if not all(isinstance(v, BlobReference) for v in field_blobs):
        raise TypeError("FeedRecord needs a record of BlobReferences.")
    if isinstance(arrays, Field):
        arrays = arrays.field_blobs()
    if len(arrays) != len(field_blobs):
        raise ValueError(f"Values must have {len(field_blobs)} elements, got {len(arrays)}.")
    for blob, array in zip(field_blobs, arrays):
        feed(blob, array)


def NewRecord(net: Any, schema: Field) -> Field:
    """A record of new, uniquely named blobs of ``net`` with ``schema``'s structure."""
    if isinstance(schema, Scalar):
        result = schema.clone()
        result.set_value(blob=net.NextScopedBlob("unnamed_scalar"), unsafe=True)
        return result
    if not isinstance(schema, Field):
        raise TypeError(f"NewRecord takes a schema Field, got {type(schema).__name__}")
    refs = [net.NextScopedBlob(prefix=name) for name in schema.field_names()]
    return from_blob_list(schema, refs)


def ConstRecord(net: Any, array_record: Field) -> Field:
    """A blob record whose blobs ``net`` fills with ``array_record``'s values."""
    blob_record = NewRecord(net, array_record)
    for blob, array in zip(blob_record.field_blobs(), array_record.field_blobs()):
        net.Const(array, blob)
    return blob_record


def InitEmptyRecord(net: Any, schema_or_record: Field, enforce_types: bool = False) -> Field:
    """Fill every blob of the record (a new one if it has none) with an empty tensor."""
    if not schema_or_record.has_blobs():
        record = NewRecord(net, schema_or_record)
    else:
        record = schema_or_record
    for blob_type, blob in zip(record.field_types(), record.field_blobs()):
        try:
            data_type = data_type_for_dtype(blob_type)
            shape = [0] + list(blob_type.shape)
            net.ConstantFill([], blob, shape=shape, dtype=data_type)
        except TypeError:
            logger.warning("Blob %s has type error", blob)
            if enforce_types:
                raise
            net.ConstantFill([], blob, shape=[0])
    return record


__all__ = ["ConstRecord", "FeedRecord", "FetchRecord", "InitEmptyRecord", "NewRecord"]
