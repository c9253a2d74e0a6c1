"""Caffe2's ``lazy_dyndep``: operator libraries loaded when operators are first needed."""

from dpgraph import dyndep
from dpgraph.jobs.lazy_dyndep import (
    GetImportedOpsLibraries,
    RegisterOpsLibrary,
    SetErrorHandler,
    set_loader,
)

set_loader(dyndep.InitOpsLibrary, dyndep.GetLoadedLibraries)

__all__ = ["GetImportedOpsLibraries", "RegisterOpsLibrary", "SetErrorHandler"]
