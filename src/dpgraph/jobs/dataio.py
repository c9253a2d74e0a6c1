"""Caffe2's ``dataio``: Reader, Writer and Pipe, the interfaces datasets, queues and
pipelines read and write records through."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.jobs.schema import Field, Struct, from_blob_list
from dpgraph.proto import caffe2_pb2


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

    def execution_step(self, reader_net_name: str | None = None,
                       external_should_stop: Any = None) -> tuple[Any, Any]:
        """``(read_step, fields)``: a step running a new net of this reader's read ops,
        stopping at the end of the data (or when ``external_should_stop`` is set)."""
        from dpgraph.ir.plan import execution_step

        reader_net = Net(reader_net_name or "reader")
        should_stop, fields = self.read_record(reader_net)
        if external_should_stop is not None:
            should_stop = reader_net.Or([external_should_stop, should_stop])
        read_step = execution_step(f"{reader_net_name}_step", reader_net,
                                   should_stop_blob=should_stop)
        return read_step, fields


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


class CounterReader(Reader):
    """Reads increasing integers (``iter``) and never stops by itself."""

    def __init__(self) -> None:
        Reader.__init__(self, schema=Struct(("iter", np.int64)))
        self.counter: Any = None
        self.should_stop: Any = None

    def setup_ex(self, global_init_net: Any, global_finish_net: Any) -> None:
        if self.counter is None:
            self.counter = global_init_net.CreateCounter([], init_count=0)
            self.should_stop = global_init_net.ConstantFill(
                [], shape=[], dtype=caffe2_pb2.TensorProto.BOOL, value=False)

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        count_net = Net("limited_reader_counter")
        value = count_net.CountUp([self.counter], 1)
        return [count_net], self.should_stop, [value]


class ReaderWithLimitBase(Reader):
    """A reader that also stops on a condition of its own (``check_limiter_condition``);
    ``data_finished()`` tells whether the wrapped reader was exhausted."""

    def __init__(self, reader: Reader) -> None:
        Reader.__init__(self, schema=reader._schema)
        self.reader = reader
        self.net = Net("reader_with_limit")
        self._data_finished = self.net.AddExternalInput(self.net.NextName("data_finished"))
        self.should_stop: Any = None

    def setup_ex(self, global_init_net: Any, global_finish_net: Any) -> None:
        global_init_net.ConstantFill([], [self._data_finished], shape=[], value=False,
                                     dtype=caffe2_pb2.TensorProto.BOOL)
        self.reader.setup_ex(global_init_net, global_finish_net)
        self.setup_limiter(global_init_net, global_finish_net)

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        """The limit check, then the wrapped reader's nets, then a net copying its stop
        flag into the limit's stop blob (checked after every net)."""
        stop_condition_net = Net("limited_reader_condition")
        should_stop = self.check_limiter_condition(stop_condition_net)
        nets, local_data_finished, fields = self.reader.read_ex(local_init_net,
                                                                local_finish_net)
        self._set_schema(self.reader._schema)
        check_done_net = Net("limited_reader_post")
        check_done_net.Copy(local_data_finished, should_stop)
        check_done_net.Or([self._data_finished, local_data_finished], [self._data_finished])
        return [stop_condition_net] + list(nets) + [check_done_net], should_stop, fields

    def setup_limiter(self, global_init_net: Any, global_finish_net: Any) -> None:
        raise NetError(f"{type(self).__name__} must implement `setup_limiter`")

    def check_limiter_condition(self, stop_condition_net: Any) -> Any:
        raise NetError(f"{type(self).__name__} must implement `check_limiter_condition`")

    def data_finished(self) -> Any:
        """A bool blob: True once the wrapped reader ran out of data."""
        return self._data_finished


class ReaderWithLimit(ReaderWithLimitBase):
    """Stops after ``num_iter`` batches (no limit when ``num_iter`` is None)."""

    def __init__(self, reader: Reader, num_iter: int | None = 1) -> None:
        super().__init__(reader)
        self.counter: Any = None
        self.num_iter = num_iter
        if self.num_iter is not None:
            self.counter = self.net.AddExternalInput(self.net.NextName("counter"))

    def setup_limiter(self, global_init_net: Any, global_finish_net: Any) -> None:
        if self.counter:
            global_init_net.CreateCounter([], [self.counter], init_count=int(self.num_iter or 0))

    def check_limiter_condition(self, stop_condition_net: Any) -> Any:
        if self.counter:
            return stop_condition_net.CountDown([self.counter], 1)
        return stop_condition_net.ConstantFill([], 1, shape=[], value=False,
                                               dtype=caffe2_pb2.TensorProto.BOOL)


def CountUntil(num_iter: int) -> ReaderWithLimit:
    """A reader of 0, 1, ... that stops after ``num_iter`` reads."""
    return ReaderWithLimit(CounterReader(), num_iter)


__all__ = ["CountUntil", "CounterReader", "Pipe", "Reader", "ReaderWithLimit",
           "ReaderWithLimitBase", "Writer"]
