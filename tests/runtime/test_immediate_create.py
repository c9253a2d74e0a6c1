"""Immediate mode: core.CreateOperator runs each new op in the immediate workspace."""

from __future__ import annotations

import numpy as np

from dpgraph import core, workspace


def test_created_ops_run_only_while_immediate_mode_is_on() -> None:
    workspace.StartImmediate(i_know=True)
    try:
        core.CreateOperator("ConstantFill", [], "imm_k", shape=[2], value=3.0)
        assert np.array_equal(workspace.FetchImmediate("imm_k"), [3.0, 3.0])
        assert not workspace.HasBlob("imm_k")  # the user's workspace is untouched
    finally:
        workspace.StopImmediate()
    core.CreateOperator("ConstantFill", [], "imm_k2", shape=[2], value=3.0)
    assert "imm_k2" not in workspace.ImmediateBlobs()
