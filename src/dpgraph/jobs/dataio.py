"""Caffe2's ``dataio``: Reader, Writer and Pipe, the interfaces datasets, queues and
pipelines read and write records through."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.jobs.schema import Field, from_blob_list


class Reader:
    """Reads records: ``read(net)`` adds ops returning ``(should_stop, fields)``."""

    def __init__(self, schema: Field | None = None) -> None:
        if schema is not None and not isinstance(schema, Field):
            raise NetError(f"Reader schema must be a schema.Field, got {type(schema).__name__}")
        self._schema = schema

    def schema(self) -> Field:
        if self._schema is None:
            raise NetError("Schema not provided for this reader.")
        return self._schema

    def _set_schema(self, schema: Field | None) -> None:
        self._schema = schema

    def setup_ex(self, init_net: Any, finish_net: Any) -> None:
        """Add ops to run once at task start (``init_net``) and end (``finish_net``)."""

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        """``(read_nets, should_stop, fields)``."""
        read_net = Net("reader_body")
        return ([read_net],) + tuple(self.read(read_net))

    def read_record_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        nets, should_stop, fields = self.read_ex(local_init_net, local_finish_net)
        if self._schema:
            fields = from_blob_list(self._schema, fields)
        return nets, should_stop, fields

    def read(self, read_net: Any) -> tuple[Any, Any]:
        raise NetError(f"{type(self).__name__} must implement `read`.")

    def reset(self, net: Any) -> None:
        raise NetError(f"{type(self).__name__} cannot be reset.")

    def read_record(self, read_net: Any) -> tuple[Any, Any]:
        should_stop, fields = self.read(read_net)
        if self._schema:
            fields = from_blob_list(self._schema, fields)
        return should_stop, fields


class Writer:
    """Writes records: ``write(net, fields)`` adds the ops that store them."""

    _schema: Field | None = None

    def schema(self) -> Field | None:
        return self._schema

    def setup_ex(self, init_net: Any, finish_net: Any) -> None:
        """Add ops to run once at task start and end."""

    def write_ex(self, fields: Any, local_init_net: Any, local_finish_net: Any,
                 stop_blob: Any) -> list[Any]:
        write_net = Net("write_net")
        self.write(write_net, fields)
        return [write_net]

    def write_record_ex(self, fields: Any, local_init_net: Any, local_finish_net: Any,
                        stop_blob: Any = None) -> list[Any]:
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        return self.write_ex(fields, local_init_net, local_finish_net, stop_blob)

    def write(self, writer_net: Any, fields: Any) -> None:
        raise NetError(f"{type(self).__name__} must implement write.")

    def write_record(self, writer_net: Any, fields: Any) -> None:
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        self.write(writer_net, fields)

    def commit(self, finish_net: Any) -> None:
        """Add the ops that make the written data final (nothing by default)."""


class Pipe:
    """Something with a reader side and a writer side (a queue)."""

    def __init__(self, schema: Field | None = None, obj_key: str | None = None) -> None:
        self._num_writers = 0
        self._num_readers = 0
        self._schema = schema
        self._obj_key = obj_key

    def schema(self) -> Field | None:
        return self._schema

    def setup(self, global_init_net: Any) -> None:
        """Add the ops that create the pipe (once per node)."""

    def reader(self) -> Reader:
        raise NetError(f"{type(self).__name__} has no reader.")

    def writer(self) -> Writer:
        raise NetError(f"{type(self).__name__} has no writer.")

    def num_readers(self) -> int:
        return self._num_readers

    def num_writers(self) -> int:
        return self._num_writers

    def _new_writer(self, writer_schema: Field | None, writer_init_net: Any) -> None:
        if writer_schema is not None and self._schema is None:
            self._schema = writer_schema
        self._num_writers += 1
        if self._obj_key is not None:
            writer_init_net.add_attribute(self._obj_key, self)

    def _new_reader(self, reader_init_net: Any) -> None:
        self._num_readers += 1
        if self._obj_key is not None:
            reader_init_net.add_attribute(self._obj_key, self)


__all__ = ["Pipe", "Reader", "Writer"]
