"""``dpgraph demo`` and the CLI."""

from __future__ import annotations

import io

import pytest

from dpgraph import cli
from dpgraph.demo import DemoConfig, run_demo

pytest.importorskip("sklearn", reason="the demo needs scikit-learn's digits data set")


def test_demo_defaults_reach_accuracy_and_match_one_device() -> None:
    stream = io.StringIO()
    result = run_demo(DemoConfig(), stream=stream)
    assert result.accuracy > 0.9
    assert result.params_match and result.max_param_diff < 1e-4
    assert result.images_per_sec > 0 and len(result.losses) == DemoConfig().epochs
    assert result.losses[-1] < result.losses[0]
    text = stream.getvalue()
    assert "held-out accuracy" in text and "images/s" in text and "[OK]" in text


def test_cli_demo(capsys) -> None:
    assert cli.main(["demo", "--quiet", "--epochs", "1", "--devices", "2"]) in (0, 1)
    out = capsys.readouterr().out
    assert "params match 1-device run: yes" in out


def test_cli_without_command_prints_help(capsys) -> None:
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out
    assert cli.main(["demo", "--devices", "0", "--quiet"]) == 2
