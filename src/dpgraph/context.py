"""Caffe2's ``context``: Managed / DefaultManaged thread-local context stacks."""

from dpgraph.jobs.context import DefaultManaged, Managed

__all__ = ["DefaultManaged", "Managed"]
