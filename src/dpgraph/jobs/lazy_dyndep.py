"""Caffe2's ``lazy_dyndep``: register operator libraries now, load them when operators
are first needed (``core.RefreshRegisteredOperators``, ``workspace.CreateNet``).

Loading goes through the loader the facade installs (:func:`dpgraph.dyndep.InitOpsLibrary`,
which accepts the libraries whose operators dpgraph provides and refuses others); a failure
goes to the handler set with :func:`SetErrorHandler` (and is logged, not raised, without
one).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from dpgraph.runtime.c_api import RegisterLazyImport

logger = logging.getLogger("dpgraph.lazy_dyndep")

_pending: set[str] = set()
_lock = threading.Lock()
_error_handler: list[Callable[[BaseException], Any] | None] = [None]
#: ``(load(name, trigger_lazy=...), loaded() -> list)``, installed by set_loader.
_loader: list[tuple[Callable[..., Any], Callable[[], list[str]]]] = []


def set_loader(load: Callable[..., Any], loaded: Callable[[], list[str]]) -> None:
    """Install the function that loads a library and the one listing loaded libraries."""
    _loader[:] = [(load, loaded)]


def _get_loader() -> tuple[Callable[..., Any], Callable[[], list[str]]]:
    if not _loader:
        raise RuntimeError("lazy_dyndep has no library loader; import dpgraph.lazy_dyndep "
                           "(the facade installs dpgraph.dyndep's).")
    return _loader[0]


def RegisterOpsLibrary(name: str) -> None:
    """Register library ``name`` to be loaded lazily (a missing path is ignored)."""
    if not os.path.exists(name):
        print(f"Ignoring {name} as it is not a valid file.")
        return
    with _lock:
        _pending.add(name)


def SetErrorHandler(handler: Callable[[BaseException], Any] | None) -> None:
    """``handler(exception)`` is called when loading a registered library fails."""
    _error_handler[0] = handler


def GetImportedOpsLibraries() -> list[str]:
    """The libraries loaded so far (the pending ones are loaded first)."""
    _import_pending()
    return _get_loader()[1]()


def _import_pending() -> None:
    with _lock:
        names = sorted(_pending)
    for name in names:
        try:
            _get_loader()[0](name, trigger_lazy=False)
        except Exception as error:  # noqa: BLE001 - handed to the user's handler
            handler = _error_handler[0]
            if handler is None:
                logger.warning("lazy_dyndep: could not load %s: %s", name, error)
            else:
                handler(error)
        finally:
            with _lock:
                _pending.discard(name)


RegisterLazyImport(_import_pending)

__all__ = ["GetImportedOpsLibraries", "RegisterOpsLibrary", "SetErrorHandler"]
