"""Spec api §4 and behaviour §6: gradient generation naming and structure."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpgraph import core, scope, workspace
from dpgraph.proto import caffe2_pb2

_ids = itertools.count()


def _net() -> core.Net:
    return core.Net(f"conf_grad_{next(_ids)}")


def _sig(op: caffe2_pb2.OperatorDef) -> tuple[str, list[str], list[str]]:
    return op.type, list(op.input), list(op.output)


def test_fc_print_averaged_loss_example() -> None:
    net = _net()
    net.FC(["in", "w", "b"], "fc")
    net.Print("fc", [])
    net.AveragedLoss("fc", "loss")
    n_fwd = len(net.Proto().op)
    grad_map = net.AddGradientOperators(["loss"])
    grad_ops = net.Proto().op[n_fwd:]
    assert [_sig(op) for op in grad_ops] == [
        ("ConstantFill", ["loss"], ["loss_autogen_grad"]),
        ("AveragedLossGradient", ["fc", "loss_autogen_grad"], ["fc_grad"]),
        ("FCGradient", ["in", "w", "fc_grad"], ["w_grad", "b_grad", "in_grad"]),
    ]
    fill_args = {a.name: a for a in grad_ops[0].arg}
    assert fill_args["value"].f == 1.0
    assert not grad_ops[0].is_gradient_op
    assert all(op.is_gradient_op for op in grad_ops[1:])
    for blob in ("in", "w", "b", "fc", "loss"):
        assert blob in grad_map
    assert grad_map["w"] == "w_grad" and grad_map["loss"] == "loss_autogen_grad"
    assert all(isinstance(k, core.BlobReference) and k.Net() is None for k in grad_map)
    assert all(isinstance(v, core.BlobReference) for v in grad_map.values())


def test_dict_ys_with_given_gradient() -> None:
    net = _net()
    net.Relu("x", "y")
    grad_map = net.AddGradientOperators({"y": "my_y_grad"})
    assert [_sig(op) for op in net.Proto().op[1:]] == [
        ("ReluGradient", ["y", "my_y_grad"], ["x_grad"])]
    assert grad_map["x"] == "x_grad" and grad_map["y"] == "my_y_grad"


def test_autogen_fill_picks_up_scopes() -> None:
    net = _net()
    with scope.NameScope("gpu_0"):
        net.Relu("x", "y")
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 3)):
        net.AddGradientOperators([core.BlobReference("gpu_0/y")])
    fill = net.Proto().op[1]
    assert fill.type == "ConstantFill" and list(fill.input) == ["gpu_0/y"]
    assert list(fill.output) == ["gpu_0/y_autogen_grad"]
    assert fill.device_option.device_type == caffe2_pb2.CUDA
    assert fill.device_option.device_id == 3
    net2 = _net()
    net2.Relu("y", "z")
    with scope.NameScope("s"):
        net2.AddGradientOperators(["z"])  # plain string: current name scope applied
    assert list(net2.Proto().op[1].input) == ["s/z"]
    assert list(net2.Proto().op[1].output) == ["s/z_autogen_grad"]


def test_skip_argument() -> None:
    net = _net()
    net.Relu("x", "y")
    net.Sigmoid("y", "z")
    net.AddGradientOperators({"z": "z_g"}, skip=1)
    assert [op.type for op in net.Proto().op[2:]] == ["SigmoidGradient"]


def test_grad_op_copies_device_engine_and_args() -> None:
    net = _net()
    dev = core.DeviceOption(caffe2_pb2.CUDA, 2)
    net.Softmax("x", "y", axis=1, engine="CUDNN", device_option=dev)
    net.AddGradientOperators({"y": "y_grad"})
    grad = net.Proto().op[1]
    assert grad.type == "SoftmaxGradient"
    assert grad.device_option == dev and grad.engine == "CUDNN"
    assert [(a.name, a.i) for a in grad.arg] == [("axis", 1)]
    assert grad.is_gradient_op


def test_multiple_consumers_autosplit_and_sum() -> None:
    net = _net()
    net.Relu("in", "h1")
    net.Sigmoid("in", "h2")
    net.Add(["h1", "h2"], "out")
    net.AddGradientOperators({"out": "out_grad"})
    ops = [_sig(op) for op in net.Proto().op[3:]]
    # AddGradient writes h1_grad and h2_grad; Sigmoid (last consumer of `in`) writes in_grad
    assert ops == [
        ("AddGradient", ["out_grad", "h1", "h2"], ["h1_grad", "h2_grad"]),
        ("SigmoidGradient", ["h2", "h2_grad"], ["in_grad"]),
        ("ReluGradient", ["h1", "h1_grad"], ["_in_grad_autosplit_0"]),
        ("Sum", ["in_grad", "_in_grad_autosplit_0"], ["in_grad"]),
    ]


def test_sum_carries_device_option() -> None:
    net = _net()
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        net.Relu("in", "h1")
        net.Relu("in", "h2")
    grad_map = net.AddGradientOperators({"h1": "h1_grad", "h2": "h2_grad"})
    sum_op = net.Proto().op[-1]
    assert sum_op.type == "Sum"
    assert sum_op.device_option.device_type == caffe2_pb2.CUDA
    assert sum_op.device_option.device_id == 1
    assert grad_map["in"] == "in_grad"


def test_mismatched_device_options_raise() -> None:
    net = _net()
    net.Relu("in", "h1", device_option=core.DeviceOption(caffe2_pb2.CUDA, 0))
    net.Relu("in", "h2", device_option=core.DeviceOption(caffe2_pb2.CUDA, 1))
    with pytest.raises(RuntimeError, match="device option"):
        net.AddGradientOperators({"h1": "h1_grad", "h2": "h2_grad"})


def test_branch_without_gradient_creates_no_autosplit() -> None:
    net = _net()
    net.Relu("in", "h")
    net.Print("in", [])
    net.AddGradientOperators({"h": "h_grad"})
    ops = net.Proto().op[2:]
    assert [_sig(op) for op in ops] == [("ReluGradient", ["h", "h_grad"], ["in_grad"])]


def test_stop_gradient() -> None:
    net = _net()
    net.Relu("x", "h")
    net.StopGradient("h", "hs")
    net.Relu("hs", "out")
    grad_map = net.AddGradientOperators({"out": "out_grad"})
    assert [op.type for op in net.Proto().op[3:]] == ["ReluGradient"]
    assert "x" not in grad_map and "h" not in grad_map
    unused = _net()
    unused.StopGradient("a", "b")
    unused.Relu("a", "c")
    with pytest.raises(ValueError):
        unused.AddGradientOperators({"c": "c_grad"})
    inplace = _net()
    inplace.Relu("in", "hidden")
    inplace.StopGradient("hidden", "hidden")
    inplace.Relu("hidden", "out")
    grad_map = inplace.AddGradientOperators({"out": "out_grad"})
    assert [_sig(op) for op in inplace.Proto().op[3:]] == [
        ("ReluGradient", ["out", "out_grad"], ["hidden_grad"])]
    assert {str(k): str(v) for k, v in grad_map.items()} == {"out": "out_grad"}


def test_inplace_overwrite_version_error() -> None:
    net = _net()
    net.Sigmoid("x", "y")   # SigmoidGradient reads the output y
    net.Relu("z", "y")      # y overwritten afterwards
    net.Add(["y", "y"], "w")
    with pytest.raises(RuntimeError, match="version"):
        core.GradientRegistry.GetBackwardPass(
            [net.Proto().op[0], net.Proto().op[1]], {"y": "y_grad"})


def test_numeric_chain_rule() -> None:
    net = _net()
    net.Scale("in", "m1", scale=2.0)
    net.Scale("m1", "m2", scale=3.0)
    grad_map = net.AddGradientOperators(["m2", "m1"])
    workspace.ResetWorkspace()
    workspace.FeedBlob("in", np.array([1.0], dtype=np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob(grad_map["in"]), [8.0])
    workspace.ResetWorkspace()


def test_sparse_gather_gradient_slice() -> None:
    net = _net()
    net.Gather(["data", "idx"], "g")
    grad_map = net.AddGradientOperators({"g": "g_grad"})
    assert isinstance(grad_map["data"], core.GradientSlice)
    assert grad_map["data"].indices == "idx" and grad_map["data"].values == "g_grad"


def test_sparse_accumulation_concat() -> None:
    net = _net()
    net.Gather(["x2", "x1"], "x4")
    net.Gather(["x2", "x3"], "x5")
    grad_map = net.AddGradientOperators({"x4": "x4_grad", "x5": "x5_grad"})
    concats = [_sig(op) for op in net.Proto().op if op.type == "Concat"]
    assert concats == [
        ("Concat", ["x3", "x1"], ["x2_grad_indices_concat", "x2_grad_indices_concat_split"]),
        ("Concat", ["x5_grad", "x4_grad"],
         ["x2_grad_values_concat", "x2_grad_values_concat_split"]),
    ]
    for op in net.Proto().op:
        if op.type == "Concat":
            assert [(a.name, a.i) for a in op.arg] == [("axis", 0)]
    assert grad_map["x2"] == core.GradientSlice("x2_grad_indices_concat",
                                                "x2_grad_values_concat")


def test_mixed_dense_sparse_raises() -> None:
    net = _net()
    net.Gather(["x", "i"], "g")
    net.Relu("x", "r")
    with pytest.raises(RuntimeError):
        net.AddGradientOperators({"g": "g_grad", "r": "r_grad"})


def test_python_registered_gradient() -> None:
    op_type = "Copy"  # has a schema maker: it wins over a Python maker
    assert core.GradientRegistry.GetGradientForOp(
        core.CreateOperator(op_type, "a", "b"), ["b_grad"])[1] == ["a_grad"]
    ops, g_in = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("Relu", "a", "b"), ["b_grad"])
    assert isinstance(ops, list) and g_in == ["a_grad"]


def test_numeric_multi_use_with_sub() -> None:
    net = _net()
    net.Scale("in", "m1", scale=2.0)
    net.Scale("in", "m2", scale=3.0)
    net.ConstantFill([], "one", shape=[1], value=1.0)
    net.Sub(["m1", "one"], "sub", broadcast=1)
    grad_map = net.AddGradientOperators(["m2", "sub"])
    workspace.ResetWorkspace()
    workspace.FeedBlob("in", np.array([1.0], dtype=np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob(grad_map["in"]), [5.0])
    workspace.ResetWorkspace()


def test_incorrect_operator_mentions_schema() -> None:
    op = core.CreateOperator("Mul", ["X"], ["Y"])
    with pytest.raises(Exception, match="schema"):
        core.GradientRegistry.GetBackwardPass([op], ["Y"])



def test_sum_extra_info_tag() -> None:
    net = _net()
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1, extra_info=["k:v"])):
        net.Relu("in", "a")
        net.Relu("in", "b")
    net.AddGradientOperators(["a", "b"])
    sum_op = net.Proto().op[-1]
    assert sum_op.type == "Sum"
    assert "is_auto_gen_sum_ops:1" in sum_op.device_option.extra_info
    assert "k:v" in sum_op.device_option.extra_info


def test_python_gradient_registry_single_and_none() -> None:
    from dpgraph.autodiff import GradientRegistry

    registry = GradientRegistry()  # private instance: nothing leaks into the global one

    @registry.RegisterGradient("ConfPySingle")
    def _single(op: caffe2_pb2.OperatorDef, g_output: list) -> tuple:
        grad = core.CreateOperator("Copy", [g_output[0]], [op.input[0] + "_grad"])
        return grad, [op.input[0] + "_grad"]

    @registry.RegisterGradient("ConfPyNone")
    def _none(op: caffe2_pb2.OperatorDef, g_output: list) -> tuple:
        return None, [None]

    ops, g_in = registry.GetGradientForOp(core.CreateOperator("ConfPySingle", "a", "b"),
                                          ["b_grad"])
    assert isinstance(ops, list) and len(ops) == 1 and g_in == ["a_grad"]
    assert list(ops[0].input) == ["b_grad"]
    assert registry.GetGradientForOp(core.CreateOperator("ConfPyNone", "a", "b"),
                                     ["b_grad"]) == ([], [None])
    fwd = [core.CreateOperator("ConfPySingle", "x", "y")]
    grad_ops, grad_map = registry.GetBackwardPass(fwd, {"y": "y_grad"})
    assert [op.type for op in grad_ops] == ["Copy"] and grad_map["x"] == "x_grad"
