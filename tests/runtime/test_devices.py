"""Placement and virtual GPUs: device checks, copies, collectives, inheritance."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError, DeviceError, OperatorError
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices

CPU = core.DeviceOption(caffe2_pb2.CPU)


def gpu(i: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA, i)


def _current():
    from dpgraph.runtime.api import current

    return current()


def test_set_virtual_gpus_reports_devices() -> None:
    workspace.SetVirtualGpus(4)
    assert workspace.NumGpuDevices() == 4 and workspace.has_gpu_support
    assert workspace.GetGpuPeerAccessPattern().tolist() == np.ones((4, 4), bool).tolist()
    assert workspace.GetDeviceProperties(3)["name"] == "dpgraph virtual GPU 3"
    peer = np.eye(2, dtype=bool)
    workspace.SetVirtualGpus(2, peer_access=peer)
    assert workspace.GetGpuPeerAccessPattern().tolist() == peer.tolist()
    with pytest.raises(ArgumentError, match="2x2"):
        workspace.SetVirtualGpus(2, peer_access=np.ones((3, 3), bool))
    workspace.SetVirtualGpus(0)
    assert workspace.NumGpuDevices() == 0 and workspace.GetGpuPeerAccessPattern().size == 0


def test_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPGRAPH_VIRTUAL_GPUS", "3")
    state = devices._GpuState()
    assert state.virtual == 3 and state.peer.shape == (3, 3) and state.peer.all()
    monkeypatch.setenv("DPGRAPH_VIRTUAL_GPUS", "x")
    with pytest.raises(DeviceError):
        devices._GpuState()


def test_cuda_op_without_gpus_says_how_to_enable() -> None:
    workspace.FeedBlob("x", np.ones(2, np.float32))
    net = core.Net("rt_nogpu")
    with core.DeviceScope(gpu(0)):
        net.Scale("x", "y")
    with pytest.raises(DeviceError, match="SetVirtualGpus"):
        workspace.RunNetOnce(net)
    with pytest.raises(DeviceError, match="DPGRAPH_VIRTUAL_GPUS"):
        workspace.FeedBlob("g", np.ones(1, np.float32), gpu(0))


def test_feed_in_device_scope_places_blob() -> None:
    workspace.SetVirtualGpus(2)
    with core.DeviceScope(gpu(1)):
        workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.FeedBlob("c", np.ones(2, np.float32))
    assert _current().placement("x") == (caffe2_pb2.CUDA, 1)
    assert _current().placement("c") == (caffe2_pb2.CPU, 0)
    with pytest.raises(DeviceError, match="does not exist"):
        workspace.FeedBlob("y", np.ones(1, np.float32), gpu(5))
    with pytest.warns(UserWarning, match="float64"):
        workspace.FeedBlob("d", np.ones(1), gpu(0))


def test_op_outputs_live_on_op_device_and_net_default_is_inherited() -> None:
    workspace.SetVirtualGpus(2)
    workspace.FeedBlob("x", np.ones(2, np.float32), gpu(1))
    net = core.Net("rt_inherit")
    net.Scale("x", "y", scale=3.0)
    net.Proto().device_option.CopyFrom(gpu(1))
    workspace.RunNetOnce(net)
    assert _current().placement("y") == (caffe2_pb2.CUDA, 1)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [3.0, 3.0])


def test_peer_access_rules() -> None:
    workspace.SetVirtualGpus(2, peer_access=np.eye(2, dtype=bool))
    workspace.FeedBlob("a", np.ones(2, np.float32), gpu(0))
    net = core.Net("rt_peer")
    with core.DeviceScope(gpu(1)):
        net.Scale("a", "b")
    with pytest.raises(DeviceError, match="'a' lives on gpu_0 .* gpu_1") as info:
        workspace.RunNetOnce(net)
    assert isinstance(info.value, OperatorError)
    assert not workspace.HasBlob("b")
    workspace.SetVirtualGpus(2)  # full peer access
    workspace.RunNetOnce(net)
    assert _current().placement("b") == (caffe2_pb2.CUDA, 1)


def test_cpu_gpu_rules_and_copies() -> None:
    workspace.SetVirtualGpus(1)
    workspace.FeedBlob("g", np.array([1.0, 2.0], np.float32), gpu(0))
    workspace.FeedBlob("c", np.array([3.0], np.float32))
    gpu_reads_cpu = core.Net("rt_gpu_reads_cpu")
    with core.DeviceScope(gpu(0)):
        gpu_reads_cpu.Scale("c", "c2", scale=2.0)
    workspace.RunNetOnce(gpu_reads_cpu)
    cpu_reads_gpu = core.Net("rt_cpu_reads_gpu")
    with core.DeviceScope(CPU):
        cpu_reads_gpu.Scale("g", "g2")
    with pytest.raises(DeviceError, match="gpu_0"):
        workspace.RunNetOnce(cpu_reads_gpu)
    copies = core.Net("rt_copies")
    with core.DeviceScope(gpu(0)):
        copies.CopyGPUToCPU("g", "g_host")
        copies.CopyCPUToGPU("c", "c_dev")
        copies.EnsureCPUOutput("g", "g_ensured")
        copies.CopyFromCPUInput("c", "c_from")
    with core.DeviceScope(CPU):
        copies.Copy("g", "g_copy")  # Copy may cross devices
    workspace.RunNetOnce(copies)
    ws = _current()
    assert ws.placement("g_host") == (0, 0) and ws.placement("g_ensured") == (0, 0)
    assert ws.placement("c_dev") == (caffe2_pb2.CUDA, 0)
    assert ws.placement("c_from") == (caffe2_pb2.CUDA, 0)
    assert ws.placement("g_copy") == (0, 0)
    for name in ("g_host", "g_ensured", "g_copy"):
        np.testing.assert_array_equal(workspace.FetchBlob(name), [1.0, 2.0])
    assert ws.get_blob("g_copy") is not ws.get_blob("g")


def test_copy_gradients() -> None:
    op = core.CreateOperator("Copy", ["x"], ["y"])
    ops, grads = build_gradient(op, ["y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == \
        [("Copy", ["y_grad"], ["x_grad"])]
    ops, _ = build_gradient(core.CreateOperator("CopyGPUToCPU", ["x"], ["y"]), ["y_grad"])
    assert ops[0].type == "CopyCPUToGPU"
    ops, _ = build_gradient(core.CreateOperator("CopyCPUToGPU", ["x"], ["y"]), ["y_grad"])
    assert ops[0].type == "CopyGPUToCPU"
    ops, grads = build_gradient(op, [core.GradientSlice("gi", "gv")])
    assert [list(o.input) for o in ops] == [["gi"], ["gv"]]
    assert grads[0] == core.GradientSlice("x_grad_indices", "x_grad_values")


def _feed_per_gpu(name: str, values: list[list[float]]) -> list[str]:
    names = []
    for i, v in enumerate(values):
        workspace.FeedBlob(f"gpu_{i}/{name}", np.array(v, np.float32), gpu(i))
        names.append(f"gpu_{i}/{name}")
    return names


def test_nccl_collectives() -> None:
    workspace.SetVirtualGpus(3, peer_access=np.eye(3, dtype=bool))
    xs = _feed_per_gpu("x", [[1, 2], [3, 4], [5, 6]])
    net = core.Net("rt_nccl")
    with core.DeviceScope(gpu(0)):
        net.NCCLAllreduce(xs, [n + "_sum" for n in xs])
        net.NCCLBroadcast(xs, [n + "_b" for n in xs], root=1)
        net.NCCLReduce(xs, ["red"], root=2)
        net.NCCLAllGather(xs, [n + "_all" for n in xs])
        net.NCCLAllreduce(xs, xs)  # in place
    workspace.RunNetOnce(net)
    ws = _current()
    for i, n in enumerate(["gpu_0/x", "gpu_1/x", "gpu_2/x"]):
        np.testing.assert_array_equal(workspace.FetchBlob(n + "_sum"), [9, 12])
        np.testing.assert_array_equal(workspace.FetchBlob(n + "_b"), [3, 4])
        assert workspace.FetchBlob(n + "_all").shape == (3, 2)
        np.testing.assert_array_equal(workspace.FetchBlob(n), [9, 12])
        for suffix in ("_sum", "_b", "_all", ""):
            assert ws.placement(n + suffix) == (caffe2_pb2.CUDA, i)
    assert ws.placement("red") == (caffe2_pb2.CUDA, 2)
    np.testing.assert_array_equal(workspace.FetchBlob("red"), [9, 12])
    assert workspace.FetchBlob("gpu_0/x_sum").dtype == np.float32


def test_nccl_shape_mismatch_is_typed() -> None:
    from dpgraph.errors import ShapeError

    workspace.SetVirtualGpus(2)
    xs = _feed_per_gpu("x", [[1, 2], [3]])
    with pytest.raises(ShapeError, match="shape and dtype"):
        workspace.RunOperatorOnce(core.CreateOperator("NCCLAllreduce", xs, xs,
                                                      device_option=gpu(0)))


def test_copy_on_device_like() -> None:
    workspace.SetVirtualGpus(2)
    workspace.FeedBlob("g1", np.ones(2, np.float32), gpu(1))
    workspace.FeedBlob("c", np.array([4.0, 5.0], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("CopyOnDeviceLike", ["c", "g1"], ["c_on_1"],
                                                  device_option=gpu(0)))
    assert _current().placement("c_on_1") == (caffe2_pb2.CUDA, 1)
    np.testing.assert_array_equal(workspace.FetchBlob("c_on_1"), [4.0, 5.0])
