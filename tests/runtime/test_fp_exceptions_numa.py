"""Floating-point exception flags (runtime/fp_exceptions.py) and the NUMA queries
(runtime/numa.py, re-exported by the workspace facade)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import workspace
from dpgraph.errors import ArgumentError, BlobNotFoundError, OperatorError, WorkspaceError
from dpgraph.runtime import fp_exceptions as fp


@pytest.fixture(autouse=True)
def flags_off():
    yield
    for flag in (fp.THROW_IF_FP, fp.THROW_IF_OVERFLOW):
        fp.set_flag(flag, "0")


def divide(ctx):
    return (np.float32(1) / ctx,)


def test_flags_switch_raising_on_and_off() -> None:
    zero = np.zeros(2, np.float32)
    assert not fp.state.active
    fp.set_flag(fp.THROW_IF_FP, "1")
    assert fp.state.active
    with pytest.raises(OperatorError, match=r"Division by zero .*FE_DIVBYZERO"):
        fp.run_kernel(divide, zero)
    with pytest.raises(OperatorError, match=r"Invalid .*FE_INVALID"):
        fp.run_kernel(lambda x: (np.sqrt(x - 1),), zero)
    big = np.full(1, 3e38, np.float32)
    with np.errstate(over="ignore"):  # overflow is not checked by the first flag
        assert np.isinf(fp.run_kernel(lambda x: (x * np.float32(10),), big)[0]).all()
    fp.set_flag(fp.THROW_IF_OVERFLOW, "true")
    with pytest.raises(OperatorError, match="FE_OVERFLOW"):
        fp.run_kernel(lambda x: (x * np.float32(10),), big)
    fp.set_flag(fp.THROW_IF_FP, "false")
    fp.set_flag(fp.THROW_IF_OVERFLOW, "")  # a bare --flag means true
    assert fp.state.active and fp.state.throw_if_overflow
    fp.set_flag(fp.THROW_IF_OVERFLOW, "0")
    assert not fp.state.active
    with np.errstate(divide="ignore"):
        assert np.isinf(fp.run_kernel(divide, zero)[0]).all()


def test_first_occurrence_flag_is_accepted_and_bad_values_rejected() -> None:
    assert fp.FIRST_OCCURRENCE in fp.FLAGS
    fp.set_flag(fp.FIRST_OCCURRENCE, "1")
    assert not fp.state.active
    with pytest.raises(ArgumentError, match="boolean"):
        fp.set_flag(fp.THROW_IF_FP, "maybe")


def test_numa_answers_as_caffe2_without_numa() -> None:
    assert workspace.IsNUMAEnabled() is False
    assert workspace.GetNumNUMANodes() == -1
    workspace.FeedBlob("x", np.ones(3, np.float32))
    assert workspace.GetBlobNUMANode("x") == -1
    with pytest.raises(BlobNotFoundError, match="'missing'"):
        workspace.GetBlobNUMANode("missing")
    workspace.FeedBlob("empty", np.zeros(0, np.float32))
    with pytest.raises(WorkspaceError, match="no CPU tensor data"):
        workspace.GetBlobNUMANode("empty")


def test_global_init_flag_makes_a_net_division_by_zero_raise() -> None:
    from dpgraph import core

    workspace.FeedBlob("fp_one", np.ones(2, np.float32))
    workspace.FeedBlob("fp_zero", np.zeros(2, np.float32))
    net = core.Net("fp_div")
    net.Div(["fp_one", "fp_zero"], "fp_out")
    workspace.GlobalInit(["prog", "--caffe2_operator_throw_if_fp_exceptions=1"])
    with pytest.raises(OperatorError, match="FE_DIVBYZERO"):
        workspace.RunNetOnce(net)
    workspace.GlobalInit(["prog", "--caffe2_operator_throw_if_fp_exceptions=0"])
    with np.errstate(divide="ignore"):
        assert workspace.RunNetOnce(net)
    assert np.isinf(workspace.FetchBlob("fp_out")).all()
