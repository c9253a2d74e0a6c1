"""Caffe2's ``text_file_reader.TextFileReader``: a dataio Reader over a tab-separated text
file (CreateTextFileReader / TextFileReaderRead)."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import BlobReference
from dpgraph.jobs.dataio import Reader
from dpgraph.jobs.schema import Scalar, Struct, data_type_for_dtype
from dpgraph.ops import text_file_reader as _ops  # noqa: F401  (registers the reader ops)


class TextFileReader(Reader):
    """Reads ``batch_size`` rows at a time from ``filename`` for ``num_passes`` passes; the
    schema is a Struct of string and float32 Scalars, one per column."""

    def __init__(self, init_net: Any, filename: str, schema: Any, num_passes: int = 1,
                 batch_size: int = 1) -> None:
        if not isinstance(schema, Struct):
            raise NetError("Schema must be a schema.Struct")
        for _, child in schema.get_children():
            if not isinstance(child, Scalar):
                raise NetError("Only scalar fields are supported in TextFileReader.")
        field_types = [data_type_for_dtype(dtype) for dtype in schema.field_types()]
        Reader.__init__(self, schema)
        self._reader = init_net.CreateTextFileReader(
            [], filename=filename, num_passes=num_passes, field_types=field_types)
        self._batch_size = batch_size

    def read(self, net: Any) -> tuple[Any, list[Any]]:
        """Ops reading one batch: ``(is_empty, column blobs)``."""
        blobs = net.TextFileReaderRead([self._reader], len(self.schema().field_names()),
                                       batch_size=self._batch_size)
        if isinstance(blobs, BlobReference):
            blobs = [blobs]
        is_empty = net.IsEmpty([blobs[0]], net.NextScopedBlob("should_stop"))
        return is_empty, list(blobs)


__all__ = ["TextFileReader"]
