"""Misuse of the workspace API, nets, plans and devices: typed errors (with Caffe2's
builtin types), messages that name the blob/net/device and say what to do, and a workspace
left as it was."""

from __future__ import annotations

import numpy as np
from _error_checks import expect_error

from dpgraph import core, scope, workspace
from dpgraph.errors import (
    ArgumentError,
    BlobNotFoundError,
    DeviceError,
    DeviceOptionError,
    OperatorError,
    ScopeError,
    UnregisteredOperatorError,
    WorkspaceError,
    WorkspaceNameError,
)
from dpgraph.proto import caffe2_pb2

F32 = np.float32


def relu_net(name: str) -> core.Net:
    net = core.Net(name)
    net.Relu("x", "y")
    return net


def test_fetch_missing_blob_suggests_close_names() -> None:
    workspace.FeedBlob("data", np.ones(2, F32))
    error = expect_error(lambda: workspace.FetchBlob("dat"), BlobNotFoundError,
                         (KeyError, RuntimeError), "Can't find blob: dat",
                         "Did you mean: data", "FeedBlob")
    assert isinstance(error, WorkspaceError)


def test_feed_unsupported_object_keeps_the_old_value() -> None:
    workspace.FeedBlob("w", np.ones(2, F32))
    for bad in (object(), {"a": 1}):
        expect_error(lambda bad=bad: workspace.FeedBlob("w", bad), WorkspaceError,
                     RuntimeError, "FeedBlob('w')", type(bad).__name__, "numpy array")
    objects = np.array([object(), 1], dtype=object)
    expect_error(lambda: workspace.FeedBlob("w", objects), WorkspaceError, RuntimeError,
                 "FeedBlob('w')", "only bytes or str", "numeric dtype")
    np.testing.assert_array_equal(workspace.FetchBlob("w"), np.ones(2, F32))
    assert workspace.Blobs() == ["w"]
    workspace.FeedBlob("s", np.array(["a", b"b"], dtype=object))
    assert workspace.FetchBlob("s").tolist() == [b"a", b"b"]


def test_feed_with_a_non_string_name() -> None:
    expect_error(lambda: workspace.FeedBlob(3, np.ones(2)), WorkspaceNameError,
                 (TypeError, AssertionError), "blob name", "int 3")
    assert workspace.Blobs() == []


def test_run_unknown_net_and_bad_iteration_count() -> None:
    expect_error(lambda: workspace.RunNet("nonet"), WorkspaceError, RuntimeError,
                 "Can't find net nonet", "CreateNet")
    workspace.FeedBlob("x", np.full(2, -1.0, F32))
    net = relu_net("err_iters")
    workspace.CreateNet(net)
    expect_error(lambda: workspace.RunNet(net.Name(), "3"), WorkspaceError, TypeError,
                 net.Name(), "num_iter must be an int", "str")
    assert not workspace.HasBlob("y")


def test_create_net_refuses_to_overwrite() -> None:
    workspace.FeedBlob("x", np.ones(2, F32))
    net = relu_net("err_twice")
    workspace.CreateNet(net)
    expect_error(lambda: workspace.CreateNet(net), WorkspaceError, RuntimeError,
                 f'"{net.Name()}"', "overwrite=True")


def test_failed_overwrite_keeps_the_old_net() -> None:
    workspace.FeedBlob("x", np.full(2, -1.0, F32))
    good = relu_net("err_keep")
    workspace.CreateNet(good)
    bad = caffe2_pb2.NetDef()
    bad.CopyFrom(good.Proto())
    bad.op[0].type = "Rellu"
    expect_error(lambda: workspace.CreateNet(bad, overwrite=True), UnregisteredOperatorError,
                 (AttributeError, RuntimeError), "'Rellu'", good.Name(), "Did you mean: Relu")
    assert workspace.Nets() == [good.Name()]
    workspace.RunNet(good.Name())
    np.testing.assert_array_equal(workspace.FetchBlob("y"), np.zeros(2, F32))


def test_failed_create_registers_nothing() -> None:
    bad = core.Net("err_nothing")
    bad.Proto().op.add(type="Rellu", output=["y"])
    expect_error(lambda: workspace.CreateNet(bad), UnregisteredOperatorError, RuntimeError,
                 "'Rellu'")
    assert workspace.Nets() == [] and workspace.Blobs() == []


def test_create_and_run_with_wrong_types() -> None:
    expect_error(lambda: workspace.CreateNet(42), WorkspaceError, RuntimeError, "int")
    expect_error(lambda: workspace.RunOperatorOnce("Relu"), WorkspaceError, RuntimeError,
                 "OperatorDef", "str")


def test_running_a_mutated_net_checks_the_new_proto() -> None:
    workspace.FeedBlob("x", np.ones(2, F32))
    net = relu_net("err_mutated")
    workspace.RunNetOnce(net)
    net.Proto().op[0].input[0] = "nothere"
    expect_error(lambda: workspace.RunNetOnce(net), WorkspaceError, RuntimeError,
                 "Relu", "'nothere'", "external_input")


def test_failing_net_keeps_the_failed_ops_outputs() -> None:
    workspace.FeedBlob("a", np.ones((2, 3), F32))
    workspace.FeedBlob("b", np.ones((3, 3), F32))
    workspace.FeedBlob("c", np.zeros((2, 3), F32))
    net = core.Net("err_partial")
    net.Add(["a", "b"], "c")
    expect_error(lambda: workspace.RunNetOnce(net), OperatorError, ValueError, "Add",
                 net.Name(), "'b' (3, 3)")
    np.testing.assert_array_equal(workspace.FetchBlob("c"), np.zeros((2, 3), F32))


def test_run_plan_misuse() -> None:
    expect_error(lambda: workspace.RunPlan(3), WorkspaceError, RuntimeError, "PlanDef", "int")
    plan = caffe2_pb2.PlanDef(name="p")
    step = plan.execution_step.add(name="s", network=["x"])
    step.substep.add(name="t")
    expect_error(lambda: workspace.RunPlan(plan), WorkspaceError, RuntimeError,
                 "ExecutionStep 's'", "substeps and networks")
    plan = caffe2_pb2.PlanDef(name="p2")
    plan.execution_step.add(name="s", network=["nonet"])
    expect_error(lambda: workspace.RunPlan(plan), WorkspaceError, RuntimeError,
                 "nonet", "CreateNet")


def test_reading_a_blob_across_gpus_without_peer_access() -> None:
    workspace.SetVirtualGpus(2, peer_access=[[1, 0], [0, 1]])
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        workspace.FeedBlob("a", np.ones(2, F32))
    net = core.Net("err_peer")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        net.Relu("a", "b")
    error = expect_error(lambda: workspace.RunNetOnce(net), DeviceError, RuntimeError,
                         "'a'", "gpu_0", "gpu_1", "Copy")
    assert isinstance(error, OperatorError) and not workspace.HasBlob("b")


def test_cuda_ops_without_or_beyond_the_gpus() -> None:
    net = core.Net("err_nogpu")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 3)):
        net.ConstantFill([], "b", shape=[2], value=1.0)
    expect_error(lambda: workspace.RunNetOnce(net), DeviceError, RuntimeError,
                 "ConstantFill", "gpu_3", "SetVirtualGpus")
    workspace.SetVirtualGpus(2)
    expect_error(lambda: workspace.RunNetOnce(net), DeviceError, RuntimeError,
                 "gpu_3 does not exist", "0..1")
    assert not workspace.HasBlob("b")


def test_set_virtual_gpus_validates_its_arguments() -> None:
    workspace.SetVirtualGpus(2)
    expect_error(lambda: workspace.SetVirtualGpus(2, peer_access=[[1, 0]]), ArgumentError,
                 ValueError, "2x2")
    expect_error(lambda: workspace.SetVirtualGpus(-1), ArgumentError, ValueError, "-1")
    assert workspace.NumGpuDevices() == 2


def test_bad_device_options_and_scopes() -> None:
    expect_error(lambda: core.DeviceOption("cuda", 0), DeviceOptionError,
                 (TypeError, AssertionError), "device_type='cuda'", "caffe2_pb2.CUDA")
    expect_error(lambda: core.DeviceOption(caffe2_pb2.CUDA, 0, numa_node_id=1),
                 DeviceOptionError, AssertionError, "numa_node_id", "CPU")
    expect_error(lambda: core.DeviceScope(3).__enter__(), ScopeError, AssertionError,
                 "DeviceScope", "core.DeviceOption(")
    expect_error(lambda: core.NameScope(3).__enter__(), ScopeError, AssertionError,
                 "NameScope", "int 3")
    assert scope.CurrentDeviceScope() is None and scope.CurrentNameScope() == ""
