"""Each jobs test starts and ends with a clean current workspace."""

from _workspace import clean_runtime  # noqa: F401
