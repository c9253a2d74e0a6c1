"""Caffe2's ``dataio``: Reader, Writer, Pipe and the limited readers."""

from dpgraph.jobs.dataio import (
    CounterReader,
    CountUntil,
    Pipe,
    Reader,
    ReaderWithLimit,
    ReaderWithLimitBase,
    Writer,
)

__all__ = ["CountUntil", "CounterReader", "Pipe", "Reader", "ReaderWithLimit",
           "ReaderWithLimitBase", "Writer"]
