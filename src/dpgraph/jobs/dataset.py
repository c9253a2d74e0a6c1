"""Caffe2's ``dataset``: an in-memory dataset of schema columns with cursor readers and
appending writers."""

from __future__ import annotations

from typing import Any

import dpgraph.ops.dataset  # noqa: F401  (registers the dataset ops)
from dpgraph.errors import NetError
from dpgraph.ir.operator import output_to_list
from dpgraph.ir.scope import NameScope
from dpgraph.jobs.dataio import Reader, Writer
from dpgraph.jobs.records import InitEmptyRecord
from dpgraph.jobs.schema import Field, Struct, from_blob_list, from_column_list


class _DatasetReader(Reader):
    """Reads batches through a TreeCursor (made by ``setup_ex``)."""

    def __init__(self, dataset: Dataset, name: str | None, batch_size: int = 1,
                 enforce_batch_size: bool = False) -> None:
        Reader.__init__(self, dataset.content())
        self.dataset = dataset
        self.name = name or (dataset.name + "_cursor")
        self.batch_size = batch_size
        self.enforce_batch_size = enforce_batch_size
        self.cursor: Any = None

    def setup_ex(self, init_net: Any, exit_net: Any) -> None:
        if self.cursor is None:
            self.cursor = init_net.CreateTreeCursor(
                [], init_net.NextScopedBlob(self.name), fields=self.dataset.fields)

    def read(self, read_net: Any) -> tuple[Any, Any]:
        if self.cursor is None:
            raise NetError("setup not called.")
        content = self.dataset.content()
        with NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadNextBatch([self.cursor] + content.field_blobs(),
                                            content.field_names(), batch_size=self.batch_size,
                                            enforce_batch_size=self.enforce_batch_size)
            fields = output_to_list(fields)
            return read_net.IsEmpty([fields[0]]), fields

    def reset(self, net: Any) -> None:
        net.ResetCursor([self.cursor], [])


class _DatasetWriter(Writer):
    """Appends records to the dataset's blobs under a mutex (made by ``setup_ex``)."""

    def __init__(self, content: Field) -> None:
        self._content = content
        self.mutex: Any = None

    def setup_ex(self, init_net: Any, exit_net: Any) -> None:
        if self.mutex is None:
            self.mutex = init_net.CreateMutex([])

    def write(self, writer_net: Any, fields: Any) -> None:
        if self.mutex is None:
            raise NetError("setup not called.")
        field_blobs = self._content.field_blobs()
        if len(fields) != len(field_blobs):
            raise NetError(f"Expected {len(field_blobs)} fields, got {len(fields)}.")
        writer_net.CheckDatasetConsistency(fields, [], fields=self._content.field_names())
        writer_net.AtomicAppend([self.mutex] + field_blobs + list(fields), field_blobs)

    def commit(self, finish_net: Any) -> None:
        """Nothing to do for an in-memory dataset."""


class Dataset:
    """Columns of a record (a Struct, or a list of column names) held in blobs."""

    def __init__(self, fields: Any, name: str | None = None) -> None:
        self.schema: Field
        if isinstance(fields, Struct):
            self.schema = fields
            self.fields = fields.field_names()
        elif isinstance(fields, list):
            self.schema = from_column_list(fields)
            self.fields = fields
        else:
            raise NetError("fields must be either a Struct or a list of raw field names.")
        self.field_types = self.schema.field_types()
        self.name = name or "dataset"
        self.field_blobs = fields.field_blobs() if isinstance(fields, Field) and \
            fields.has_blobs() else None

    def init_empty(self, init_net: Any) -> None:
        """Create the dataset's blobs, empty, in ``init_net``."""
        with NameScope(self.name):
            self.field_blobs = InitEmptyRecord(init_net,
                                               self.schema.clone_schema()).field_blobs()

    def get_blobs(self) -> Any:
        return self.field_blobs

    def content(self) -> Field:
        """The record of the dataset's blobs."""
        if self.field_blobs is None:
            raise NetError("Dataset not initialized.")
        return from_blob_list(self.schema, self.field_blobs)

    def field_names(self) -> list[str]:
        return self.fields

    def reader(self, init_net: Any = None, cursor_name: str | None = None,
               batch_size: int = 1, enforce_batch_size: bool = False) -> _DatasetReader:
        """A reader of ``batch_size`` entries at a time."""
        if self.field_blobs is None:
            raise NetError("Dataset not initialized.")
        reader = _DatasetReader(self, cursor_name, batch_size, enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def writer(self, init_net: Any = None) -> _DatasetWriter:
        """A writer appending records to the dataset."""
        if self.field_blobs is None:
            raise NetError("Dataset not initialized.")
        writer = _DatasetWriter(self.content())
        if init_net is not None:
            writer.setup_ex(init_net, None)
        return writer


__all__ = ["Dataset"]
