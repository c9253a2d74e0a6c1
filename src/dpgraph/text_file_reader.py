"""Caffe2's ``text_file_reader`` module (the logic is in :mod:`dpgraph.jobs.text_file_reader`)."""

from dpgraph.jobs.text_file_reader import TextFileReader

__all__ = ["TextFileReader"]
