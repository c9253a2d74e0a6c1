"""The data examples run end to end (short settings)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lmdb_training_example(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    accuracy = _load("lmdb_training").main(["--iters", "150", "--workdir", str(tmp_path)])
    assert accuracy > 0.85
    assert (tmp_path / "mlp_params.minidb").stat().st_size > 0


def test_image_training_example(tmp_path: Path) -> None:
    accuracy = _load("image_training").main(["--iters", "30", "--workdir", str(tmp_path)])
    assert accuracy > 0.8
    assert len(list((tmp_path / "train").glob("*.jpg"))) == 256
    sys.modules.pop("_example_image_training", None)
