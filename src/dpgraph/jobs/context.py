"""Caffe2's ``context``: thread-local stacks of "current" objects per class.

``with obj:`` makes ``obj`` the current instance of its class and of every ``Managed``
base class it has; ``Cls.current()`` returns the innermost one.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from dpgraph.errors import ScopeError


class _ContextInfo:
    """The stack of one class, per thread."""

    def __init__(self, cls: type, allow_default: bool) -> None:
        self.cls = cls
        self.allow_default = allow_default
        self._local = threading.local()

    @property
    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "obj"):
            self._local.obj = []
        return self._local.obj

    def enter(self, value: Any) -> None:
        self._stack.append(value)

    def exit(self, value: Any) -> None:
        if not self._stack or self._stack[-1] is not value:
            raise ScopeError(f"Context {self.cls.__name__}: {value!r} is not the innermost "
                             "active context; exit contexts in the reverse order of entry.")
        self._stack.pop()

    def get_active(self, required: bool = True) -> Any:
        if not self._stack:
            if self.allow_default:
                self.enter(self.cls())
            elif required:
                raise ScopeError(
                    f"Context {self.cls.__name__} is required but none is active.")
            else:
                return None
        return self._stack[-1]


class _ContextRegistry:
    def __init__(self) -> None:
        self._ctxs: dict[type, _ContextInfo] = {}
        self._lock = threading.Lock()

    def get(self, cls: type) -> _ContextInfo:
        with self._lock:
            if cls not in self._ctxs:
                self._ctxs[cls] = _ContextInfo(cls, issubclass(cls, DefaultManaged))
            return self._ctxs[cls]


_CONTEXT_REGISTRY = _ContextRegistry()


def _get_managed_classes(obj: Any) -> list[type]:
    return [cls for cls in type(obj).__mro__
            if issubclass(cls, Managed) and cls not in (Managed, DefaultManaged)]


class Managed:
    """Base of classes whose instances can be the current one (``with obj:``)."""

    @classmethod
    def current(cls, value: Any = None, required: bool = True) -> Any:
        """``value`` if given (it must be an instance), else the innermost active one."""
        if value is not None:
            if not isinstance(value, cls):
                raise ScopeError(f"Wrong context type: {type(value).__name__} is not a "
                                 f"{cls.__name__}.")
            return value
        return _CONTEXT_REGISTRY.get(cls).get_active(required=required)

    def __enter__(self) -> Any:
        for cls in _get_managed_classes(self):
            _CONTEXT_REGISTRY.get(cls).enter(self)
        return self

    def __exit__(self, *args: Any) -> None:
        for cls in _get_managed_classes(self):
            _CONTEXT_REGISTRY.get(cls).exit(self)

    def __call__(self, func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
        return wrapper


class DefaultManaged(Managed):
    """A Managed class whose ``current()`` creates (and keeps) a default instance."""


__all__ = ["DefaultManaged", "Managed"]
