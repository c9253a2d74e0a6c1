"""Caffe2's ``dataset``: in-memory datasets of schema columns."""

from dpgraph.jobs.dataset import Const, Dataset

__all__ = ["Const", "Dataset"]
