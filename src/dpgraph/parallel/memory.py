"""Seam for the memory passes (``optimize_gradient_memory``, ``dynamic_memory_management``).

The memory-optimisation passes live with :mod:`dpgraph.memonger`; they plug in here by
calling :func:`register_memory_hooks`.  Until then ``Parallelize`` refuses the flags with a
:class:`~dpgraph.errors.NotSupportedError` before touching the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dpgraph.parallel.state import ParallelState


class MemoryHooks(Protocol):
    """What the memory helper provides to the Parallelize pipeline."""

    def optimize_gradient_memory(self, state: ParallelState) -> None: ...

    def dynamic_memory_management(self, state: ParallelState, blobs_to_keep: Any) -> None: ...


_HOOKS: list[MemoryHooks] = []


def register_memory_hooks(hooks: MemoryHooks) -> None:
    """Install the memory passes (the last registration wins)."""
    _HOOKS.append(hooks)


def get_memory_hooks() -> MemoryHooks | None:
    return _HOOKS[-1] if _HOOKS else None


def add_memory_passes(state: ParallelState) -> None:
    """Run the requested memory passes (the flags were validated up front)."""
    config = state.config
    hooks = get_memory_hooks()
    if hooks is None:
        return
    if config.optimize_gradient_memory:
        hooks.optimize_gradient_memory(state)
    if config.dynamic_memory_management:
        hooks.dynamic_memory_management(state, config.blobs_to_keep)
