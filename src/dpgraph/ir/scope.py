"""Name and device scopes (Caffe2's ``scope`` module), built on ``contextvars``.

Scopes are per thread and per asyncio task, and are restored on exit even when the body
raises.  ``NameScope('gpu_0')`` prefixes every blob name created inside it with ``gpu_0/``;
``DeviceScope(opt)`` gives every op created inside it that device option.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

from dpgraph.errors import ScopeError
from dpgraph.proto import caffe2_pb2

_NAMESCOPE_SEPARATOR = "/"
_T = TypeVar("_T")

_namescope: contextvars.ContextVar[str] = contextvars.ContextVar("dpgraph_namescope", default="")
_devicescope: contextvars.ContextVar[caffe2_pb2.DeviceOption | None] = contextvars.ContextVar(
    "dpgraph_devicescope", default=None
)


@contextlib.contextmanager
def _value_within(var: contextvars.ContextVar[_T], value: _T) -> Iterator[None]:
    """Set ``var`` to ``value`` inside the block; the old value comes back even on errors."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def CurrentNameScope() -> str:
    """The current name prefix: ``''`` or a string ending with ``'/'``."""
    return _namescope.get()


def CurrentDeviceScope() -> caffe2_pb2.DeviceOption | None:
    """The current device option, or ``None`` outside any device scope."""
    return _devicescope.get()


@contextlib.contextmanager
def NameScope(prefix: str | bytes | None, reset: bool = False) -> Iterator[None]:
    """Prefix blob names with ``prefix + '/'`` (nested scopes concatenate).

    ``reset=True`` replaces the current scope instead of extending it, so
    ``NameScope('', reset=True)`` clears it.  No normalisation happens: ``NameScope('a/')``
    gives ``'a//'``, as in Caffe2.
    """
    if isinstance(prefix, bytes):
        prefix = prefix.decode("utf-8")
    if prefix is not None and not isinstance(prefix, str):
        raise ScopeError(
            f"NameScope takes a str (or None), got {type(prefix).__name__} {prefix!r}; "
            "pass the scope name as a string."
        )
    piece = prefix + _NAMESCOPE_SEPARATOR if prefix else ""
    token = _namescope.set(piece if reset else _namescope.get() + piece)
    try:
        yield
    finally:
        _namescope.reset(token)


@contextlib.contextmanager
def DeviceScope(
    scope: caffe2_pb2.DeviceOption | None, node_name: str | None = None
) -> Iterator[None]:
    """Give ops created inside the block the device option ``scope``.

    An outer scope's ``node_name`` is inherited when ``scope`` has none, and its
    ``extra_info`` entries are appended and the list sorted, as in late Caffe2.
    """
    new_scope = caffe2_pb2.DeviceOption()
    if scope:  # Caffe2 tests truthiness: DeviceScope(0, node_name=...) sets only the node
        if not isinstance(scope, caffe2_pb2.DeviceOption):
            raise ScopeError(
                f"DeviceScope takes a caffe2_pb2.DeviceOption, got {type(scope).__name__}; "
                "build one with core.DeviceOption(device_type, device_id)."
            )
        new_scope.CopyFrom(scope)
    elif not node_name:
        raise ScopeError("DeviceScope needs a DeviceOption or a node_name.")
    if node_name:
        new_scope.node_name = node_name
    old = _devicescope.get()
    if old is not None:
        if old.node_name and not new_scope.node_name:
            new_scope.node_name = old.node_name
        if old.extra_info:  # appended, then sorted (duplicates kept), as in Caffe2
            merged = sorted([*new_scope.extra_info, *old.extra_info])
            del new_scope.extra_info[:]
            new_scope.extra_info.extend(merged)
    token = _devicescope.set(new_scope)
    try:
        yield
    finally:
        _devicescope.reset(token)


@contextlib.contextmanager
def EmptyDeviceScope() -> Iterator[None]:
    """Clear the device scope inside the block."""
    with _value_within(_devicescope, None):
        yield


@contextlib.contextmanager
def EmptyNameScope() -> Iterator[None]:
    """Clear the name scope inside the block."""
    with _value_within(_namescope, ""):
        yield
