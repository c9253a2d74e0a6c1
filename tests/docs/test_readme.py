"""The README's example and commands stay true."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from dpgraph import workspace

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_opens_with_the_demo_and_test_commands() -> None:
    blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    assert blocks[0].endswith("python -m dpgraph demo")
    assert blocks[1].endswith("python -m pytest -q")
    ci = (README.parent / ".ci" / "run").read_text()
    assert "\npython -m pytest -q " in ci


def test_readme_python_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = re.findall(r"```python\n(.*?)\n```", README.read_text(), re.S)
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    workspace.ResetWorkspace()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        workspace.ResetWorkspace()
    assert "loss on cpu_0:" in capsys.readouterr().out
