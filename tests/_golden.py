"""Access to the recorded Caffe2 operator cases in ``../shared/golden/caffe2_ops``.

The data is read in place (never copied into the repository).  When ``shared/`` is absent,
as in a fresh clone on its own, tests that need it skip with a clear reason.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from dpgraph.proto import caffe2_pb2

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    """``$DPGRAPH_SHARED``, else ``<repo>/../shared``, if it exists."""
    candidates = [os.environ.get("DPGRAPH_SHARED"), REPO.parent / "shared"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "golden" / "caffe2_ops").is_dir():
            return Path(candidate)
    return None


def golden_root() -> Path:
    shared = shared_dir()
    if shared is None:
        pytest.skip("golden Caffe2 cases not found: needs ../shared/golden next to the repo "
                    "(or DPGRAPH_SHARED)")
    return shared / "golden" / "caffe2_ops"


@dataclass(frozen=True)
class GoldenCase:
    """One recorded operator case."""

    name: str
    path: Path
    num_inputs: int
    num_outputs: int
    grad_files: tuple[str, ...]

    def op(self) -> caffe2_pb2.OperatorDef:
        return parse_operator(self.path / "op.pb")

    def data(self) -> dict[str, np.ndarray]:
        with np.load(self.path / "data.npz", allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}

    def grad_ops(self) -> list[caffe2_pb2.OperatorDef]:
        return [parse_operator(self.path / name) for name in self.grad_files]


def parse_operator(path: Path) -> caffe2_pb2.OperatorDef:
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(path.read_bytes())
    return op


@cache
def case_names() -> list[str]:
    """Every case name, or [] when the golden data is absent (parametrisation then skips)."""
    shared = shared_dir()
    if shared is None:
        return []
    index = json.loads((shared / "golden" / "caffe2_ops" / "index.json").read_text())
    return sorted(index)


def load_case(name: str) -> GoldenCase:
    root = golden_root()
    entry = json.loads((root / "index.json").read_text())[name]
    return GoldenCase(name, root / name, entry["inputs"], entry["outputs"],
                      tuple(entry["grad_ops"]))


class Tally:
    """Counts golden outcomes so the terminal summary can print one line per harness."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.counts: Counter[str] = Counter()

    def record(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def run(self, check: Callable[[str], None], case_name: str) -> None:
        """Run ``check(case_name)`` and count its outcome; skip when the cases are absent."""
        if not case_names():
            pytest.skip("golden Caffe2 cases not found: needs ../shared/golden next to the repo")
        try:
            check(case_name)
        except pytest.skip.Exception:
            self.record("skipped")
            raise
        except BaseException:
            self.record("failed")
            raise
        self.record("passed")

    def line(self, total: int) -> str:
        c = self.counts
        return (f"{self.label}: {c['passed']} passed, {c['failed']} failed, "
                f"{c['skipped']} skipped of {total}")


KERNELS = Tally("golden")
GRADIENTS = Tally("golden grads")
