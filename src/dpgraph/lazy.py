"""Caffe2's ``lazy``: functions run before operators are looked up."""

from dpgraph.runtime.c_api import RegisterLazyImport, TriggerLazyImport

__all__ = ["RegisterLazyImport", "TriggerLazyImport"]
