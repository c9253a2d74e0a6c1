"""Caffe2's ``dataset``: in-memory datasets of schema columns."""

from dpgraph.jobs.dataset import Dataset

__all__ = ["Dataset"]
