"""``brew.arg_scope``: per-helper default keyword arguments, nested with contextvars."""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Callable, Iterator
from typing import Any

from dpgraph.errors import HelperError

_current_scope: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = (
    contextvars.ContextVar("dpgraph_brew_arg_scope", default=None))


def get_current_scope() -> dict[str, dict[str, Any]]:
    """``{helper name: {kwarg: value}}`` of the active ``arg_scope`` blocks."""
    return _current_scope.get() or {}


@contextlib.contextmanager
def arg_scope(single_helper_or_list: Callable[..., Any] | list[Callable[..., Any]],
              **kwargs: Any) -> Iterator[None]:
    """Give the listed helpers default keyword arguments inside the block.

    Inner scopes update (override) outer ones; explicit keyword arguments always win.
    """
    helpers = (single_helper_or_list if isinstance(single_helper_or_list, list)
               else [single_helper_or_list])
    new_scope = copy.deepcopy(get_current_scope())
    for helper in helpers:
        if not callable(helper):
            raise HelperError(
                f"arg_scope only supports a helper function or a list of them, got {helper!r}.")
        new_scope.setdefault(helper.__name__, {}).update(kwargs)
    token = _current_scope.set(new_scope)
    try:
        yield
    finally:
        _current_scope.reset(token)
