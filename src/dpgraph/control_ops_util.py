"""Caffe2's ``control_ops_util``: If/While ops over nets, with Do scopes."""

from dpgraph.jobs.control_ops_util import add_if_op, add_while_op, get_external_blob_names

__all__ = ["add_if_op", "add_while_op", "get_external_blob_names"]
