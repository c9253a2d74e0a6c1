"""Caffe2's ``dataio``: Reader, Writer and Pipe."""

from dpgraph.jobs.dataio import Pipe, Reader, Writer

__all__ = ["Pipe", "Reader", "Writer"]
