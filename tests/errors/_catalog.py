"""Machinery of the bad-input catalog (test_catalog.py): a case, its environment, and the
fingerprint of everything a failed call must leave as it was (the current workspace's blobs,
placements and nets, the workspaces, the model under test and every file under tmp)."""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import cli, workspace
from dpgraph.errors import CommandError, DpgraphError
from dpgraph.runtime import devices
from dpgraph.runtime.api import current

#: causes that must never leak as the direct cause of a typed error (issue 21)
UNTYPED_CAUSES = (ValueError, MemoryError, TypeError, KeyError, IndexError, AttributeError)


@dataclass
class Env:
    """What a case's setup builds and its call uses."""

    tmp: Path
    model: Any = None
    things: dict[str, Any] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return str(self.tmp / name)


@dataclass(frozen=True)
class Case:
    """One bad input: ``call(env)`` must raise ``error`` whose message holds every ``names``
    fragment (the op, blob, device or file involved) and every ``hint`` fragment (what to
    do); ``{tmp}`` in a fragment is the case's tmp directory."""

    call: Callable[[Env], Any]
    error: type[DpgraphError]
    names: Sequence[str]
    hint: Sequence[str]
    setup: Callable[[Env], Any] | None = None


def case(case_id: str, call: Callable[[Env], Any], error: type[DpgraphError],
         names: Sequence[str], hint: Sequence[str] | str,
         setup: Callable[[Env], Any] | None = None, marks: Any = ()) -> Any:
    hints = (hint,) if isinstance(hint, str) else tuple(hint)
    assert names and hints, f"{case_id}: a case names what is involved and what to do"
    return pytest.param(Case(call, error, tuple(names), hints, setup), id=case_id, marks=marks)


# --- fingerprints ----------------------------------------------------------------------------
def _digest(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        data = (repr(value.tolist()).encode() if value.dtype.kind == "O"
                else np.ascontiguousarray(value).tobytes())
        return ("array", value.dtype.str, value.shape, hashlib.sha256(data).hexdigest())
    if isinstance(value, bytes):
        return ("bytes", hashlib.sha256(value).hexdigest())
    return ("object", type(value).__name__, id(value))


def workspace_fingerprint() -> dict[str, Any]:
    ws = current()
    blobs = {}
    for name in ws.blobs():
        value = ws.get_blob_or_none(name)
        if value is not None and (isinstance(value, bytes) or devices.is_array(value)):
            value = workspace.FetchBlob(name)  # a host copy of a device array
        blobs[name] = (None if value is None else _digest(value), ws.placement(name))
    nets = {name: ws.net(name).proto.SerializeToString(deterministic=True)
            for name in ws.nets()}
    return {"workspaces": sorted(workspace.Workspaces()), "current": ws.name,
            "blobs": blobs, "nets": nets}


def model_fingerprint(model: Any) -> dict[str, Any] | None:
    if model is None:
        return None
    return {
        "net": model.net.Proto().SerializeToString(deterministic=True),
        "init": model.param_init_net.Proto().SerializeToString(deterministic=True),
        "params": [str(p) for p in model.params],
        "param_to_grad": {str(k): str(v) for k, v in model.param_to_grad.items()},
        "attrs": sorted(vars(model)),
    }


def files_fingerprint(root: Path) -> dict[str, str]:
    result = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        result[key] = ("dir" if path.is_dir() else
                       hashlib.sha256(path.read_bytes()).hexdigest())
    return result


def fingerprint(env: Env) -> dict[str, Any]:
    return {"workspace": workspace_fingerprint(), "model": model_fingerprint(env.model),
            "files": files_fingerprint(env.tmp)}


# --- the check -------------------------------------------------------------------------------
def check_case(item: Case, env: Env) -> BaseException:
    """Run one case with the three checks: typed error, message, nothing changed."""
    if item.setup is not None:
        item.setup(env)
    before = fingerprint(env)
    with pytest.raises(DpgraphError) as info:
        item.call(env)
    error = info.value
    assert isinstance(error, item.error), f"{type(error).__mro__} is not {item.error}"
    cause = error.__cause__
    assert type(cause) not in UNTYPED_CAUSES, f"untyped cause leaks: {cause!r}"
    message = str(error)
    for fragment in (*item.names, *item.hint):
        fragment = fragment.format(tmp=env.tmp)
        assert fragment in message, f"message lacks {fragment!r}: {message}"
    assert fingerprint(env) == before, "the failed call changed the workspace, model or files"
    return error


# --- the CLI ---------------------------------------------------------------------------------
class CliFailure(CommandError):
    """The catalog's view of a CLI run that failed as it should: exit status 2 (the user's
    input) and a one-line ``dpgraph <command>: error: ...`` or argparse usage error on
    stderr, no traceback.  The message is that stderr text."""


def run_cli(argv: Sequence[str]) -> None:
    """Run ``dpgraph argv``; raise :class:`CliFailure` with stderr when it failed cleanly."""
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
    text = stderr.getvalue()
    assert "Traceback" not in text, text
    if code == 2 and "error:" in text:
        raise CliFailure(text)
    raise AssertionError(f"dpgraph {list(argv)} exited {code}: {text}")
