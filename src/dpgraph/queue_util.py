"""Caffe2's ``queue_util``: BlobsQueues as pipes."""

from dpgraph.jobs.queue_util import Queue, QueueWrapper, dequeue, enqueue

__all__ = ["Queue", "QueueWrapper", "dequeue", "enqueue"]
