"""Caffe2's ``cnn`` module."""

from dpgraph.modeling.cnn import CNNModelHelper

__all__ = ["CNNModelHelper"]
