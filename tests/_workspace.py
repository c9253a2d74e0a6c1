"""Autouse fixtures that give each test a clean current workspace and no virtual GPUs.

A conftest (or test module) opts in by importing the fixture it wants:
``from _workspace import clean_workspace  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpgraph import workspace
from dpgraph.runtime import devices


def _reset() -> None:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)


@pytest.fixture(autouse=True)
def clean_workspace() -> Iterator[None]:
    """Reset the current workspace and drop virtual GPUs before and after the test."""
    _reset()
    yield
    _reset()


@pytest.fixture(autouse=True)
def clean_runtime() -> Iterator[None]:
    """Like :func:`clean_workspace`, but on the ``default`` workspace, and the virtual GPU
    setting (count and peer pattern) of before the test comes back afterwards."""
    saved = (devices._state.virtual, devices._state.peer.copy())
    workspace.SwitchWorkspace("default")
    _reset()
    yield
    workspace.SwitchWorkspace("default")
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(saved[0], saved[1] if saved[0] else None)
