"""Caffe2's ``queue_util``: BlobsQueues as pipes (a reader side and a writer side)."""

from __future__ import annotations

import logging
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.jobs.dataio import Pipe, Reader, Writer
from dpgraph.jobs.task import TaskGroup

logger = logging.getLogger("dpgraph.queue_util")


class _QueueReader(Reader):
    def __init__(self, wrapper: QueueWrapper, num_dequeue_records: int = 1) -> None:
        if wrapper.schema() is None:
            raise NetError("Queue needs a schema in order to be read from.")
        Reader.__init__(self, wrapper.schema())
        self._wrapper = wrapper
        self._num_dequeue_records = num_dequeue_records

    def setup_ex(self, init_net: Any, exit_net: Any) -> None:
        exit_net.CloseBlobsQueue([self._wrapper.queue()], 0)

    def read_ex(self, local_init_net: Any, local_finish_net: Any) -> tuple[Any, ...]:
        self._wrapper._new_reader(local_init_net)
        dequeue_net = Net("dequeue")
        names = self.schema().field_names()
        fields, status = dequeue(dequeue_net, self._wrapper.queue(), len(names),
                                 field_names=names, num_records=self._num_dequeue_records)
        return [dequeue_net], status, fields

    def read(self, net: Any) -> tuple[Any, Any]:
        _, status, fields = self.read_ex(net, None)
        return status, fields


class _QueueWriter(Writer):
    def __init__(self, wrapper: QueueWrapper) -> None:
        self._wrapper = wrapper

    def setup_ex(self, init_net: Any, exit_net: Any) -> None:
        exit_net.CloseBlobsQueue([self._wrapper.queue()], 0)

    def write_ex(self, fields: Any, local_init_net: Any, local_finish_net: Any,
                 status: Any) -> list[Any]:
        self._wrapper._new_writer(self.schema(), local_init_net)
        enqueue_net = Net("enqueue")
        enqueue(enqueue_net, self._wrapper.queue(), fields, status)
        return [enqueue_net]


class QueueWrapper(Pipe):
    """A pipe over an existing queue blob."""

    def __init__(self, handler: Any, schema: Any = None, num_dequeue_records: int = 1) -> None:
        Pipe.__init__(self, schema, TaskGroup.LOCAL_SETUP)
        self._queue = handler
        self._num_dequeue_records = num_dequeue_records

    def reader(self) -> _QueueReader:
        return _QueueReader(self, num_dequeue_records=self._num_dequeue_records)

    def writer(self) -> _QueueWriter:
        return _QueueWriter(self)

    def queue(self) -> Any:
        return self._queue


class Queue(QueueWrapper):
    """A BlobsQueue of ``capacity`` records, created in each node's setup."""

    def __init__(self, capacity: int, schema: Any = None, name: str = "queue",
                 num_dequeue_records: int = 1) -> None:
        net = Net(name)
        queue_blob = net.AddExternalInput(net.NextName("handler"))
        QueueWrapper.__init__(self, queue_blob, schema, num_dequeue_records=num_dequeue_records)
        self.capacity = capacity
        self._setup_done = False

    def setup(self, global_init_net: Any) -> None:
        if not self._schema:
            raise NetError("This queue does not have a schema.")
        self._setup_done = True
        global_init_net.CreateBlobsQueue([], [self._queue], capacity=self.capacity,
                                         num_blobs=len(self._schema.field_names()),
                                         field_names=self._schema.field_names())


def enqueue(net: Any, queue: Any, data_blobs: Any, status: Any = None) -> Any:
    """SafeEnqueueBlobs of ``data_blobs`` (a blob given twice is copied first); returns the
    status blob (True once the queue is closed)."""
    if status is None:
        status = net.NextName("status")
    queue_blobs: list[Any] = []
    for blob in data_blobs:
        if blob not in queue_blobs:
            queue_blobs.append(blob)
        else:
            logger.warning("Need to copy blob %s to enqueue", blob)
            queue_blobs.append(net.Copy(blob))
    results = net.SafeEnqueueBlobs([queue] + queue_blobs, queue_blobs + [status])
    return results[-1]


def dequeue(net: Any, queue: Any, num_blobs: int, status: Any = None,
            field_names: list[str] | None = None, num_records: int = 1
            ) -> tuple[list[Any], Any]:
    """SafeDequeueBlobs into new blobs; ``(data blobs, status blob)``."""
    if field_names is not None:
        if len(field_names) != num_blobs:
            raise NetError(f"dequeue: {len(field_names)} field names for {num_blobs} blobs")
        data_names = [net.NextName(name) for name in field_names]
    else:
        data_names = [net.NextName("data", i) for i in range(num_blobs)]
    if status is None:
        status = net.NextName("status")
    results = list(net.SafeDequeueBlobs(queue, data_names + [status], num_records=num_records))
    status_blob = results.pop(-1)
    return results, status_blob


__all__ = ["Queue", "QueueWrapper", "dequeue", "enqueue"]
