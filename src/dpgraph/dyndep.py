"""Caffe2's ``dyndep``: loading operator libraries.

dpgraph implements its operators in Python, so there is nothing to load: ``InitOpsLibrary``
accepts the Caffe2 ops libraries whose operators dpgraph provides (Detectron's ops and its
custom-ops example, Gloo, NCCL, the store handlers), after checking those operators are
registered; like Caffe2 it ignores (with a printed note) a library path that does not
exist, and it refuses any other existing library with :class:`~dpgraph.errors.OpsLibraryError`.

Detectron finds its library by file name before calling ``InitOpsLibrary``: it looks for
``lib/libcaffe2_detectron_ops_gpu.so`` under several prefixes, every ``sys.path`` entry among
them.  dpgraph ships that name as a *directory* (holding a README) under
``dpgraph/_opslibs/`` and appends that folder to ``sys.path`` when this module is imported, so
the lookup succeeds; nothing can mistake a directory for a shared object (``dlopen`` refuses
it).  :func:`CreateOpsLibraryMarker` writes such a marker anywhere else a script expects one
(Detectron's custom-ops test asserts ``build/libcaffe2_detectron_custom_ops_gpu.so``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from dpgraph.errors import OpsLibraryError
from dpgraph.ir.registry import OPERATORS
from dpgraph.runtime.c_api import TriggerLazyImport

#: Folder put on ``sys.path`` whose ``lib/`` holds the marker of Detectron's ops library.
MARKER_PREFIX = str(Path(__file__).resolve().parent / "_opslibs")

_DETECTRON_OPS = (
    "AffineChannel", "BatchPermutation", "GroupSpatialSoftmax", "PSRoIPool", "RoIAlign",
    "RoIPoolF", "SampleAs", "SelectSmoothL1Loss", "SigmoidCrossEntropyLoss",
    "SigmoidFocalLoss", "SmoothL1Loss", "SoftmaxFocalLoss", "SpatialNarrowAs",
    "UpsampleNearest",
)

#: (library key pattern, the operators it registers that dpgraph must have).
_LIBRARIES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"^(caffe2_)?detectron_ops(_gpu)?$"),
     _DETECTRON_OPS + tuple(op + "Gradient" for op in _DETECTRON_OPS)),
    (re.compile(r"^(caffe2_)?detectron_custom_ops(_gpu)?$"), ("ZeroEven",)),
    (re.compile(r"^(caffe2_)?gloo(_ops)?(_gpu)?$"),
     ("CreateCommonWorld", "CloneCommonWorld", "DestroyCommonWorld", "Allreduce",
      "Broadcast", "Allgather", "ReduceScatter", "Barrier")),
    (re.compile(r"^(caffe2_)?nccl(_ops)?(_gpu)?$"),
     ("NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLAllGather")),
    (re.compile(r"^(file_)?store_(handler_)?ops$"), ("FileStoreHandlerCreate",)),
    # Caffe2 scripts load this one by a Buck path that never exists (so Caffe2 only prints
    # "Ignoring"); dpgraph accepts it for them and meets through file or TCP stores instead
    (re.compile(r"^redis_store_(handler_)?ops$"), ()),
    (re.compile(r"^tcp_store_(handler_)?ops$"), ("TCPStoreHandlerCreate",)),
)

_loaded: list[str] = []


def _library_key(name: str) -> str:
    """``@/caffe2/caffe2/contrib/gloo:gloo_ops`` -> ``gloo_ops``;
    ``/x/libcaffe2_gloo.so`` -> ``caffe2_gloo``."""
    key = name.rsplit(":", 1)[-1] if name.startswith("@") else os.path.basename(
        name.rstrip("/\\"))
    key = re.sub(r"\.(so|dylib|dll)(\.[0-9.]+)?$", "", key)
    return key[3:] if key.startswith("lib") else key


def _required_ops(name: str) -> tuple[str, ...] | None:
    """The operators library ``name`` registers, or ``None`` if dpgraph does not know it."""
    key = _library_key(str(name))
    for pattern, ops in _LIBRARIES:
        if pattern.match(key):
            return ops
    return None


def is_provided(name: str) -> bool:
    """True if dpgraph implements every operator of the Caffe2 library ``name``."""
    ops = _required_ops(name)
    return ops is not None and not _missing_ops(ops)


def _missing_ops(ops: tuple[str, ...]) -> list[str]:
    return [op for op in ops if op not in OPERATORS]


def InitOpsLibrary(name: str, trigger_lazy: bool = True) -> None:
    """Accept a Caffe2 ops library whose operators dpgraph provides.  Any other library that
    does not exist is ignored with Caffe2's message (its operators fail when used, naming
    the op); one that exists is refused with OpsLibraryError (dpgraph cannot load C++).
    Then, like Caffe2's refresh of the operator registry, run the lazy imports
    (lazy_dyndep) unless ``trigger_lazy`` is false."""
    ops = _required_ops(name)
    if ops is None and not os.path.exists(name):
        print(f"Ignoring {name} as it is not a valid file.")
        return
    if ops is None:
        raise OpsLibraryError(
            f"Cannot load ops library {name!r}: dpgraph runs operators in Python and cannot "
            "load C++ libraries; it provides the operators of Caffe2's Detectron ops "
            "(caffe2_detectron_ops[_gpu], caffe2_detectron_custom_ops[_gpu]), Gloo "
            "(caffe2_gloo, gloo_ops), NCCL (nccl_ops) and store-handler "
            "(file_store_handler_ops, redis_store_handler_ops, tcp_store_handler_ops) "
            "libraries. Port this "
            "library's operators to dpgraph with dpgraph.ir.registry.register_op instead.")
    missing = _missing_ops(ops)
    if missing:
        raise OpsLibraryError(
            f"Cannot load ops library {name!r}: dpgraph does not register its operators "
            f"{', '.join(missing)}; register them with dpgraph.ir.registry.register_op "
            "(import the module that does) before loading the library.")
    if name not in _loaded:
        _loaded.append(name)
    if trigger_lazy:
        TriggerLazyImport()


def GetLoadedLibraries() -> list[str]:
    """The libraries accepted so far, in call order."""
    return list(_loaded)


def GetImportedOpsLibraries() -> set[str]:
    """Caffe2's name for the set of libraries loaded so far."""
    return set(_loaded)


def CreateOpsLibraryMarker(path: str) -> str:
    """Create the marker a script's file lookup expects at ``path`` (a directory with a
    README, never a loadable file) for a library dpgraph provides; return ``path``."""
    if not is_provided(path):
        raise OpsLibraryError(f"Will not create a marker for {path!r}: dpgraph does not "
                              "provide the operators of that library.")
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OpsLibraryError(f"{path!r} exists and is a file (a real library?); leave it "
                              "alone or remove it before creating dpgraph's marker.")
    target.mkdir(parents=True, exist_ok=True)
    (target / "README.txt").write_text(_MARKER_TEXT.format(name=target.name))
    return str(target)


_MARKER_TEXT = """\
{name} is a directory on purpose: a dpgraph marker, not a shared library.
Scripts written for Caffe2 (Detectron) check that this path exists before calling
caffe2.python.dyndep.InitOpsLibrary on it; dpgraph implements the library's operators in
Python, so InitOpsLibrary only checks they are registered. Nothing here can be loaded.
"""


def _expose_marker_prefix() -> None:
    """Append dpgraph's marker prefix to ``sys.path`` (once) for Detectron's lookup."""
    if os.path.isdir(MARKER_PREFIX) and MARKER_PREFIX not in sys.path:
        sys.path.append(MARKER_PREFIX)


_expose_marker_prefix()


def main(argv: list[str] | None = None) -> int:
    """``python -m dpgraph.dyndep marker PATH...``: create ops-library markers."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "marker":
        print("usage: python -m dpgraph.dyndep marker PATH [PATH...]", file=sys.stderr)
        return 2
    for path in args[1:]:
        print(CreateOpsLibraryMarker(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["CreateOpsLibraryMarker", "GetImportedOpsLibraries", "GetLoadedLibraries",
           "InitOpsLibrary", "MARKER_PREFIX"]
