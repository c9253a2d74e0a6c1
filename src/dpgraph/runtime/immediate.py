"""Caffe2's immediate mode: every operator is also run, as it is created, in a separate
workspace (``_CAFFE2_IMMEDIATE``) whose root folder is a fresh temporary directory.

``StartImmediate`` / ``StopImmediate`` switch it; ``ImmediateBlobs``, ``FetchImmediate``,
``FeedImmediate`` and ``RunOperatorImmediate`` reach that workspace without disturbing the
current one.  Operators reach it through :data:`dpgraph.ir.operator.CREATE_HOOKS` when
that hook list exists (``core.CreateOperator`` calls each hook with the new OperatorDef).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from dpgraph.runtime import api

IMMEDIATE_WORKSPACE = "_CAFFE2_IMMEDIATE"
_state: dict[str, Any] = {"on": False, "root": ""}


def immediate_root_folder() -> str:
    """The immediate workspace's root folder ('' when immediate mode is off)."""
    return str(_state["root"])


def IsImmediate() -> bool:
    return bool(_state["on"])


def _hooks() -> list[Any] | None:
    from dpgraph.ir import operator

    return getattr(operator, "CREATE_HOOKS", None)


def _run_created(op: Any) -> None:
    if IsImmediate():
        RunOperatorImmediate(op)


def StartImmediate(i_know: bool = False) -> None:
    """Turn immediate mode on (a leftover immediate workspace is cleared first)."""
    if IsImmediate():
        StopImmediate()
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        _state["root"] = tempfile.mkdtemp(prefix="dpgraph_immediate_")
        api.ResetWorkspace(_state["root"])
    _state["on"] = True
    hooks = _hooks()
    if hooks is not None and _run_created not in hooks:
        hooks.append(_run_created)
    if not i_know:
        print("Immediate mode is on: every operator you create also runs, now, in a "
              "separate workspace (workspace.ImmediateBlobs / FetchImmediate show its "
              "blobs). It is meant for debugging and is slow; StopImmediate() ends it.")


def StopImmediate() -> None:
    """Turn immediate mode off, clearing its workspace and deleting its root folder."""
    if not IsImmediate():
        return
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        api.ResetWorkspace()
    shutil.rmtree(_state["root"], ignore_errors=True)
    _state.update(on=False, root="")
    hooks = _hooks()
    if hooks is not None and _run_created in hooks:
        hooks.remove(_run_created)


def ImmediateBlobs() -> list[str]:
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return api.Blobs()


def RunOperatorImmediate(op: Any) -> bool:
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return api.RunOperatorOnce(op)


def FetchImmediate(*args: Any, **kwargs: Any) -> Any:
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return api.FetchBlob(*args, **kwargs)


def FeedImmediate(*args: Any, **kwargs: Any) -> bool:
    with api.WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return api.FeedBlob(*args, **kwargs)
