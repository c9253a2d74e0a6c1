"""Caffe2's ``dataio``: Reader, Writer, Pipe, reader builders and the limited, delaying
and composite readers."""

from dpgraph.jobs.dataio import (
    CounterReader,
    CountUntil,
    Pipe,
    Reader,
    ReaderWithLimit,
    ReaderWithLimitBase,
    Writer,
)
from dpgraph.jobs.readers import (
    CompositeReader,
    CompositeReaderBuilder,
    PipedReaderBuilder,
    ReaderBuilder,
    ReaderWithDelay,
    ReaderWithTimeLimit,
)

__all__ = ["CompositeReader", "CompositeReaderBuilder", "CountUntil", "CounterReader", "Pipe",
           "PipedReaderBuilder", "Reader", "ReaderBuilder", "ReaderWithDelay",
           "ReaderWithLimit", "ReaderWithLimitBase", "ReaderWithTimeLimit", "Writer"]
