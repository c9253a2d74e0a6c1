"""examples/train_distributed.py (Parallelize_CPU with a rendezvous) trains to the same
weights on every rank, launched with --spawn (torchrun's environment) or with explicit
--rank/--world-size/--store-path."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed", reason="the example uses the gloo backend")
pytestmark = pytest.mark.dist

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_distributed.py"
LINE = re.compile(r"rank (\d)/2: loss ([\d.]+) -> ([\d.]+) .*?checksum (\d+\.\d{6})")


def check_output(stdout: str, ratio: float) -> None:
    lines = LINE.findall(stdout)
    assert sorted(rank for rank, *_ in lines) == ["0", "1"], stdout
    assert len({checksum for *_, checksum in lines}) == 1  # identical models
    for _, first, last, _ in lines:
        assert float(last) < ratio * float(first)


def test_two_ranks_converge_to_the_same_weights() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--spawn", "2", "--steps", "60"],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    check_output(done.stdout, 0.01)


def test_explicit_ranks_over_a_file_store(tmp_path: Path) -> None:
    common = [sys.executable, str(EXAMPLE), "--world-size", "2", "--steps", "30",
              "--store-path", str(tmp_path / "rdv")]
    procs = [subprocess.Popen([*common, "--rank", str(rank)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=90) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    check_output("".join(out for out, _ in outputs), 0.05)
