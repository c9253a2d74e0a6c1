"""The user Python functions behind ``Python`` ops, by token or pickled builder.

``net.Python(f, grad_f)`` (and ``core.CreatePythonOperator``) registers ``f`` under a token
(the op's ``token`` argument) or, for distributed jobs, pickles a builder
``(func, args, kwargs)`` whose call returns ``f`` (``pickled_builder`` /
``pickled_grad_builder``; each distinct builder is called once per process, so ops made
from the same tuple share its state).  The table lives in the IR layer because building a
net refers to it, like op types refer to the operator registry; the ``Python`` kernel
(:mod:`dpgraph.ops.python_op`) resolves its function here.
"""

from __future__ import annotations

import itertools
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dpgraph.errors import ArgumentError

PythonFn = Callable[..., Any]

_LOCK = threading.Lock()
_TOKENS = itertools.count()
_IMPLS: dict[str, tuple[PythonFn, PythonFn | None, bool]] = {}
_BUILT: dict[bytes, PythonFn] = {}


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
    return pickle.dumps((func, tuple(args), dict(kwargs)))


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


def _built(builder: bytes | str) -> PythonFn:
    if isinstance(builder, str):  # arguments decode ``s`` with surrogateescape
        builder = builder.encode("utf-8", "surrogateescape")
    with _LOCK:
        fn = _BUILT.get(builder)
        if fn is None:
            func, args, kwargs = pickle.loads(builder)
            fn = _BUILT[builder] = func(*args, **kwargs)
    return fn


def resolve_python_function(args: Mapping[str, Any], grad: bool,
                            describe: Callable[[str], str]) -> tuple[PythonFn, bool]:
    """``(function, pass_workspace)`` of a ``Python`` (``grad=False``) or ``PythonGradient``
    op with decoded arguments ``args``; ``describe`` prefixes error messages with the op."""
    builder = args.get("pickled_grad_builder" if grad else "pickled_builder")
    if builder:
        return _built(builder), bool(int(args.get("pass_workspace", 0)))
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
