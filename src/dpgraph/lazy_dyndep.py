"""Caffe2's ``lazy_dyndep``: operator libraries loaded when operators are first needed."""

from dpgraph.jobs.lazy_dyndep import GetImportedOpsLibraries, RegisterOpsLibrary, SetErrorHandler

__all__ = ["GetImportedOpsLibraries", "RegisterOpsLibrary", "SetErrorHandler"]
