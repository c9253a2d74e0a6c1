"""Caffe2's ``dyndep``: loading operator libraries.

dpgraph implements its operators in Python, so there is nothing to load; but scripts call
``dyndep.InitOpsLibrary`` for Caffe2's Gloo, NCCL and store-handler libraries, whose ops
dpgraph provides.  Those names are accepted (and remembered); any other library (custom
C++ ops such as Detectron's) is refused with :class:`~dpgraph.errors.OpsLibraryError`.
"""

from __future__ import annotations

import os
import re

from dpgraph.errors import OpsLibraryError

_PROVIDED = (
    re.compile(r"^(caffe2_)?gloo(_ops)?(_gpu)?$"),
    re.compile(r"^(caffe2_)?nccl(_ops)?(_gpu)?$"),
    re.compile(r"^((file|redis|tcp)_)?store_(handler_)?ops$"),
)

_loaded: list[str] = []


def _library_key(name: str) -> str:
    """``@/caffe2/caffe2/contrib/gloo:gloo_ops`` -> ``gloo_ops``;
    ``/x/libcaffe2_gloo.so`` -> ``caffe2_gloo``."""
    key = name.rsplit(":", 1)[-1] if name.startswith("@") else os.path.basename(name)
    key = re.sub(r"\.(so|dylib|dll)(\.[0-9.]+)?$", "", key)
    return key[3:] if key.startswith("lib") else key


def is_provided(name: str) -> bool:
    """True if dpgraph already implements the ops of the Caffe2 library ``name``."""
    key = _library_key(str(name))
    return any(pattern.match(key) for pattern in _PROVIDED)


def InitOpsLibrary(name: str, trigger_lazy: bool = True) -> None:
    """Accept one of Caffe2's Gloo/NCCL/store-handler libraries; refuse anything else."""
    if not is_provided(name):
        raise OpsLibraryError(
            f"Cannot load ops library {name!r}: dpgraph runs operators in Python and only "
            "provides the ops of Caffe2's Gloo, NCCL and store-handler libraries "
            "(caffe2_gloo, gloo_ops, nccl_ops, file_store_handler_ops, "
            "redis_store_handler_ops). Port the library's operators to dpgraph with "
            "dpgraph.ir.registry.register_op instead."
        )
    if name not in _loaded:
        _loaded.append(name)


def GetLoadedLibraries() -> list[str]:
    """The libraries accepted so far, in call order."""
    return list(_loaded)


__all__ = ["GetLoadedLibraries", "InitOpsLibrary"]
