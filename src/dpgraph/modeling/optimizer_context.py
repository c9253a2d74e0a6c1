"""Caffe2's ``optimizer_context``: pick per-parameter optimizers by tag while building.

    with UseOptimizer({"WEIGHT": adam, "BIAS": sgd}):
        brew.fc(model, "x", "fc", 4, 2)   # fc_w gets adam, fc_b gets sgd

The optimizer builders then run each parameter's own optimizer.
"""

from __future__ import annotations

import contextvars
from typing import Any

DEFAULT_OPTIM = "DEFAULT"

_stack: contextvars.ContextVar[tuple[dict[str, Any], ...]] = contextvars.ContextVar(
    "dpgraph_optimizer_context", default=())


class OptimizerContext:
    """The optimizers in effect: the merge of every active :class:`UseOptimizer` block."""

    @classmethod
    def current(cls) -> OptimizerContext:
        return cls()

    @staticmethod
    def _merged() -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for modifiers in _stack.get():
            merged.update(modifiers)
        return merged

    def has_optimizer(self, name: str) -> bool:
        return name in self._merged()

    def get_optimizer(self, name: str) -> Any:
        return self._merged().get(name)

    def push_modifiers(self, modifiers: dict[str, Any]) -> contextvars.Token[Any]:
        return _stack.set((*_stack.get(), dict(modifiers)))


class UseOptimizer:
    """Context manager: ``UseOptimizer(opt)`` (default for every param) or
    ``UseOptimizer({tag: opt, ...})``."""

    def __init__(self, modifier_or_dict: Any) -> None:
        if isinstance(modifier_or_dict, dict):
            self._modifiers = modifier_or_dict
        else:
            self._modifiers = {DEFAULT_OPTIM: modifier_or_dict}
        self._tokens: list[contextvars.Token[Any]] = []

    def __enter__(self) -> UseOptimizer:
        self._tokens.append(OptimizerContext.current().push_modifiers(self._modifiers))
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack.reset(self._tokens.pop())


def attach_optimizer(param_info: Any, tags: set[str]) -> None:
    """Give ``param_info`` the optimizer of one of its tags, else the default one."""
    if not _stack.get():  # no UseOptimizer block
        return
    context = OptimizerContext.current()
    for tag in sorted(tags):
        if context.has_optimizer(tag):
            param_info.optimizer = context.get_optimizer(tag)
    if not param_info.optimizer and context.has_optimizer(DEFAULT_OPTIM):
        param_info.optimizer = context.get_optimizer(DEFAULT_OPTIM)
