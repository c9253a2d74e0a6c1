"""Caffe2's ``crf`` module: the linear-chain CRF loss layer (batch size 1)."""

from dpgraph.modeling.crf import CRFWithLoss

__all__ = ["CRFWithLoss"]
