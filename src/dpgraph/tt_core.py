"""Caffe2's ``tt_core`` module: Tensor-Train (TT) decomposition helpers for the ``TT`` op."""

from dpgraph.ops.tt_format import init_tt_cores, matrix_to_tt, tt_svd

__all__ = ["init_tt_cores", "matrix_to_tt", "tt_svd"]
