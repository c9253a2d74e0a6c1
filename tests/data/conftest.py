"""A clean workspace and no virtual GPUs around each test."""

from _workspace import clean_workspace  # noqa: F401  (autouse)
