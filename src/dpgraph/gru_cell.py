"""Caffe2's ``gru_cell`` module."""

from dpgraph.modeling.rnn.gru import GRU, GRUCell

__all__ = ["GRU", "GRUCell"]
