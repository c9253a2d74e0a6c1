"""The ``brew`` dispatcher: ``brew.<helper>(model, ...)`` with arg_scope defaults."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dpgraph.errors import HelperError, ModelStateError
from dpgraph.modeling.brew.arg_scope import get_current_scope


class HelperWrapper:
    """Stands in for the ``brew`` module: attribute access returns a registered helper,
    wrapped to merge the model's arg_scope, the active ``brew.arg_scope`` and the call's
    keyword arguments (in that order of precedence, last wins)."""

    def __init__(self, wrapped: ModuleType | None = None,
                 registry: dict[str, Callable[..., Any]] | None = None) -> None:
        self.__dict__["wrapped"] = wrapped
        self.__dict__["_registry"] = dict(registry or {})

    def __getattr__(self, helper_name: str) -> Any:
        if helper_name.startswith("__"):
            wrapped = self.__dict__.get("wrapped")
            if wrapped is not None and hasattr(wrapped, helper_name):
                return getattr(wrapped, helper_name)
            raise AttributeError(helper_name)
        if helper_name not in self._registry:
            raise HelperError(f"Helper function {helper_name} not registered.")
        return self._make_wrapper(helper_name)

    def _make_wrapper(self, helper_name: str) -> Callable[..., Any]:
        func = self._registry[helper_name]

        def scope_wrapper(*args: Any, **kwargs: Any) -> Any:
            new_kwargs: dict[str, Any] = {}
            if helper_name != "arg_scope":
                new_kwargs = _copied(_model_of(helper_name, args, kwargs).arg_scope)
            names = _keyword_names(func)
            if names is not None:
                new_kwargs = {k: v for k, v in new_kwargs.items() if k in names}
            new_kwargs.update(get_current_scope().get(helper_name, {}))
            new_kwargs.update(kwargs)
            return func(*args, **new_kwargs)

        scope_wrapper.__name__ = helper_name
        scope_wrapper.__doc__ = func.__doc__
        scope_wrapper.__wrapped__ = func  # type: ignore[attr-defined]
        return scope_wrapper

    def Register(self, helper: Callable[..., Any]) -> None:
        """Add ``helper`` under its ``__name__``; a name already taken raises HelperError."""
        name = helper.__name__
        if name in self._registry:
            raise HelperError(f"Helper {name} already exists. Please change your helper name.")
        self._registry[name] = helper

    def has_helper(self, helper_or_helper_name: Any) -> bool:
        """True if a helper of that name (or that function's name) is registered."""
        name = (helper_or_helper_name if isinstance(helper_or_helper_name, str)
                else helper_or_helper_name.__name__)
        return name in self._registry

    def __dir__(self) -> list[str]:
        return sorted(set(self._registry) | {"Register", "has_helper"})


def _model_of(helper_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from dpgraph.modeling.model_helper import ModelHelper

    if args and isinstance(args[0], ModelHelper):
        return args[0]
    if "model" in kwargs:
        return kwargs["model"]
    raise ModelStateError(
        f"brew.{helper_name}: you must pass a ModelHelper object as the first argument or "
        "as a 'model' keyword argument.")


#: Types ``copy.deepcopy`` returns as they are.
_ATOMIC = frozenset({type(None), bool, int, float, complex, str, bytes})


def _copied(arg_scope: dict[str, Any]) -> dict[str, Any]:
    """``copy.deepcopy(arg_scope)`` without the deepcopy machinery for atomic values (one
    memo for the others, so that values sharing an object still share its copy)."""
    memo: dict[int, Any] = {}
    return {key: value if type(value) in _ATOMIC else copy.deepcopy(value, memo)
            for key, value in arg_scope.items()}


@functools.cache
def _keyword_names(func: Callable[..., Any]) -> frozenset[str] | None:
    """The argument names ``func`` accepts (None when it takes ``**kwargs``), computed once."""
    spec = inspect.getfullargspec(func)
    if spec.varkw is not None:
        return None
    return frozenset(spec.args) | frozenset(spec.kwonlyargs)
