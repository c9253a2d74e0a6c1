"""The Caffe2 import alias: make ``caffe2.python.*`` and ``caffe2.proto.*`` resolve to dpgraph.

Either call :func:`install` before the script imports Caffe2::

    from dpgraph.compat import caffe2 as caffe2_alias
    caffe2_alias.install()
    from caffe2.python import core, workspace, data_parallel_model   # dpgraph modules

or run the script unchanged with ``python -m dpgraph.compat.caffe2 SCRIPT [ARGS]``.

``caffe2.python.X`` is ``dpgraph.X`` (the very same module object), resolved lazily at
import time, so modules that do not exist yet fail only when a script imports them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from collections.abc import Sequence
from typing import Any

_PACKAGES = ("caffe2", "caffe2.python", "caffe2.proto")
_SPECIAL = {
    "caffe2.proto": "dpgraph.proto",
    "caffe2.python._import_c_extension": "dpgraph.runtime.c_api",
    "caffe2.python.caffe2_pybind11_state": "dpgraph.runtime.c_api",
    "caffe2.python.helpers": "dpgraph.modeling.brew",
    "caffe2.python.modeling": "dpgraph.modeling",
}


def target_of(fullname: str) -> str | None:
    """The dpgraph module a ``caffe2...`` module name maps to (``None``: not aliased)."""
    if fullname in _SPECIAL:
        return _SPECIAL[fullname]
    for alias, target in _SPECIAL.items():
        if fullname.startswith(alias + "."):
            return target + fullname[len(alias):]
    if fullname.startswith("caffe2.python."):
        return "dpgraph." + fullname[len("caffe2.python."):]
    return None


class _PackageLoader(importlib.abc.Loader):
    """Empty namespace-like packages ``caffe2``, ``caffe2.python`` and ``caffe2.proto``."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"dpgraph alias package for {spec.name}")
        module.__path__ = []
        module.__dpgraph_alias__ = True  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: submodules are resolved by the finder."""


class _AliasLoader(importlib.abc.Loader):
    """Returns the dpgraph module itself and keeps its own ``__spec__`` intact."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # the import system overwrote it with the alias spec


class Caffe2AliasFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder mapping ``caffe2`` module names to dpgraph modules."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _PackageLoader(),
                                                  is_package=True)
        dp_name = target_of(fullname)
        if dp_name is None:
            return None
        target_spec = _find_dpgraph_spec(dp_name)
        if target_spec is None:
            return _caffe2_tree_spec(fullname)
        # mirror the target's package-ness, or the import system would give a plain
        # module a __path__
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(dp_name),
            is_package=target_spec.submodule_search_locations is not None)


def _find_dpgraph_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent package dpgraph does not have
        return None


def _caffe2_tree_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    """A ``caffe2.python`` module dpgraph does not provide, from a Caffe2 source tree on
    ``sys.path`` (Caffe2's own test files and their helpers, e.g.
    ``caffe2.python.test.executor_test_util``), so its tests run from a checkout as they
    are; dpgraph's modules always win."""
    if not fullname.startswith("caffe2.python."):
        return None
    parts = fullname.split(".")[2:]
    for root in _caffe2_python_dirs():
        spec = importlib.machinery.PathFinder.find_spec(
            fullname, [os.path.join(root, *parts[:-1])])
        if spec is not None:
            return spec
    return None


def _caffe2_python_dirs() -> list[str]:
    """The ``caffe2/python`` folders of Caffe2 source trees reachable from ``sys.path``:
    ``<entry>/caffe2/python``, or an entry inside such a folder."""
    found: list[str] = []
    for entry in sys.path:
        path = os.path.abspath(entry or os.getcwd())
        candidates = [os.path.join(path, "caffe2", "python")]
        while os.path.basename(path) and path != os.path.dirname(path):
            if os.path.basename(path) == "python" and \
                    os.path.basename(os.path.dirname(path)) == "caffe2":
                candidates.append(path)
            path = os.path.dirname(path)
        found += [c for c in candidates if c not in found and os.path.isdir(c)]
    return found


_FINDER = Caffe2AliasFinder()


def is_installed() -> bool:
    return _FINDER in sys.meta_path


def install() -> None:
    """Route ``import caffe2...`` to dpgraph (idempotent).

    Raises ImportError if a real Caffe2 was imported already in this process.
    """
    existing = sys.modules.get("caffe2")
    if existing is not None and not getattr(existing, "__dpgraph_alias__", False):
        raise ImportError(
            "A real caffe2 package is already imported; call "
            "dpgraph.compat.caffe2.install() before anything imports caffe2."
        )
    if not is_installed():
        sys.meta_path.insert(0, _FINDER)
    _restore_numpy_aliases()


#: numpy names Caffe2's Python (and its tests) use that numpy 2 removed, with their meaning.
_NUMPY_ALIASES: dict[str, Any] = {
    "str": str, "float": float, "int": int, "object": object, "bool": bool,
    "long": int, "unicode": str, "asscalar": lambda a: a.item(),
    "unicode_": "str_", "string_": "bytes_", "float_": "float64", "complex_": "complex128",
    "Inf": "inf", "Infinity": "inf", "NaN": "nan", "infty": "inf", "PINF": "inf",
    "product": "prod", "cumproduct": "cumprod", "sometrue": "any", "alltrue": "all",
    "round_": "round",
}


def _restore_numpy_aliases() -> None:
    """Give numpy back the removed aliases Caffe2 code calls (``np.str``, ``np.float``,
    ``np.asscalar``...), each only where numpy lacks it; dpgraph itself uses none."""
    import numpy as np

    for name, value in _NUMPY_ALIASES.items():
        if name not in np.__dict__:  # a string names numpy's own current spelling
            setattr(np, name, getattr(np, value) if isinstance(value, str) else value)


def uninstall() -> None:
    """Remove the alias and forget every aliased ``caffe2`` module."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == "caffe2" or n.startswith("caffe2.")]:
        del sys.modules[name]


#: Folder whose ``sitecustomize.py`` installs the alias in every Python process started with it
#: on ``PYTHONPATH``.
AUTOLOAD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autoload")


def propagate_to_child_processes() -> None:
    """Put :data:`AUTOLOAD_DIR` first on ``PYTHONPATH`` (of this process's environment), so
    Python processes the script starts import ``caffe2`` through the alias as well."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if AUTOLOAD_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([AUTOLOAD_DIR, *paths])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpgraph.compat.caffe2 SCRIPT [ARGS]``, ``... -m MODULE [ARGS]`` or
    ``... -c CODE [ARGS]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m dpgraph.compat.caffe2 SCRIPT [ARGS...]\n"
              "       python -m dpgraph.compat.caffe2 -m MODULE [ARGS...]\n"
              "       python -m dpgraph.compat.caffe2 -c CODE [ARGS...]\n"
              "Runs a Caffe2 script with caffe2.python.* resolved to dpgraph.")
        return 0 if args else 2
    install()
    propagate_to_child_processes()
    if args[0] == "-m" and len(args) > 1:
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c" and len(args) > 1:
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        saved_path = list(sys.path)
        # like ``python SCRIPT``: the script's folder (not the current one) is sys.path[0],
        # so the script's sibling modules import
        script_dir = os.path.dirname(os.path.abspath(args[0]))
        if sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path[0] = script_dir
        else:
            sys.path.insert(0, script_dir)
        try:
            runpy.run_path(args[0], run_name="__main__")
        finally:
            sys.path[:] = saved_path
    return 0


if __name__ == "__main__":
    from dpgraph.compat.caffe2 import main as _main

    sys.exit(_main())
