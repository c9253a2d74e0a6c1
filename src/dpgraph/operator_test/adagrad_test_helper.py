"""Caffe2's ``operator_test.adagrad_test_helper``: the Adagrad reference and sparse check."""

from dpgraph.modeling.optimizer.adagrad_reference import adagrad_sparse_test_helper, ref_adagrad

__all__ = ["adagrad_sparse_test_helper", "ref_adagrad"]
