"""The final Caffe2's gradient naming (caffe2-jobs-facts §6.1, core_gradients_test cases) on
real ops: ``_<x>_grad_autosplit_<k>`` renames, pass-through (Sum) pieces, the IR tags and the
sums' device options; numerically checked where it matters."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import GradientError
from dpgraph.proto import caffe2_pb2


def _op(op_type, inputs, outputs, **kwargs):
    return core.CreateOperator(op_type, inputs, outputs, **kwargs)


def _summary(ops):
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def test_ir_exposes_the_final_tags():
    assert core.IR.ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG == "only_keep_is_auto_gen_sum_ops_tag"
    assert core.IR.IS_AUTO_GEN_SUM_OPS_TAG == "is_auto_gen_sum_ops"


@pytest.mark.parametrize("op_type", ["Add", "Sub"])
def test_op_in_middle(op_type):
    ops = [_op("Relu", "x1", "x2"), _op("Softmax", "x2", "x3"),
           _op(op_type, ["x2", "x3"], "x4")]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"x4": "x4_grad"})
    assert _summary(grad_ops) == [
        (op_type + "Gradient", ["x4_grad", "x2", "x3"], ["x2_grad", "x3_grad"]),
        ("SoftmaxGradient", ["x3", "x3_grad"], ["_x2_grad_autosplit_0"]),
        ("Sum", ["x2_grad", "_x2_grad_autosplit_0"], ["x2_grad"]),
        ("ReluGradient", ["x2", "x2_grad"], ["x1_grad"]),
    ]
    assert grad_map["x1"] == "x1_grad"


@pytest.mark.parametrize("op_type", ["Add", "Sub"])
def test_op_at_leaf_and_multi_layer(op_type):
    ops = [_op(op_type, ["x1", "x2"], "x4"), _op(op_type, ["x2", "x3"], "x5"),
           _op("DotProduct", ["x4", "x5"], "x6")]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"x6": "x6_grad"})
    assert _summary(grad_ops)[-1] == ("Sum", ["x2_grad", "_x2_grad_autosplit_0"], ["x2_grad"])
    assert list(grad_ops[-2].output) == ["x1_grad", "_x2_grad_autosplit_0"]
    assert {str(grad_map[x]) for x in ("x1", "x2", "x3")} == {"x1_grad", "x2_grad", "x3_grad"}
    ops = [_op(op_type, ["x1", "x2"], "x4"), _op(op_type, ["x2", "x3"], "x5"),
           _op(op_type, ["x4", "x5"], "x6")]
    grad_ops, _ = core.GradientRegistry.GetBackwardPass(ops, {"x6": "x6_grad"})
    assert _summary(grad_ops)[-1] == ("Sum", ["x2_grad", "_x2_grad_autosplit_0"], ["x2_grad"])


def test_add_and_dynamic_constant_needs_no_sum():
    ops = [_op("Relu", "x1", "x2"), _op("ConstantFill", ["x2"], "x3"),
           _op("Add", ["x2", "x3"], "x4")]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"x4": "x4_grad"})
    assert "Sum" not in [o.type for o in grad_ops]
    assert grad_map["x1"] == "x1_grad"
    ops = [_op("Relu", "x1", "x2"), _op("ConstantFill", [], "x3", shape=[1], value=1.0),
           _op("Add", ["x2", "x3"], "x4", broadcast=1)]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"x4": "x4_grad"})
    assert "Sum" not in [o.type for o in grad_ops] and grad_map["x1"] == "x1_grad"


def _accumulation_net(extra=()):
    return [_op("Relu", "x1", "x2"), _op("Sigmoid", "x2", "x3"), _op("Tanh", "x2", "x4"),
            *extra, _op("Sum", ["x3", "x4"], "x5")]


@pytest.mark.parametrize("extra", [(), (_op("Print", "x2", []),)], ids=["plain", "print"])
def test_normal_accumulation_through_pass_through_sum(extra):
    ops = _accumulation_net(extra)
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, ["x5"])
    assert _summary(grad_ops) == [
        ("ConstantFill", ["x5"], ["x5_autogen_grad"]),
        ("TanhGradient", ["x4", "x5_autogen_grad"], ["x2_grad"]),
        ("SigmoidGradient", ["x3", "x5_autogen_grad"], ["_x2_grad_autosplit_0"]),
        ("Sum", ["x2_grad", "_x2_grad_autosplit_0"], ["x2_grad"]),
        ("ReluGradient", ["x2", "x2_grad"], ["x1_grad"]),
    ]
    assert grad_map["x3"] == grad_map["x4"] == "x5_autogen_grad"
    sum_op = grad_ops[-2]
    assert "is_auto_gen_sum_ops:1" in sum_op.device_option.extra_info


def test_accumulated_gradient_is_numerically_right():
    ops = _accumulation_net()
    grad_ops, _ = core.GradientRegistry.GetBackwardPass(ops, ["x5"])
    x1 = np.random.RandomState(0).randn(3, 4).astype(np.float32)
    workspace.ResetWorkspace()
    workspace.FeedBlob("x1", x1)
    workspace.RunOperatorsOnce(ops + grad_ops)
    x2 = np.maximum(x1, 0)
    expected = (x1 > 0) * (1 - np.tanh(x2) ** 2 + (1 / (1 + np.exp(-x2))) *
                           (1 - 1 / (1 + np.exp(-x2))))
    np.testing.assert_allclose(workspace.FetchBlob("x1_grad"), expected, rtol=1e-5,
                               atol=1e-6)
    workspace.ResetWorkspace()


def test_accumulation_runs():
    ops = [_op("Scale", "in", "m1", scale=2.0), _op("Scale", "in", "m2", scale=3.0)]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(
        ops, {"m1": "m1_grad_in", "m2": "m2_grad_in"})
    workspace.ResetWorkspace()
    workspace.FeedBlob("in", np.array([1.0], np.float32))
    workspace.FeedBlob("m1_grad_in", np.array([1.0], np.float32))
    workspace.FeedBlob("m2_grad_in", np.array([1.0], np.float32))
    workspace.RunOperatorsOnce(ops + grad_ops)
    np.testing.assert_array_equal(workspace.FetchBlob(str(grad_map["in"])), [5.0])
    workspace.ResetWorkspace()


@pytest.mark.parametrize("only_keep", [True, False])
def test_multi_use_input_auto_gen_sum_device(only_keep):
    extra = ["parallelize:shard_by_1"]
    if only_keep:
        extra.append("only_keep_is_auto_gen_sum_ops_tag:1")
    option = caffe2_pb2.DeviceOption()
    option.extra_info.extend(extra)
    ops = [_op("Relu", "x1", "x2", device_option=option),
           _op("Sigmoid", "x2", "x3", device_option=option),
           _op("Tanh", "x2", "x4", device_option=option),
           _op("Sum", ["x3", "x4"], "x5", device_option=option)]
    grad_ops, _ = core.GradientRegistry.GetBackwardPass(ops, {"x5": "x5_grad"})
    (sum_op,) = [o for o in grad_ops if o.type == "Sum"]
    info = list(sum_op.device_option.extra_info)
    assert "is_auto_gen_sum_ops:1" in info
    assert ("parallelize:shard_by_1" in info) is not only_keep


def test_pass_through_sum_of_the_same_blob():
    ops = [_op("Sum", ["x", "x"], "y")]
    grad_ops, grad_map = core.GradientRegistry.GetBackwardPass(ops, {"y": "y_grad"})
    assert _summary(grad_ops) == [("Sum", ["y_grad", "y_grad"], ["x_grad"])]
    assert grad_map["x"] == "x_grad"


def test_incorrect_operator_mentions_schema():
    ops = [_op("Mul", ["x1", "x2"], ["x3", "x4"]), _op("Relu", "x3", "x5")]
    with pytest.raises(GradientError, match="schema checking.*Mul takes 1 outputs, got 2"):
        core.GradientRegistry.GetBackwardPass(ops, {"x5": "x5_grad"})


def test_schema_gradient_ops_set_the_empty_name_like_caffe2s_makers():
    """C++ makers build every op with ``CreateOperatorDef(type, "", ...)``: ``name`` is
    present (empty), so the ops equal ``CreateOperator`` protos (core_gradients_test)."""
    forward = [_op("FC", ["in", "w", "b"], "fc"), _op("Print", "fc", []),
               _op("AveragedLoss", "fc", "loss")]
    grads, _ = core.GradientRegistry.GetBackwardPass(forward, {"loss": "loss_grad"})
    assert all(g.HasField("name") and g.name == "" for g in grads)
    expected = [_op("AveragedLossGradient", ["fc", "loss_grad"], "fc_grad"),
                _op("FCGradient", ["in", "w", "fc_grad"], ["w_grad", "b_grad", "in_grad"])]
    for op in expected:
        op.is_gradient_op = True
    for op in grads:
        op.debug_info = ""
    for op in expected:
        op.debug_info = ""
    assert list(grads) == expected
