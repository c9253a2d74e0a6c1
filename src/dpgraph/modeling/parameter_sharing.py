"""Caffe2's ``modeling.parameter_sharing``: reuse parameters across name scopes.

    with ParameterSharing({"tower_b": "tower_a"}):
        with NameScope("tower_b"):
            brew.fc(model, "x", "fc", 4, 2)   # creates/reuses tower_a/fc_w, tower_a/fc_b
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

from dpgraph.errors import ModelConfigError
from dpgraph.ir import scope

logger = logging.getLogger("dpgraph.modeling.parameter_sharing")
_SEP = scope._NAMESCOPE_SEPARATOR

_overrides: contextvars.ContextVar[tuple[dict[str, str], ...]] = contextvars.ContextVar(
    "dpgraph_parameter_sharing", default=())


class ParameterSharingContext:
    """Resolves the name scope a parameter is created in through the active overrides."""

    @property
    def _scope_overrides(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for overrides in _overrides.get():
            merged.update(overrides)
        return merged

    def _resolve_scope_overrides(self, candidate_scope: str) -> str:
        overrides = self._scope_overrides
        best_scope, best_index = candidate_scope, 0
        sub_scopes = candidate_scope.split(_SEP)
        current = ""
        for index, sub_scope in enumerate(sub_scopes):
            current = current + sub_scope + _SEP
            if current in overrides:
                best_scope, best_index = overrides[current], index
        if best_scope == candidate_scope:
            return candidate_scope
        return (self._resolve_scope_overrides(best_scope)
                + _SEP.join(sub_scopes[best_index + 1:]))

    def get_parameter_name(self, name: str) -> str:
        """``name`` in the current name scope after applying the overrides."""
        candidate = scope.CurrentNameScope()
        if not _overrides.get():  # no ParameterSharing block: nothing to resolve
            return candidate + name
        best = self._resolve_scope_overrides(candidate)
        if best != candidate:
            logger.info("Overwriting scope %s with scope %s", candidate, best)
        return best + name


parameter_sharing_context = ParameterSharingContext()


def _normalize_namescope(namescope: str) -> str:
    if namescope and namescope[-1] != _SEP:
        return namescope + _SEP
    return namescope


@contextlib.contextmanager
def ParameterSharing(shared_scopes: dict[str, str]) -> Iterator[None]:
    """Inside the block, params created under scope ``k`` are taken from scope ``v``."""
    if not isinstance(shared_scopes, dict):
        raise ModelConfigError("ParameterSharing takes a dict {scope: shared scope}.")
    current = scope.CurrentNameScope()
    overrides = {}
    for key, value in shared_scopes.items():
        if value.startswith(key):
            raise ModelConfigError(
                f"Illegal override for parameter sharing. {key} is prefix of {value}")
        overrides[_normalize_namescope(current + key)] = _normalize_namescope(current + value)
    token = _overrides.set((*_overrides.get(), overrides))
    try:
        yield
    finally:
        _overrides.reset(token)
