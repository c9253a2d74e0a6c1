"""Spec api §6: the ``workspace`` module (current workspace, blobs, nets, typed errors)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _workspace import clean_runtime  # noqa: F401  (autouse)

from dpgraph import core, scope, workspace
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices

_ids = itertools.count()


def _net(*ops: tuple[str, list[str], list[str]]) -> core.Net:
    net = core.Net(f"conf_ws_{next(_ids)}")
    for op_type, ins, outs in ops:
        getattr(net, op_type)(ins, outs)
    return net


# --- blobs ----------------------------------------------------------------------------------
def test_blob_basics() -> None:
    assert workspace.CurrentWorkspace() == "default"
    assert "default" in workspace.Workspaces()
    assert workspace.Blobs() == []
    assert workspace.CreateBlob("b") is True
    assert workspace.CreateBlob("b") is True
    assert workspace.HasBlob("b") and not workspace.HasBlob("nope")
    assert workspace.FeedBlob("a", np.arange(3, dtype=np.float32)) is True
    assert workspace.Blobs() == ["a", "b"]  # sorted
    assert workspace.HasBlob(core.BlobReference("a"))


def test_feed_fetch_types() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    workspace.FeedBlob(core.BlobReference("x"), arr)
    out = workspace.FetchBlob("x")
    np.testing.assert_array_equal(out, arr)
    assert out.dtype == np.float32
    out[0, 0] = 100  # a copy
    assert workspace.FetchBlob("x")[0, 0] == 0
    workspace.FeedBlob("s", "hello")
    assert workspace.FetchBlob("s") == b"hello"
    workspace.FeedBlob("bs", b"raw")
    assert workspace.FetchBlob("bs") == b"raw"
    workspace.FeedBlob("u", np.array(["a", "bc"]))
    fetched = workspace.FetchBlob("u")
    assert fetched.dtype == object and list(fetched) == [b"a", b"bc"]
    tensor = caffe2_pb2.TensorProto(dims=[2], data_type=caffe2_pb2.TensorProto.INT32,
                                    int32_data=[4, 5])
    workspace.FeedBlob("t", tensor)
    np.testing.assert_array_equal(workspace.FetchBlob("t"), [4, 5])
    assert workspace.FetchBlob("t").dtype == np.int32
    assert [v.tolist() for v in workspace.FetchBlobs(["x", "t"])] == [arr.tolist(), [4, 5]]


def test_fetch_missing_blob_error() -> None:
    with pytest.raises(RuntimeError, match="Can't find blob: missing"):
        workspace.FetchBlob("missing")


def test_feed_bad_type_error() -> None:
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        workspace.FeedBlob("bad", object())
    assert "bad" in str(info.value)
    for name in (3.5, None):
        with pytest.raises(AssertionError, match="Expected a string or BlobReference"):
            workspace.FeedBlob(name, np.zeros(1))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            workspace.FetchBlob(name)  # type: ignore[arg-type]
    assert workspace.Blobs() == []


def test_feed_blob_uses_device_scope() -> None:
    workspace.SetVirtualGpus(2)
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        workspace.FeedBlob("g", np.ones(2, dtype=np.float32))
    assert workspace.FetchBlob("g").tolist() == [1.0, 1.0]
    from dpgraph.runtime.api import current

    assert current().placement("g") == (caffe2_pb2.CUDA, 1)
    with pytest.warns(UserWarning):
        workspace.FeedBlob("d", np.ones(2), core.DeviceOption(caffe2_pb2.CUDA, 0))


def test_reset_blob_and_workspace() -> None:
    workspace.FeedBlob("a", np.ones(1, dtype=np.float32))
    net = _net(("Relu", ["a"], ["b"]))
    workspace.CreateNet(net)
    assert workspace.ResetWorkspace() is True
    assert workspace.Blobs() == []
    with pytest.raises(RuntimeError):
        workspace.RunNet(net)


def test_switch_workspace() -> None:
    name = f"conf_ws_switch_{next(_ids)}"
    with pytest.raises(RuntimeError):
        workspace.SwitchWorkspace(name)
    workspace.FeedBlob("in_default", np.ones(1, dtype=np.float32))
    workspace.SwitchWorkspace(name, True)
    assert workspace.CurrentWorkspace() == name
    assert not workspace.HasBlob("in_default")
    assert name in workspace.Workspaces()
    workspace.SwitchWorkspace("default")
    assert workspace.HasBlob("in_default")
    with workspace.WorkspaceGuard(name + "_guard"):
        assert workspace.CurrentWorkspace() == name + "_guard"
    assert workspace.CurrentWorkspace() == "default"


def test_blobs_dict() -> None:
    workspace.blobs["k"] = np.array([2.0], dtype=np.float32)
    assert workspace.blobs["k"].tolist() == [2.0]
    assert "k" in workspace.blobs


# --- nets -----------------------------------------------------------------------------------
def test_create_and_run_net() -> None:
    net = _net(("Relu", ["x"], ["y"]))
    workspace.FeedBlob("x", np.array([-1.0, 2.0], dtype=np.float32))
    assert workspace.CreateNet(net) is True
    assert workspace.RunNet(net.Name()) is True
    assert workspace.RunNet(net, num_iter=3) is True
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [0.0, 2.0])
    with pytest.raises(RuntimeError, match="respectfully refuse"):
        workspace.CreateNet(net)
    assert workspace.CreateNet(net, overwrite=True) is True
    assert workspace.CreateNet(net.Proto(), overwrite=True) is True
    assert workspace.CreateNet(net.Proto().SerializeToString(), overwrite=True) is True


def test_create_net_input_blobs() -> None:
    net = _net(("Relu", ["x"], ["y"]))
    workspace.CreateNet(net, input_blobs=["x", "extra"])
    assert workspace.HasBlob("x") and workspace.HasBlob("extra")


def test_create_net_checks() -> None:
    # inputs are only checked when external_input is declared
    unchecked = _net(("Relu", ["undeclared"], ["y"]))
    del unchecked.Proto().external_input[:]
    workspace.CreateNet(unchecked)
    checked = _net(("Relu", ["a"], ["b"]), ("Relu", ["c"], ["d"]))
    del checked.Proto().external_input[:]
    checked.Proto().external_input.append("a")
    with pytest.raises(RuntimeError):
        workspace.CreateNet(checked)
    bad_out = _net(("Relu", ["a"], ["b"]))
    bad_out.Proto().external_output.append("never_made")
    with pytest.raises(RuntimeError):
        workspace.CreateNet(bad_out)


def test_run_net_unknown_and_allow_fail() -> None:
    with pytest.raises(RuntimeError, match="Can't find net"):
        workspace.RunNet("no_such_net")
    created = _net(("Relu", ["x"], ["y"]))
    workspace.CreateNet(created)
    with pytest.raises(AssertionError, match="Expected a string or Net"):
        workspace.RunNet(created.Proto())  # a NetDef is not accepted
    assert workspace.GetNetName(created.Proto()) == created.Name()
    net = _net(("Relu", ["x"], ["y"]))
    workspace.CreateNet(net)  # x missing at run time
    with pytest.raises(RuntimeError, match="x"):
        workspace.RunNet(net)
    assert workspace.RunNet(net, allow_fail=True) is False


def test_run_net_once_operator_once() -> None:
    workspace.FeedBlob("x", np.array([-1.0, 3.0], dtype=np.float32))
    net = _net(("Relu", ["x"], ["y"]))
    assert workspace.RunNetOnce(net) is True
    assert workspace.RunNetOnce(net.Proto()) is True
    assert workspace.RunNetOnce(net.Proto().SerializeToString()) is True
    assert net.Name() not in workspace.Nets()
    op = core.CreateOperator("Relu", "x", "z")
    assert workspace.RunOperatorOnce(op) is True
    assert workspace.RunOperatorsOnce([op, core.CreateOperator("Relu", "z", "w")]) is True
    np.testing.assert_array_equal(workspace.FetchBlob("w"), [0.0, 3.0])
    with pytest.raises(RuntimeError, match="missing"):
        workspace.RunOperatorOnce(core.CreateOperator("Relu", "missing", "q"))


def test_run_plan() -> None:
    workspace.FeedBlob("x", np.array([1.0], dtype=np.float32))
    net = _net(("Relu", ["x"], ["y"]))
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("s", [net]))
    assert workspace.RunPlan(plan) is True
    assert workspace.FetchBlob("y").tolist() == [1.0]


# --- GPU info (no GPU, no virtual GPUs) -----------------------------------------------------
def test_gpu_info_without_gpu() -> None:
    if devices.real_gpu_count():
        pytest.skip("a real GPU is present")
    assert workspace.has_gpu_support is False
    assert workspace.has_cuda_support is False
    assert workspace.has_hip_support is False
    assert workspace.GpuDeviceType == caffe2_pb2.CUDA
    assert workspace.NumCudaDevices() == 0 and workspace.NumGpuDevices() == 0
    assert workspace.GetCUDAVersion() == 0 and workspace.GetCuDNNVersion() == 0
    pattern = workspace.GetGpuPeerAccessPattern()
    assert isinstance(pattern, np.ndarray) and pattern.size == 0
    assert workspace.GetCudaPeerAccessPattern is not None


def test_virtual_gpu_peer_pattern() -> None:
    workspace.SetVirtualGpus(2)
    pattern = workspace.GetGpuPeerAccessPattern()
    assert pattern.shape == (2, 2) and pattern.dtype == bool
    assert workspace.NumGpuDevices() == 2


# --- misc -----------------------------------------------------------------------------------
def test_infer_shapes_and_types() -> None:
    net = _net(("Relu", ["x"], ["y"]))
    shapes, types = workspace.InferShapesAndTypes([net], {"x": [2, 3]})
    assert shapes["y"] == [2, 3]
    assert types["y"] == caffe2_pb2.TensorProto.FLOAT
    workspace.FeedBlob("x", np.zeros((4, 1), dtype=np.float32))
    shapes, _ = workspace.InferShapesAndTypes([net])
    assert shapes["y"] == [4, 1]
    shapes, types = workspace.InferShapesAndTypes(
        [net.Proto()], {"x": [5]}, nets_proto=True,
        blob_types={"x": caffe2_pb2.TensorProto.INT32})
    assert shapes["y"] == [5] and types["y"] == caffe2_pb2.TensorProto.INT32


def test_stringify_helpers() -> None:
    net = _net(("Relu", ["x"], ["y"]))
    assert workspace.StringifyProto("abc") == "abc"
    assert workspace.StringifyProto(net.Proto()) == net.Proto().SerializeToString()
    assert workspace.StringifyProto(net) == net.Proto().SerializeToString()
    assert workspace.StringifyBlobName(core.BlobReference("b")) == "b"
    assert workspace.StringifyNetName(net) == net.Name()
    assert workspace.GetNetName(net) == net.Name()
    with scope.NameScope("ns"):
        assert workspace.GetNameScope() == "ns/"
    assert isinstance(workspace.operator_tracebacks, dict)
    assert workspace.operator_tracebacks["never_seen_net"] == {}


def test_serialize_round_trip() -> None:
    workspace.FeedBlob("v", np.arange(4, dtype=np.int64))
    data = workspace.SerializeBlob("v")
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(data)
    assert proto.name == "v"
    workspace.DeserializeBlob("v2", data)
    np.testing.assert_array_equal(workspace.FetchBlob("v2"), np.arange(4))
    assert workspace.FetchBlob("v2").dtype == np.int64


def test_root_folder(tmp_path: object) -> None:
    assert isinstance(workspace.RootFolder(), str)
    folder = str(tmp_path) + "/root"
    workspace.ResetWorkspace(folder)
    assert workspace.RootFolder() == folder
    workspace.ResetWorkspace()
    assert workspace.RootFolder() == folder


def test_immediate_and_memory_helpers() -> None:
    assert workspace.IsImmediate() is False
    assert workspace.StopImmediate() is None
    workspace.StartImmediate(i_know=True)
    try:
        assert workspace.IsImmediate() is True
    finally:
        workspace.StopImmediate()
    assert workspace.IsImmediate() is False
    workspace.SetVirtualGpus(2)
    info = workspace.GetGPUMemoryInfo()
    assert info["total_by_gpu"] == [0, 0] and info["total"] == 0
    workspace.FeedBlob("i8", np.zeros(1, dtype=np.int8))
    with pytest.raises(NotImplementedError):
        workspace.FetchInt8Blob("i8")


def test_create_net_bad_ops_are_runtime_errors() -> None:
    unknown = caffe2_pb2.NetDef(name=f"conf_ws_unknown_{next(_ids)}")
    unknown.op.add(type="NoSuchOperatorXyz", input=["a"], output=["b"])
    with pytest.raises(RuntimeError, match="NoSuchOperatorXyz"):
        workspace.CreateNet(unknown)
    with pytest.raises(AttributeError):
        workspace.RunNetOnce(unknown)
    arity = caffe2_pb2.NetDef(name=f"conf_ws_arity_{next(_ids)}")
    arity.op.add(type="Relu", input=["a", "b", "c"], output=["d"])
    with pytest.raises(RuntimeError, match="Relu"):
        workspace.CreateNet(arity)
    assert unknown.name not in workspace.Nets() and arity.name not in workspace.Nets()
