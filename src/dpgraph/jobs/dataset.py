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


class _CursorReader(Reader):
    """A reader of ``dataset`` through a TreeCursor that ``setup_ex`` creates."""

    def __init__(self, dataset: Dataset, name: str | None, batch_size: int,
                 enforce_batch_size: bool) -> None:
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

    def reset(self, net: Any) -> None:
        net.ResetCursor([self.cursor], [])


class _DatasetReader(_CursorReader):
    """Reads batches through a TreeCursor (made by ``setup_ex``)."""

    def __init__(self, dataset: Dataset, name: str | None, batch_size: int = 1,
                 enforce_batch_size: bool = False) -> None:
        super().__init__(dataset, name, batch_size, enforce_batch_size)

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


class _DatasetRandomReader(_CursorReader):
    """Reads records in the order of an index blob (``indices``, or one made by
    ``sort_and_shuffle``), through the offsets ``computeoffset`` computes."""

    def __init__(self, dataset: Dataset, name: str | None, indices: Any,
                 batch_size: int = 1, loop_over: bool = False,
                 enforce_batch_size: bool = False) -> None:
        super().__init__(dataset, name, batch_size, enforce_batch_size)
        self.indices = indices
        self.loop_over = loop_over
        self.offsets: Any = None

    def computeoffset(self, net: Any) -> None:
        """Add to ``net`` the op computing every record's offsets (needed by ``read``)."""
        self.reset(net)
        self.offsets = net.ComputeOffset(
            [self.cursor] + self.dataset.content().field_blobs(), "offsets")

    def sort_and_shuffle(self, net: Any, sort_by_field: str | None = None,
                         shuffle_size: int = 1, batch_size: int = 1) -> None:
        """Add to ``net`` the op making the reading order: sorted by the root-level column
        ``sort_by_field`` (none by default), shuffled by chunks and batches."""
        content = self.dataset.content()
        sort_by_field_idx = -1
        if sort_by_field:
            if sort_by_field not in content.field_names():
                raise NetError(f"Must be valid field: {sort_by_field!r} is not one of "
                               f"{content.field_names()}.")
            sort_by_field_idx = content.field_names().index(sort_by_field)
        self.reset(net)
        self.indices = net.SortAndShuffle(
            [self.cursor] + content.field_blobs(), "indices",
            sort_by_field_idx=sort_by_field_idx, shuffle_size=shuffle_size,
            batch_size=batch_size)

    def read(self, read_net: Any) -> tuple[Any, Any]:
        for ready, what in ((self.cursor, "setup_ex"), (self.indices, "sort_and_shuffle"),
                            (self.offsets, "computeoffset")):
            if ready is None:
                raise NetError(f"{what} not called.")
        content = self.dataset.content()
        with NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadRandomBatch(
                [self.cursor, self.indices, self.offsets] + content.field_blobs(),
                content.field_names(), batch_size=self.batch_size,
                enforce_batch_size=self.enforce_batch_size, loop_over=self.loop_over)
            fields = output_to_list(fields)
            return read_net.IsEmpty([fields[0]]), fields


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

    def random_reader(self, init_net: Any = None, indices: Any = None,
                      cursor_name: str | None = None, batch_size: int = 1,
                      loop_over: bool = False, enforce_batch_size: bool = False
                      ) -> _DatasetRandomReader:
        """A reader following the order in ``indices`` (or, after ``sort_and_shuffle``, its
        own); call ``computeoffset`` on the reader before reading."""
        if self.field_blobs is None:
            raise NetError("Dataset not initialized.")
        reader = _DatasetRandomReader(self, cursor_name, indices, batch_size, loop_over,
                                      enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def trim(self, net: Any, multiple_of: int) -> None:
        """Add to ``net`` the op keeping a multiple of ``multiple_of`` records."""
        net.TrimDataset(self.field_blobs, self.field_blobs, fields=self.fields,
                        multiple_of=multiple_of)

    def writer(self, init_net: Any = None) -> _DatasetWriter:
        """A writer appending records to the dataset."""
        if self.field_blobs is None:
            raise NetError("Dataset not initialized.")
        writer = _DatasetWriter(self.content())
        if init_net is not None:
            writer.setup_ex(init_net, None)
        return writer


def Const(net: Any, value: Any, dtype: Any = None, name: str | None = None) -> Any:
    """A "constant": a new external input of ``net`` (named after ``name``) fed with
    ``np.array(value, dtype)`` in the current workspace now."""
    import numpy as np

    from dpgraph.ir.net import Net
    from dpgraph.runtime import api

    if not isinstance(net, Net):
        raise NetError(f"net must be a core.Net instance, got {type(net).__name__}.")
    blob = net.AddExternalInput(net.NextName(prefix=name))
    api.FeedBlob(str(blob), np.array(value, dtype=dtype))
    return blob


__all__ = ["Const", "Dataset"]
