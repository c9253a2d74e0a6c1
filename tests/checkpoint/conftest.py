"""A clean workspace and no virtual GPUs around each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpgraph import workspace


@pytest.fixture(autouse=True)
def clean_workspace() -> Iterator[None]:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)
    yield
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)
