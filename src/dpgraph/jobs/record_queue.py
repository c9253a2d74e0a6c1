"""``RecordQueue`` (Caffe2's ``caffe2.python.record_queue``): a BlobsQueue holding whole
records of a schema, filled from a reader by ``num_threads`` concurrent producer steps (each
optionally transforming the record), with a reader interface to take records out.

Before/after::

    queue = RecordQueue(schema, num_threads=2)
    q_reader, producer_step, exit_step, schema = queue.build(reader, process)
    # producer_step: 2 concurrent loops of [read a record; process; SafeEnqueueBlobs]
    #   each stopping when its reader says so; exit_step closes the queue.
    # q_reader.read_record(net): SafeDequeueBlobs -> (should_stop, record).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.net import Net
from dpgraph.ir.plan import ExecutionStep, execution_step
from dpgraph.ir.scope import NameScope
from dpgraph.jobs.dataio import Reader, Writer
from dpgraph.jobs.schema import Field, Struct, from_column_list
from dpgraph.runtime import api as ws_api


class _QueueReader(Reader):
    """Reads whole records from the queue (status: the queue is closed and drained)."""

    def __init__(self, blobs_queue: Any, schema: Field, name: str | None = None) -> None:
        super().__init__(schema)
        self.blobs_queue = blobs_queue
        self.name = name
        self._fields = schema.field_names()

    def read(self, read_net: Any) -> tuple[Any, Any]:
        with NameScope(read_net.NextName(self.name)):
            status = read_net.NextName()
            blobs = read_net.SafeDequeueBlobs(self.blobs_queue, self._fields + [status])
            return blobs[-1], blobs[:-1]


class _QueueWriter(Writer):
    """Checks a record's consistency, then enqueues its blobs (returns the status blob)."""

    def __init__(self, blobs_queue: Any, schema: Field) -> None:
        self.blobs_queue = blobs_queue
        self._schema = schema

    def write(self, writer_net: Any, fields: Any) -> Any:
        if isinstance(fields, Field):
            fields = fields.field_blobs()
        writer_net.CheckDatasetConsistency(fields, [],
                                           fields=self._schema.field_names())  # type: ignore[union-attr]
        status = writer_net.NextName()
        writer_net.SafeEnqueueBlobs([self.blobs_queue] + list(fields), list(fields) + [status])
        return status


class RecordQueue:
    """A queue of ``fields`` records (a Struct, or a list of column names), created in the
    current workspace at construction; ``build`` wires a reader into it."""

    def __init__(self, fields: Any, name: str | None = None, capacity: int = 1,
                 enforce_unique_name: bool = False, num_threads: int = 1) -> None:
        if not isinstance(fields, (list, Struct)):
            raise ModelConfigError(
                f"RecordQueue: fields must be either a Struct or a list of raw field names, "
                f"got {type(fields).__name__}.")
        self.schema = from_column_list(fields) if isinstance(fields, list) else fields
        self.name = name or "queue"
        self.num_threads = num_threads
        init_net = Net(self.name + "/init_net")
        self.blobs_queue = init_net.CreateBlobsQueue(
            [], 1, capacity=capacity, num_blobs=len(self.schema.field_names()),
            enforce_unique_name=enforce_unique_name)
        ws_api.RunNetOnce(init_net)
        self.writer = _QueueWriter(self.blobs_queue, self.schema)
        self.reader = _QueueReader(self.blobs_queue, self.schema, self.name + "_reader")
        exit_net = Net(self.name + "/exit_net")
        exit_net.CloseBlobsQueue(self.blobs_queue, 0)
        self.exit_step = execution_step(f"{exit_net}_close_step", exit_net)

    def _producer(self, index: int, reader: Any,
                  process: Callable[[Any, Any], Any] | None) -> ExecutionStep:
        """One producer loop: read a record, optionally process it, enqueue it; stops when
        ``reader`` signals the end."""
        net_reader = Net(f"reader_{index}")
        should_stop, fields = reader.read_record(net_reader)
        net_prod = Net(f"queue_writer{index}")
        blobs = process(net_prod, fields).field_blobs() if process else fields.field_blobs()
        self.writer.write(net_prod, blobs)
        return execution_step(
            f"producer_{index}",
            [execution_step(f"reader_{index}", net_reader),
             execution_step(f"queue_writer{index}", net_prod)],
            should_stop_blob=should_stop)

    def build(self, reader: Any, process: Callable[[Any, Any], Any] | None = None
              ) -> tuple[Reader, ExecutionStep, ExecutionStep, Field]:
        """``(queue reader, producer step, exit step, schema)``: the producer step runs
        ``num_threads`` producers concurrently; run it with the consumers, then the exit
        step to close the queue."""
        producers = [self._producer(i, reader, process) for i in range(self.num_threads)]
        producer_step = execution_step("producers", producers, concurrent_substeps=True)
        return self.reader, producer_step, self.exit_step, self.schema
