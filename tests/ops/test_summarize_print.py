"""Summarize (statistics, to_file) and Print's to_file mode, as the MNIST tutorial uses them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import OperatorError
from dpgraph.ops.testing import run_op


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    workspace.ResetWorkspace(str(tmp_path))
    yield tmp_path
    workspace.ResetWorkspace(".")


def test_summarize_statistics() -> None:
    x = np.array([[1.0, 2.0], [4.0, -3.0]], np.float32)
    (stats,) = run_op(core.CreateOperator("Summarize", ["x"], ["s"]), [x])
    assert stats.dtype == np.float32
    np.testing.assert_allclose(stats, [-3.0, 4.0, 1.0, np.std(x, ddof=1)], rtol=1e-6)
    (single,) = run_op(core.CreateOperator("Summarize", ["x"], ["s"]),
                       [np.array([5.0], np.float32)])
    np.testing.assert_array_equal(single, [5.0, 5.0, 5.0, 0.0])


def test_summarize_and_print_to_file(root: Path) -> None:
    workspace.FeedBlob("gpu_0/w", np.array([1.0, 3.0], np.float32))
    net = core.Net("bookkeeping")
    net.Summarize("gpu_0/w", [], to_file=1)
    net.Print("gpu_0/w", [], to_file=1)
    net.Print("gpu_0/w", [], to_file=1, limit=1)
    workspace.CreateNet(net)
    workspace.RunNet(net, 2)
    summary = (root / "gpu_0#w.summary").read_text().splitlines()
    assert summary == ["1 3 2 1.41421"] * 2
    log = (root / "gpu_0#w.log").read_text().splitlines()
    assert log[:2] == ["Tensor gpu_0/w of type float. Dims: (2): 1,3",
                       "Tensor gpu_0/w of type float. Dims: (2): 1"]
    assert len(log) == 4


def test_summarize_has_no_gradient_and_rejects_empty_input() -> None:
    net = core.Net("no_grad")
    net.Summarize("x", "stats")
    loss = net.SumElements("x", "loss")
    grads = net.AddGradientOperators([loss])
    assert "stats" not in grads and all(op.type != "SummarizeGradient" for op in net.Proto().op)
    workspace.FeedBlob("empty", np.zeros((0,), np.float32))
    with pytest.raises(OperatorError, match="empty"):
        workspace.RunOperatorOnce(core.CreateOperator("Summarize", ["empty"], []))
    workspace.ResetWorkspace()
