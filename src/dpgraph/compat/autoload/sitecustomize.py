"""Install dpgraph's Caffe2 import alias at interpreter start-up.

``python -m dpgraph.compat.caffe2`` puts this folder first on ``PYTHONPATH``, so the Python
processes a Caffe2 script starts (Detectron's per-GPU test workers, for instance) import
``caffe2`` through the alias too.  The next ``sitecustomize`` on ``sys.path``, if any, still runs.
"""

import importlib.util
import os
import sys


def _install_alias() -> None:
    try:
        from dpgraph.compat import caffe2
    except ImportError:  # dpgraph is not importable in this interpreter: nothing to do
        return
    caffe2.install()


def _run_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_install_alias()
_run_next_sitecustomize()
