"""Gradient naming and placement of the backward pass (Caffe2's core_gradients_test cases)."""

from __future__ import annotations

import pytest
from _autodiff_testops import assert_ops, op

from dpgraph import core
from dpgraph.autodiff import GetBackwardPass
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.device import DeviceOption
from dpgraph.proto import caffe2_pb2

AUTO_SUM_TAG = "is_auto_gen_sum_ops:1"


def test_direct_chain_with_given_gradient() -> None:
    ops = [op("Direct", "in", "hidden"), op("Direct", "hidden", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", "hidden_grad"),
                          ("DirectGradient", "hidden_grad", "in_grad")])
    assert all(g.is_gradient_op for g in grad_ops)
    assert grad_map == {"out": "out_grad", "hidden": "hidden_grad", "in": "in_grad"}


def test_list_ys_get_autogen_constant_fill_first() -> None:
    ops = [op("Direct", "in", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, ["out"])
    assert_ops(grad_ops, [("ConstantFill", "out", "out_autogen_grad"),
                          ("DirectGradient", "out_autogen_grad", "in_grad")])
    fill = grad_ops[0]
    assert [(a.name, a.f) for a in fill.arg] == [("value", 1.0)]
    assert not fill.HasField("device_option")
    assert grad_map["out"] == "out_autogen_grad"


def test_autogen_fill_takes_current_device_scope() -> None:
    ops = [op("Direct", "in", "out")]
    with core.DeviceScope(DeviceOption(caffe2_pb2.CUDA, 3)):
        grad_ops, _ = GetBackwardPass(ops, ["out"])
    assert grad_ops[0].device_option.device_type == caffe2_pb2.CUDA
    assert grad_ops[0].device_option.device_id == 3


def test_dict_ys_with_none_get_autogen_fill() -> None:
    ops = [op("Direct", "a", "x"), op("Direct", "b", "y")]
    grad_ops, grad_map = GetBackwardPass(ops, {"x": "x_grad", "y": None})
    assert_ops(grad_ops, [("ConstantFill", "y", "y_autogen_grad"),
                          ("DirectGradient", "y_autogen_grad", "b_grad"),
                          ("DirectGradient", "x_grad", "a_grad")])
    assert grad_map == {"x": "x_grad", "y": "y_autogen_grad", "a": "a_grad", "b": "b_grad"}


def test_grad_map_has_blob_reference_keys_and_values() -> None:
    _, grad_map = GetBackwardPass([op("Direct", "in", "out")], {"out": "out_grad"})
    assert all(type(k) is BlobReference and k.Net() is None for k in grad_map)
    assert all(type(v) is BlobReference for v in grad_map.values())
    assert grad_map[BlobReference("in")] == "in_grad"


def test_ops_without_output_gradient_are_skipped() -> None:
    ops = [op("Direct", "in", "hidden"), op("Direct", "other", "unused"),
           op("Direct", "hidden", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", "hidden_grad"),
                          ("DirectGradient", "hidden_grad", "in_grad")])
    assert "other" not in grad_map


def test_multi_use_input_autosplit_and_sum() -> None:
    ops = [op("Direct", "in", "hidden1"), op("Direct", "in", "hidden2"),
           op("Direct", ["hidden1", "hidden2"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [
        ("DirectGradient", "out_grad", ["hidden1_grad", "hidden2_grad"]),
        ("DirectGradient", "hidden2_grad", "in_grad"),
        ("DirectGradient", "hidden1_grad", "_in_grad_autosplit_0"),
        ("Sum", ["in_grad", "_in_grad_autosplit_0"], "in_grad"),
    ])
    assert list(grad_ops[-1].device_option.extra_info) == [AUTO_SUM_TAG]
    assert grad_map["in"] == "in_grad"


def test_multi_use_sum_copies_device_option() -> None:
    gpu1 = DeviceOption(caffe2_pb2.CUDA, 1)
    ops = [op("Direct", "in", "hidden1", gpu1), op("Direct", "in", "hidden2", gpu1),
           op("Direct", ["hidden1", "hidden2"], "out", gpu1)]
    grad_ops, _ = GetBackwardPass(ops, {"out": "out_grad"})
    sum_op = grad_ops[-1]
    assert sum_op.type == "Sum"
    assert (sum_op.device_option.device_type, sum_op.device_option.device_id) == (
        caffe2_pb2.CUDA, 1)
    assert list(sum_op.device_option.extra_info) == [AUTO_SUM_TAG]
    assert all(g.device_option.device_id == 1 for g in grad_ops)


def test_only_keep_tag_leaves_device_to_the_scope() -> None:
    tagged = DeviceOption(caffe2_pb2.CUDA, 1,
                          extra_info=["only_keep_is_auto_gen_sum_ops_tag:1"])
    ops = [op("Direct", "in", "h1", tagged), op("Direct", "in", "h2", tagged),
           op("Direct", ["h1", "h2"], "out", tagged)]
    grad_ops, _ = GetBackwardPass(ops, {"out": "out_grad"})
    sum_op = grad_ops[-1]
    assert sum_op.device_option.device_type == caffe2_pb2.CPU
    assert list(sum_op.device_option.extra_info) == [AUTO_SUM_TAG]


def test_multi_use_input_and_multiple_versions_big() -> None:
    ops = [
        op("Direct", "in", "in"),
        op("Direct", "in", "hidden1"),
        op("Direct", "in", "hidden2"),
        op("Direct", ["hidden1", "hidden2"], "in"),
        op("Direct", "in", "hidden3"),
        op("Direct", "in", "hidden4"),
        op("Direct", "in", "hidden5"),
        op("Direct", ["hidden3", "hidden4", "hidden5"], "out"),
    ]
    grad_ops, _ = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [
        ("DirectGradient", "out_grad", ["hidden3_grad", "hidden4_grad", "hidden5_grad"]),
        ("DirectGradient", "hidden5_grad", "in_grad"),
        ("DirectGradient", "hidden4_grad", "_in_grad_autosplit_0"),
        ("DirectGradient", "hidden3_grad", "_in_grad_autosplit_1"),
        ("Sum", ["in_grad", "_in_grad_autosplit_0", "_in_grad_autosplit_1"], "in_grad"),
        ("DirectGradient", "in_grad", ["hidden1_grad", "hidden2_grad"]),
        ("DirectGradient", "hidden2_grad", "in_grad"),
        ("DirectGradient", "hidden1_grad", "_in_grad_autosplit_0"),
        ("Sum", ["in_grad", "_in_grad_autosplit_0"], "in_grad"),
        ("DirectGradient", "in_grad", "in_grad"),
    ])


def test_branch_without_gradient_creates_no_autosplit() -> None:
    ops = [op("Direct", "in", "hidden1"), op("Nogradient", "in", "hidden2"),
           op("Direct", ["hidden1", "hidden2"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", ["hidden1_grad", "hidden2_grad"]),
                          ("DirectGradient", "hidden1_grad", "in_grad")])
    assert grad_map["in"] == "in_grad"


def test_no_gradient_first_reader_keeps_the_gradient() -> None:
    ops = [op("Nogradient", "in", "hidden2"), op("Direct", "in", "hidden1"),
           op("Direct", ["hidden1", "hidden2"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert [o.type for o in grad_ops] == ["DirectGradient", "DirectGradient"]
    assert grad_map["in"] == "in_grad"


def test_print_branch_creates_no_sum() -> None:
    ops = [op("Direct", "in", "fc"), op("Print", "fc", []), op("Direct", "fc", "loss")]
    grad_ops, _ = GetBackwardPass(ops, {"loss": "loss_grad"})
    assert_ops(grad_ops, [("DirectGradient", "loss_grad", "fc_grad"),
                          ("DirectGradient", "fc_grad", "in_grad")])


def test_in_place_direct_ops() -> None:
    ops = [op("Direct", "in", "in"), op("Direct", "in", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", "in_grad"),
                          ("DirectGradient", "in_grad", "in_grad")])
    assert grad_map == {"out": "out_grad", "in": "in_grad"}


def test_use_output_in_place_is_fine() -> None:
    ops = [op("Direct", "in", "in"), op("UseOutput", "in", "out"), op("Direct", "out", "sink")]
    grad_ops, _ = GetBackwardPass(ops, {"sink": "sink_grad"})
    assert_ops(grad_ops, [("DirectGradient", "sink_grad", "out_grad"),
                          ("UseOutputGradient", ["out", "out_grad"], "in_grad"),
                          ("DirectGradient", "in_grad", "in_grad")])


def test_use_input_reads_the_forward_input() -> None:
    ops = [op("Direct", "in", "hidden"), op("UseInput", "hidden", "out"),
           op("Direct", "out", "sink")]
    grad_ops, _ = GetBackwardPass(ops, {"sink": "sink_grad"})
    assert_ops(grad_ops, [("DirectGradient", "sink_grad", "out_grad"),
                          ("UseInputGradient", ["hidden", "out_grad"], "hidden_grad"),
                          ("DirectGradient", "hidden_grad", "in_grad")])


def test_y_also_read_by_another_op_gets_both_pieces() -> None:
    ops = [op("Direct", "in", "m1"), op("Direct", "m1", "m2")]
    grad_ops, grad_map = GetBackwardPass(ops, ["m2", "m1"])
    assert_ops(grad_ops, [
        ("ConstantFill", "m2", "m2_autogen_grad"),
        ("ConstantFill", "m1", "m1_autogen_grad"),
        ("DirectGradient", "m2_autogen_grad", "_m1_grad_autosplit_0"),
        ("Sum", ["m1_autogen_grad", "_m1_grad_autosplit_0"], "m1_autogen_grad"),
        ("DirectGradient", "m1_autogen_grad", "in_grad"),
    ])
    assert grad_map["m1"] == "m1_autogen_grad"


def test_given_gradient_named_like_a_gradient_op_output_raises() -> None:
    # The final Caffe2 refuses a passed-through piece named like the accumulated gradient.
    ops = [op("Direct", "in", "m1"), op("Direct", "m1", "m2")]
    with pytest.raises(RuntimeError, match="can not be the same as the normal name"):
        GetBackwardPass(ops, {"m2": "m2_grad", "m1": "m1_grad"})


def test_given_gradient_of_a_read_y_joins_the_sum() -> None:
    ops = [op("Direct", "in", "m1"), op("Direct", "m1", "m2")]
    grad_ops, grad_map = GetBackwardPass(ops, {"m2": "m2_grad", "m1": "m1_given"})
    assert_ops(grad_ops, [
        ("DirectGradient", "m2_grad", "m1_grad"),
        ("Sum", ["m1_grad", "m1_given"], "m1_grad"),  # Sum is in place on input 0
        ("DirectGradient", "m1_grad", "in_grad"),
    ])
    assert grad_map["m1"] == "m1_grad"


def test_same_blob_twice_in_one_op_is_summed() -> None:
    ops = [op("Direct", ["x", "x"], "y")]
    grad_ops, grad_map = GetBackwardPass(ops, {"y": "y_grad"})
    assert_ops(grad_ops, [("DirectGradient", "y_grad", ["x_grad", "_x_grad_autosplit_0"]),
                          ("Sum", ["x_grad", "_x_grad_autosplit_0"], "x_grad")])
    assert grad_map["x"] == "x_grad"


def test_sum_numbering_restarts_per_version() -> None:
    ops = [op("Direct", "x", "a"), op("Direct", "x", "b"), op("Direct", ["a", "b"], "x"),
           op("Direct", "x", "c"), op("Direct", "x", "d"), op("Direct", ["c", "d"], "y")]
    grad_ops, _ = GetBackwardPass(ops, {"y": "y_grad"})
    autosplits = [o.output[0] for o in grad_ops if o.output[0].startswith("_x_grad")]
    assert autosplits == ["_x_grad_autosplit_0", "_x_grad_autosplit_0"]
    assert [o.type for o in grad_ops].count("Sum") == 2


def test_forward_args_engine_and_device_are_stamped() -> None:
    gpu = DeviceOption(caffe2_pb2.CUDA, 2)
    ops = [op("Direct", "in", "out", gpu, alpha=0.5)]
    ops[0].engine = "CUDNN"
    grad_ops, _ = GetBackwardPass(ops, {"out": "out_grad"})
    (grad,) = grad_ops
    assert grad.is_gradient_op and grad.engine == "CUDNN"
    assert grad.device_option == gpu
    assert [(a.name, a.f) for a in grad.arg] == [("alpha", 0.5)]


def test_net_add_gradient_operators_appends_and_returns_map() -> None:
    net = core.Net("autodiff_net")
    net.Proto().op.extend([op("Direct", "in", "hidden"), op("Direct", "hidden", "out")])
    grad_map = net.AddGradientOperators(["out"])
    types = [o.type for o in net.Proto().op]
    assert types == ["Direct", "Direct", "ConstantFill", "DirectGradient", "DirectGradient"]
    assert grad_map["in"] == "in_grad" and grad_map["out"] == "out_autogen_grad"


def test_net_add_gradient_operators_skip() -> None:
    net = core.Net("autodiff_skip")
    net.Proto().op.extend([op("Direct", "in", "hidden"), op("Direct", "hidden", "out")])
    grad_map = net.AddGradientOperators({"out": "out_grad"}, skip=1)
    assert [o.type for o in net.Proto().op][2:] == ["DirectGradient"]
    assert "in" not in grad_map and grad_map["hidden"] == "hidden_grad"
