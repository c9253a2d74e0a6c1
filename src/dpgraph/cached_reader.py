"""Caffe2's ``cached_reader``: CachedReader."""

from dpgraph.jobs.db_file_reader import CachedReader

__all__ = ["CachedReader"]
