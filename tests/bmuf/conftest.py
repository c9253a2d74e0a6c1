"""A clean workspace and no virtual GPUs around each test, and Parallelize in debug mode
(every pass checked against its declared contract, every output net verified)."""

from collections.abc import Iterator

import pytest
from _workspace import clean_workspace  # noqa: F401  (autouse)


@pytest.fixture(autouse=True)
def parallelize_debug_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DPGRAPH_DEBUG", "1")
    yield
