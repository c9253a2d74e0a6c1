"""Caffe2's ``db_file_reader``: DBFileReader."""

from dpgraph.jobs.db_file_reader import DBFileReader

__all__ = ["DBFileReader"]
