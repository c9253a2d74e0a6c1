"""The user Python functions behind ``Python`` ops, by token or pickled builder.

``net.Python(f, grad_f)`` (and ``core.CreatePythonOperator``) registers ``f`` under a token
(the op's ``token`` argument) or, for distributed jobs, pickles a builder
``(func, args, kwargs)`` whose call returns ``f`` (``pickled_builder`` /
``pickled_grad_builder``; each distinct builder is called once per process, so ops made
from the same tuple share its state).  The table lives in the IR layer because building a
net refers to it, like op types refer to the operator registry; the ``Python`` kernel
(:mod:`dpgraph.ops.python_op`) resolves its function here.

Security: unpickling runs code named by the bytes, so a pickled builder is only unpickled
when this process made it (``net.Python((func, args, kwargs))`` records the bytes) or the
caller trusts foreign pickles (:func:`allow_untrusted_pickles`, or the environment variable
``DPGRAPH_TRUST_PICKLES=1`` for distributed jobs whose nets come from trusted peers).  A net
read from a file that carries any other pickle raises :class:`UntrustedInputError` when the
op runs; see ``docs/security.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dpgraph.errors import ArgumentError, UntrustedInputError

#: The environment variable that trusts every pickled builder (``1``/``true``/``yes``).
TRUST_ENV = "DPGRAPH_TRUST_PICKLES"

PythonFn = Callable[..., Any]

_LOCK = threading.Lock()
_TOKENS = itertools.count()
_IMPLS: dict[str, tuple[PythonFn, PythonFn | None, bool]] = {}
_BUILT: dict[bytes, PythonFn] = {}
_TRUSTED: set[bytes] = set()  # builders pickled by this process
_ALLOW = {"untrusted": False}


def register_python_impl(f: PythonFn, grad_f: PythonFn | None = None,
                         python_func_type: Any = None, pass_workspace: bool = False) -> str:
    """Register ``f`` (and ``grad_f``) and return the token a ``Python`` op refers to them by.

    With ``python_func_type``, ``python_func_type(f)`` is built once and its ``forward`` and
    ``backward`` methods are used (Caffe2's stateful Python ops).
    """
    if python_func_type is not None:
        obj = python_func_type(f)
        f, grad_f = obj.forward, getattr(obj, "backward", None)
    with _LOCK:
        token = f"python_op_{next(_TOKENS)}"
        _IMPLS[token] = (f, grad_f, pass_workspace)
    return token


def _pickled(builder: Any) -> bytes | str:
    if not isinstance(builder, tuple):
        return ""
    if len(builder) != 3:
        raise ArgumentError("Python op: expected a builder tuple (func, args, kwargs), "
                            f"got a tuple of {len(builder)} items.")
    func, args, kwargs = builder
    data = pickle.dumps((func, tuple(args), dict(kwargs)))
    trust_pickled_builder(data)
    return data


def trust_pickled_builder(data: bytes | str) -> None:
    """Mark the pickled builder ``data`` as made by this process (safe to unpickle)."""
    with _LOCK:
        _TRUSTED.add(_as_bytes(data))


def allow_untrusted_pickles(allow: bool = True) -> None:
    """Unpickle every ``pickled_builder`` from now on (``allow=False`` restores the default:
    only builders this process pickled).  Only for nets from a source you trust: unpickling
    runs arbitrary code."""
    _ALLOW["untrusted"] = bool(allow)


@contextlib.contextmanager
def untrusted_pickles_allowed() -> Iterator[None]:
    """Context manager form of :func:`allow_untrusted_pickles`."""
    previous = _ALLOW["untrusted"]
    _ALLOW["untrusted"] = True
    try:
        yield
    finally:
        _ALLOW["untrusted"] = previous


def untrusted_pickles_allowed_now() -> bool:
    """Whether foreign pickled builders are unpickled (the opt-in or ``DPGRAPH_TRUST_PICKLES``)."""
    env = os.environ.get(TRUST_ENV, "").strip().lower()
    return _ALLOW["untrusted"] or env in ("1", "true", "yes", "on")


def _as_bytes(builder: bytes | str) -> bytes:
    if isinstance(builder, str):  # arguments decode ``s`` with surrogateescape
        return builder.encode("utf-8", "surrogateescape")
    return bytes(builder)


def _message(describe: Callable[[str], str] | None, text: str) -> str:
    return describe(text) if describe is not None else f"Python op: {text}"


def build_pickled(builder: bytes | str,
                  describe: Callable[[str], str] | None = None) -> PythonFn:
    """Unpickle a ``(func, args, kwargs)`` builder and call it, if it may be trusted.

    A builder this process did not pickle raises :class:`UntrustedInputError` unless the
    caller opted in; a malformed pickle raises :class:`ArgumentError`.  ``describe``
    prefixes messages with the op.
    """
    data = _as_bytes(builder)
    with _LOCK:
        trusted = data in _TRUSTED
    if not trusted and not untrusted_pickles_allowed_now():
        raise UntrustedInputError(_message(describe, (
            f"refusing to unpickle its pickled builder ({len(data)} bytes): it was not made "
            "by this process (e.g. the net came from a file or another process), and "
            "unpickling runs arbitrary code. If the net comes from a source you trust, call "
            "dpgraph.ir.python_funcs.allow_untrusted_pickles() or set "
            f"{TRUST_ENV}=1; otherwise remove the Python op.")))
    try:
        func, args, kwargs = pickle.loads(data)  # noqa: S301 - trusted or opted in (above)
    except Exception as error:  # noqa: BLE001 - any unpickling failure is the net's bytes
        raise ArgumentError(_message(describe, (
            f"its pickled builder cannot be unpickled ({type(error).__name__}: {error}); "
            "build the op with net.Python((func, args, kwargs)) where func is importable in "
            "this process."))) from error
    if not callable(func):
        raise ArgumentError(_message(describe, (
            f"its pickled builder holds {type(func).__name__!r}, not a callable (func, args, "
            "kwargs) tuple.")))
    return func(*args, **kwargs)


def python_op_arguments(f: Any, grad_f: Any = None, python_func_type: Any = None,
                        pass_workspace: bool = False) -> dict[str, Any]:
    """The arguments of a ``Python`` op running ``f``: a builder tuple ``(func, args,
    kwargs)`` is pickled (``pickled_builder``), a callable is registered (``token``)."""
    f_builder, grad_builder = _pickled(f), _pickled(grad_f)
    if grad_f and bool(f_builder) != bool(grad_builder):
        raise ArgumentError("Python op: pass a builder tuple as both f and grad_f, or neither.")
    if f_builder:
        return {"pickled_builder": f_builder, "pickled_grad_builder": grad_builder,
                "pass_workspace": pass_workspace}
    return {"token": register_python_impl(f, grad_f, python_func_type, pass_workspace)}


def _built(builder: bytes | str, describe: Callable[[str], str] | None = None) -> PythonFn:
    """The process-wide function of ``builder`` (built once, see :func:`build_pickled`)."""
    data = _as_bytes(builder)
    with _LOCK:
        fn = _BUILT.get(data)
    if fn is None:
        fn = build_pickled(data, describe)
        with _LOCK:
            fn = _BUILT.setdefault(data, fn)
    return fn


def resolve_python_function(args: Mapping[str, Any], grad: bool,
                            describe: Callable[[str], str]) -> tuple[PythonFn, bool]:
    """``(function, pass_workspace)`` of a ``Python`` (``grad=False``) or ``PythonGradient``
    op with decoded arguments ``args``; ``describe`` prefixes error messages with the op."""
    builder = args.get("pickled_grad_builder" if grad else "pickled_builder")
    if builder:
        return _built(builder, describe), bool(int(args.get("pass_workspace", 0)))
    token = args.get("token", "")
    token = token.decode() if isinstance(token, bytes) else str(token)
    if token not in _IMPLS:
        raise ArgumentError(describe(
            f"no Python function is registered under token {token!r}; create the op with "
            "net.Python(f) or core.CreatePythonOperator(f, ...) in this process."))
    f, grad_f, pass_workspace = _IMPLS[token]
    if grad and grad_f is None:
        raise ArgumentError(describe("the Python op was created without grad_f"))
    return (grad_f if grad else f), pass_workspace  # type: ignore[return-value]
