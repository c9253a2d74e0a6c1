"""Pieces Caffe2's 2021 tests rely on: hypothesis_test_util's settings/floats wrappers and
relaxed profiles, core._REGISTERED_OPERATORS."""

from __future__ import annotations

import hypothesis
import numpy as np

from dpgraph import core
from dpgraph import hypothesis_test_util as hu


def test_settings_drops_retired_arguments_and_converts_timeout() -> None:
    s = hu.settings(max_examples=3, min_satisfying_examples=1, timeout=2)
    assert s.max_examples == 3 and s.deadline.total_seconds() == 2.0
    assert hu.settings(deadline=None, timeout=5).deadline is None  # deadline wins


def test_floats_are_float32_with_float32_bounds() -> None:
    assert hu.to_float32(0.1) == float(np.float32(0.1)) != 0.1
    strategy = hu.floats(min_value=0.1, max_value=1.1)

    @hypothesis.given(strategy)
    @hypothesis.settings(max_examples=20, database=None)
    def check(value: float) -> None:
        assert float(np.float32(0.1)) <= value <= float(np.float32(1.1))
        assert float(np.float32(value)) == value

    check()
    assert repr(hu.floats(width=64, min_value=0.1)) == "floats(min_value=0.1)"  # kept


def test_dev_profile_suppresses_too_slow_and_differing_executors() -> None:
    profile = hypothesis.settings.get_profile("dev")
    suppressed = set(profile.suppress_health_check)
    assert hypothesis.HealthCheck.too_slow in suppressed
    if hasattr(hypothesis.HealthCheck, "differing_executors"):
        assert hypothesis.HealthCheck.differing_executors in suppressed
        assert hypothesis.HealthCheck.differing_executors in set(
            hypothesis.settings.get_profile("debug").suppress_health_check)


def test_registered_operators_set_is_live() -> None:
    ops = core._REGISTERED_OPERATORS
    assert "Relu" in ops and "NoSuchOpAnywhere" not in ops
    assert len(ops) == len(core.RegisteredOperators()) and "FC" in set(ops)
    assert core._GetRegisteredOperators() == set(core.RegisteredOperators())


BUILT: list[int] = []


def _counting_builder(amount: float):  # noqa: ANN201 - a Python-op builder
    BUILT.append(1)

    def f(inputs, outputs) -> None:  # noqa: ANN001
        outputs[0].feed(inputs[0].data + amount)
    return f


def test_python_op_builder_called_once_per_op_instance() -> None:
    from dpgraph import workspace

    BUILT.clear()
    net = core.Net("k_py_builder")
    net.Python((_counting_builder, [2.0], {}))(["k_x"], ["k_y"])
    workspace.FeedBlob("k_x", np.ones(2, np.float32))
    workspace.CreateNet(net)
    workspace.RunNet(net, 3)
    assert len(BUILT) == 1  # one instance, three runs
    np.testing.assert_array_equal(workspace.FetchBlob("k_y"), [3.0, 3.0])
    workspace.RunNetOnce(net)
    workspace.RunNetOnce(net)
    assert len(BUILT) == 3  # each RunNetOnce instantiates the net


def test_blob_size_bytes_and_background_plans() -> None:
    import time

    from dpgraph import workspace

    workspace.FeedBlob("k_f16", np.zeros((2, 3), np.float16))
    assert workspace.GetBlobSizeBytes("k_f16") == 12
    workspace.FeedBlob("k_s1", np.array([b"Hello World!", b"abcd"]))
    workspace.FeedBlob("k_s2", np.array([b"element1", b"element2"]))
    assert workspace.GetBlobSizeBytes("k_s1") - workspace.GetBlobSizeBytes("k_s2") == 0
    assert workspace.GetBlobSizeBytes("k_s1") == 2 * 32 + 16
    net = core.Net("k_bg")
    net.ConstantFill([], "k_bg_out", shape=[2], value=3.0)
    plan = core.Plan("k_bg_plan")
    plan.AddStep(core.ExecutionStep("k_bg_step", net))
    background = workspace.RunPlanInBackground(plan)
    deadline = time.time() + 30
    while not background.is_done() and time.time() < deadline:
        time.sleep(0.01)
    assert background.is_succeeded()
    np.testing.assert_array_equal(workspace.FetchBlob("k_bg_out"), [3.0, 3.0])
    failing = core.Net("k_bg_fail")
    failing.Relu("k_missing", "k_never")
    background = workspace.RunPlanInBackground(core.ExecutionStep("k_bg_fail_step", failing))
    assert background.wait(30) and not background.is_succeeded()


def test_apply_transform_conv_to_nnpack() -> None:
    import pytest

    from dpgraph import workspace
    from dpgraph.errors import WorkspaceError

    init = core.Net("k_tr_init")
    init.ConstantFill([], "k_tr_x", shape=[1, 2, 5, 5], value=1.0)
    init.ConstantFill([], "k_tr_w", shape=[2, 2, 3, 3], value=0.5)
    init.ConstantFill([], "k_tr_b", shape=[2], value=0.0)
    net = core.Net("k_tr")
    net.Conv(["k_tr_x", "k_tr_w", "k_tr_b"], "k_tr_y", kernel=3)
    net.Relu("k_tr_y", "k_tr_z")
    transformed = workspace.ApplyTransform("ConvToNNPack", net.Proto())
    assert [op.engine for op in transformed.op] == ["NNPACK", ""]
    assert net.Proto().op[0].engine == ""  # the input is left alone
    with pytest.raises(RuntimeError, match="not registered"):
        workspace.ApplyTransform("definitely_not_a_real_transform", net.Proto())
    chosen = workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(),
                                              warmup_runs=1, main_runs=2)
    assert [op.type for op in chosen.op] == ["Conv", "Relu"]
    assert issubclass(WorkspaceError, RuntimeError)


def test_operator_cost_of_conv_and_fc() -> None:
    import pytest

    from dpgraph import workspace

    op = core.CreateOperator("Conv2D", ["k_cx", "k_cw"], ["k_cy"], stride_h=1, stride_w=1,
                             pad_t=1, pad_l=1, pad_b=1, pad_r=1, kernel=3)
    workspace.FeedBlob("k_cx", np.zeros((1, 8, 8, 8)))
    workspace.FeedBlob("k_cw", np.zeros((1, 1, 3, 3)))
    cost = workspace.GetOperatorCost(op.SerializeToString(), ["k_cx", "k_cw"])
    assert tuple(cost) == (1152, 256, 4168) and cost.flops == 1152
    workspace.FeedBlob("k_fx", np.zeros((4, 6), np.float32))
    workspace.FeedBlob("k_fw", np.zeros((3, 6), np.float32))
    fc = core.CreateOperator("FC", ["k_fx", "k_fw", "k_fb"], ["k_fy"])
    assert tuple(workspace.GetOperatorCost(fc, ["k_fx", "k_fw"])) == (
        4 * 3 * 13, 4 * 3 * 4, (6 * 7 + 3) * 4)
    with pytest.raises(RuntimeError, match="no cost inference"):
        workspace.GetOperatorCost(core.CreateOperator("Sigmoid", ["k_fx"], ["k_fr"]), ["k_fx"])


def test_immediate_mode_workspace() -> None:
    import os

    import pytest

    from dpgraph import workspace

    workspace.StartImmediate(i_know=True)
    try:
        assert workspace.IsImmediate()
        root = workspace._immediate_root_folder
        assert os.path.isdir(root)
        workspace.RunOperatorImmediate(
            core.CreateOperator("ConstantFill", [], "k_imm", shape=[2], value=1.5))
        assert "k_imm" in workspace.ImmediateBlobs() and not workspace.HasBlob("k_imm")
        assert workspace.FeedImmediate("k_imm", np.full(2, 2.0, np.float32))
        np.testing.assert_array_equal(workspace.FetchImmediate("k_imm"), [2.0, 2.0])
    finally:
        workspace.StopImmediate()
    assert not workspace.IsImmediate() and workspace._immediate_root_folder == ""
    assert not os.path.exists(root)
    with pytest.raises(RuntimeError):
        workspace.FetchImmediate("k_imm")


def test_core_net_name_and_remap_exports() -> None:
    net = core.Net("k_gn")
    assert core.get_net_name(net) == net.Name() == core.get_net_name(net.Proto())
    assert core.get_net_name("plain") == "plain"
    assert core.DEFAULT_REMAP_FUNCS["RecurrentNetwork"] is core.recurrent_network_op_remap
    assert core.DEFAULT_REMAP_FUNCS["If"] is core.control_op_remap
    op = core.CreateOperator("Relu", ["a"], ["b"])
    core.remap_input(op, {"a": "c"})
    assert list(op.input) == ["c"]


def test_build_options_and_serialized_output_context() -> None:
    from dpgraph import build
    from dpgraph.serialized_test import serialized_test_util as serial

    assert build.CAFFE2_NO_OPERATOR_SCHEMA is False
    assert build.build_options["USE_MPI"] == "OFF" and "USE_CUDA" in build.build_options
    serial._output_context.__setattr__("disable_serialized_check", True)  # conftest's use
    try:
        assert serial._output_context.disable_serialized_check is True
    finally:
        serial._output_context.disable_serialized_check = False
    assert serial.DATA_DIR.endswith(serial.DATA_SUFFIX)
