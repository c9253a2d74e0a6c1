"""Untrusted files: loading and running a NetDef, predictor, DB or checkpoint never
unpickles a Python op's builder (which would run code named by the file) unless the caller
opts in; builders this process pickled itself keep working."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError, DpgraphError
from dpgraph.ir import python_funcs
from dpgraph.ir.proto_io import parse_proto, read_proto, write_proto
from dpgraph.ir.python_funcs import (
    UntrustedInputError,
    allow_untrusted_pickles,
    build_pickled,
    resolve_python_function,
    untrusted_pickles_allowed,
)
from dpgraph.proto import caffe2_pb2

#: Side effects a hostile pickle would cause; must stay empty unless opted in.
PWNED: list[str] = []


def _noop(inputs, outputs) -> None:
    for output in outputs:
        output.reshape([1])


def _pwn(tag: str) -> Any:
    """What unpickling a hostile builder runs; returns a builder of a no-op function."""
    PWNED.append(tag)
    return lambda: _noop


class Hostile:
    """Unpickling an instance calls ``_pwn`` (what a malicious file would do)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> Any:
        return (_pwn, (self.tag,))


def make_adder(value: float) -> Any:
    def add(inputs, outputs) -> None:
        outputs[0].reshape(inputs[0].shape)
        outputs[0].data[...] = inputs[0].data + value
    return add


def _hostile_builder(tag: str) -> bytes:
    """A ``(func, args, kwargs)`` pickle whose loading itself runs ``_pwn``."""
    return pickle.dumps((Hostile(tag), (), {}))


def _hostile_net(tag: str, name: str = "hostile") -> caffe2_pb2.NetDef:
    """A NetDef as a file would carry it: a Python op with a foreign pickled builder."""
    op = core.CreateOperator("Python", [], ["y"], pickled_builder=_hostile_builder(tag),
                             pickled_grad_builder=b"")
    net = caffe2_pb2.NetDef(name=name)
    net.op.extend([op])
    net.external_output.append("y")
    return parse_proto(caffe2_pb2.NetDef, net.SerializeToString(), "<file>")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(python_funcs.TRUST_ENV, raising=False)
    allow_untrusted_pickles(False)
    PWNED.clear()
    workspace.ResetWorkspace()
    yield
    allow_untrusted_pickles(False)
    workspace.ResetWorkspace()


def _chain(error: BaseException) -> list[BaseException]:
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


# --- the resolver (ir.python_funcs) -------------------------------------------------------
def test_foreign_builder_refused_before_unpickling() -> None:
    with pytest.raises(UntrustedInputError) as info:
        build_pickled(_hostile_builder("resolve"), lambda m: f"Python op 'y': {m}")
    assert PWNED == []
    message = str(info.value)
    assert "Python op 'y'" in message and "allow_untrusted_pickles" in message
    assert python_funcs.TRUST_ENV in message
    assert isinstance(info.value, DpgraphError) and isinstance(info.value, PermissionError)


def test_resolver_refuses_foreign_builder_in_args() -> None:
    args = {"pickled_builder": _hostile_builder("args").decode("utf-8", "surrogateescape")}
    with pytest.raises(UntrustedInputError):
        resolve_python_function(args, False, lambda m: m)
    assert PWNED == []


def test_own_builder_is_trusted_and_opt_in_trusts_foreign() -> None:
    own = python_funcs.python_op_arguments((make_adder, [1.0], {}))["pickled_builder"]
    assert callable(build_pickled(own))
    with untrusted_pickles_allowed():
        build_pickled(_hostile_builder("ctx"))
    assert PWNED == ["ctx"]
    with pytest.raises(UntrustedInputError):  # the context manager restored the default
        build_pickled(_hostile_builder("after"))
    allow_untrusted_pickles()
    build_pickled(_hostile_builder("call"))
    assert PWNED == ["ctx", "call"]


def test_env_variable_opts_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(python_funcs.TRUST_ENV, "0")
    with pytest.raises(UntrustedInputError):
        build_pickled(_hostile_builder("env0"))
    monkeypatch.setenv(python_funcs.TRUST_ENV, "1")
    build_pickled(_hostile_builder("env1"))
    assert PWNED == ["env1"]


@pytest.mark.parametrize("data", [b"", b"\x80\x04garbage", pickle.dumps(42),
                                  pickle.dumps((1, 2)), pickle.dumps((3, (), {}))])
def test_malformed_trusted_builder_is_typed(data: bytes) -> None:
    with untrusted_pickles_allowed(), pytest.raises(ArgumentError, match="pickled builder"):
        build_pickled(data)


# --- loaders end to end ----------------------------------------------------------------
def test_netdef_file_with_python_op_does_not_run_code(tmp_path: Path) -> None:
    write_proto(_hostile_net("netdef"), tmp_path / "net.pb")
    net = read_proto(caffe2_pb2.NetDef, tmp_path / "net.pb")
    with pytest.raises(DpgraphError) as info:
        workspace.RunNetOnce(net)
    assert PWNED == []
    assert any(isinstance(e, UntrustedInputError) for e in _chain(info.value))
    assert "Python" in str(info.value)


def test_text_format_net_with_python_op_does_not_run_code() -> None:
    from dpgraph.ir.text import format_net, parse_net

    net = parse_net(format_net(_hostile_net("text")))
    with pytest.raises(DpgraphError) as info:
        workspace.RunNetOnce(net)
    assert PWNED == []
    assert any(isinstance(e, UntrustedInputError) for e in _chain(info.value))


def test_predictor_with_python_op_in_init_net_does_not_run_code(tmp_path: Path) -> None:
    from dpgraph.export.predictor import INIT_NET_FILE, PREDICT_NET_FILE, load_predictor

    predict = caffe2_pb2.NetDef(name="predict")
    write_proto(predict, tmp_path / PREDICT_NET_FILE)
    write_proto(_hostile_net("predictor", "init"), tmp_path / INIT_NET_FILE)
    with pytest.raises(DpgraphError) as info:
        load_predictor(tmp_path)
    assert PWNED == []
    assert any(isinstance(e, UntrustedInputError) for e in _chain(info.value))


def test_opt_in_runs_foreign_net() -> None:
    with untrusted_pickles_allowed():
        workspace.RunNetOnce(_hostile_net("optin"))
    assert PWNED == ["optin"]


def test_in_process_builder_still_runs_after_proto_round_trip() -> None:
    net = core.Net("own")
    net.Python((make_adder, [2.0], {}))(["x"], ["y"])
    proto = parse_proto(caffe2_pb2.NetDef, net.Proto().SerializeToString(), "<bytes>")
    workspace.FeedBlob("x", np.ones(3, np.float32))
    workspace.RunNetOnce(proto)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [3.0, 3.0, 3.0])


def test_blob_holding_a_pickle_loads_as_bytes(tmp_path: Path) -> None:
    """Save/Load (minidb) and checkpoints keep string blobs as bytes: nothing unpickles."""
    from dpgraph.checkpoint import read_checkpoint, save_checkpoint

    payload = pickle.dumps(Hostile("blob"))
    workspace.FeedBlob("s", np.array([payload], dtype=object))
    db = str(tmp_path / "blobs.minidb")
    workspace.RunOperatorOnce(core.CreateOperator("Save", ["s"], [], db=db, db_type="minidb",
                                                  absolute_path=True))
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("Load", [], ["s"], db=db, db_type="minidb",
                                                  absolute_path=True))
    assert PWNED == []
    loaded = workspace.FetchBlob("s")
    assert bytes(np.asarray(loaded).reshape(-1)[0]) == payload
    save_checkpoint(tmp_path / "ck.pb", ["s"])
    values = read_checkpoint(tmp_path / "ck.pb")
    assert PWNED == [] and bytes(np.asarray(values["s"]).reshape(-1)[0]) == payload


# --- static guard: no loader grows a code-running path ------------------------------------
_SRC = Path(python_funcs.__file__).resolve().parents[1]
_RISKY = ("pickle.load", "pickle.Unpickler", "marshal.load", "eval(", "exec(", "torch.load",
          "allow_pickle=True", "__import__(", "import_module(", "ctypes", "CDLL", "yaml.load",
          "shelve", "dill", "cloudpickle")
#: Where a risky call is intended, and why it is safe.
_ALLOWED = {
    "ir/python_funcs.py": {"pickle.load"},  # behind build_pickled's trust check
    "ops/__init__.py": {"import_module("},  # dpgraph's fixed op family names
    "collectives/registry.py": {"import_module("},  # modules registered in code
    "parallel/plan/command.py": {"import_module("},  # the CLI's module:attr argument
    # the caffe2.python alias (dpgraph modules) and its runner's -c CODE (as python -c)
    "compat/caffe2.py": {"import_module(", "exec("},
}


def _risky_uses() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(_SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        hits = {pattern for pattern in _RISKY if pattern in text}
        if hits:
            found[path.relative_to(_SRC).as_posix()] = hits
    return found


def test_no_unexpected_code_running_calls_in_dpgraph() -> None:
    unexpected = {name: hits - _ALLOWED.get(name, set())
                  for name, hits in _risky_uses().items()}
    unexpected = {name: sorted(hits) for name, hits in unexpected.items() if hits}
    unexpected.pop("ops/python_op.py", None)  # checked by the test below
    assert not unexpected, (f"new code-running calls {unexpected}: route them through a "
                            "trust check and document them in docs/security.md")


def test_python_op_kernel_does_not_unpickle_itself() -> None:
    assert "pickle.load" not in _risky_uses().get("ops/python_op.py", set())
