"""docs/data.md: every Python block runs and prints what the text says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", DOC.read_text(), re.S)


@pytest.mark.parametrize("index", range(3))
def test_block_prints_its_comments(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    code = _blocks()[index]
    exec(compile(code, f"data.md block {index}", "exec"), {})  # noqa: S102
    printed = [line for line in capsys.readouterr().out.splitlines()  # stop() reports too
               if not line.startswith(("Wait for workers", "All workers terminated"))]
    expected = [line.split("# ", 1)[1] for line in code.splitlines()
                if line.startswith("print(") and "# " in line]
    assert printed == expected


def test_every_documented_op_is_registered() -> None:
    from dpgraph.ir.registry import OPERATORS

    for op in ("CreateDB", "DBExists", "TensorProtosDBInput", "Save", "Load", "Checkpoint",
               "Snapshot", "ImageInput"):
        assert op in OPERATORS
