"""Error-path tests: a clean default workspace and no virtual GPUs around each test."""

from __future__ import annotations

from _workspace import clean_runtime  # noqa: F401  (autouse)
