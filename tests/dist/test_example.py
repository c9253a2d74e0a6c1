"""examples/train_distributed.py trains to the same weights on every rank."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed", reason="the example uses the gloo backend")
pytestmark = pytest.mark.dist

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_distributed.py"


def test_two_ranks_converge_to_the_same_weights() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--spawn", "2", "--steps", "60"],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = re.findall(r"rank (\d)/2: loss ([\d.]+) -> ([\d.]+) .*?checksum (\d+\.\d{6})",
                       done.stdout)
    assert sorted(rank for rank, *_ in lines) == ["0", "1"], done.stdout
    assert len({checksum for *_, checksum in lines}) == 1  # identical models
    for _, first, last, _ in lines:
        assert float(last) < 0.01 * float(first)
