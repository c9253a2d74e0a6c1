"""Caffe2's ``record_queue`` module: a BlobsQueue of schema records fed by a reader."""

from dpgraph.jobs.record_queue import (  # noqa: F401  (Caffe2's module names)
    RecordQueue,
    _QueueReader,
    _QueueWriter,
)

__all__ = ["RecordQueue"]
