"""Caffe2's ``optimizer_test_util``: the mix-in test cases for optimizer builders."""

from dpgraph.modeling.optimizer.test_bases import LRModificationTestBase, OptimizerTestBase

__all__ = ["LRModificationTestBase", "OptimizerTestBase"]
