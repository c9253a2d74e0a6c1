"""The Caffe2 workspace facade: blobs, workspaces, nets, operators, misc helpers."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import (
    BlobNotFoundError,
    OperatorError,
    OperatorFailedError,
    UnknownOperatorError,
    WorkspaceError,
)
from dpgraph.ir import net as ir_net
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime.serialization import numpy_to_tensor_proto


def test_feed_fetch_roundtrip_copies() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert workspace.FeedBlob("x", x) is True
    x[0, 0] = 100  # feeding copies
    got = workspace.FetchBlob("x")
    assert got.dtype == np.float32 and got.shape == (2, 3) and got[0, 0] == 0
    got[0, 1] = 50  # fetching copies
    assert workspace.FetchBlob("x")[0, 1] == 1
    assert workspace.FetchBlobs(["x", "x"])[1].shape == (2, 3)


def test_feed_strings_tensorproto_and_blobreference() -> None:
    workspace.FeedBlob("s", "hello")
    assert workspace.FetchBlob("s") == b"hello"
    workspace.FeedBlob(core.BlobReference("t"), numpy_to_tensor_proto(np.array([1, 2], np.int64)))
    np.testing.assert_array_equal(workspace.FetchBlob("t"), [1, 2])
    assert workspace.FetchBlob("t").dtype == np.int64
    workspace.FeedBlob("u", np.array(["a", "bc"]))
    got = workspace.FetchBlob("u")
    assert got.dtype == object and list(got) == [b"a", b"bc"]
    workspace.FeedBlob("scalar", np.float32(3))
    assert workspace.FetchBlob("scalar").shape == ()


def test_fetch_missing_blob_message_and_types() -> None:
    with pytest.raises(RuntimeError, match="Can't find blob: nope"):
        workspace.FetchBlob("nope")
    with pytest.raises(BlobNotFoundError):
        workspace.FetchBlob("nope")


def test_blobs_has_create_reset() -> None:
    workspace.FeedBlob("b", np.ones(1))
    workspace.FeedBlob("a", np.ones(1))
    assert workspace.CreateBlob("c") is True
    assert workspace.Blobs() == ["a", "b", "c"]
    assert workspace.HasBlob("c") and not workspace.HasBlob("d")
    workspace.ResetBlob("a")
    assert workspace.HasBlob("a")
    with pytest.raises(WorkspaceError, match="empty"):
        workspace.FetchBlob("a")


def test_blob_dict() -> None:
    workspace.blobs["x"] = np.array([1.0, 2.0], np.float32)
    assert "x" in workspace.blobs and len(workspace.blobs) == 1
    np.testing.assert_array_equal(workspace.blobs["x"], [1.0, 2.0])
    assert list(workspace.blobs) == ["x"]


def test_switch_workspace_and_guard() -> None:
    assert workspace.CurrentWorkspace() == "default"
    workspace.FeedBlob("x", np.ones(1))
    with pytest.raises(RuntimeError, match="does not exist"):
        workspace.SwitchWorkspace("rt_other")
    workspace.SwitchWorkspace("rt_other", True)
    assert workspace.CurrentWorkspace() == "rt_other" and not workspace.HasBlob("x")
    assert "rt_other" in workspace.Workspaces()
    workspace.SwitchWorkspace("default")
    with workspace.WorkspaceGuard("rt_guard"):
        assert workspace.CurrentWorkspace() == "rt_guard"
        workspace.FeedBlob("y", np.ones(1))
    assert workspace.CurrentWorkspace() == "default" and workspace.HasBlob("x")
    assert not workspace.HasBlob("y")


def test_reset_workspace_root_folder(tmp_path) -> None:
    workspace.FeedBlob("x", np.ones(1))
    net = core.Net("rt_reset")
    net.Scale("x", "y", scale=2.0)
    workspace.CreateNet(net)
    folder = tmp_path / "root"
    assert workspace.ResetWorkspace(str(folder)) is True
    assert folder.is_dir() and workspace.RootFolder() == str(folder)
    assert workspace.Blobs() == [] and workspace.Nets() == []
    workspace.ResetWorkspace()
    assert workspace.RootFolder() == str(folder)


def _scale_net(name: str) -> core.Net:
    net = core.Net(name)
    net.Scale("x", "y", scale=2.0)
    return net


def test_create_and_run_net() -> None:
    net = _scale_net("rt_run")
    net.Proto().op[0].output[0] = "x"  # in place: x *= 2 per run
    workspace.FeedBlob("x", np.array([1.0], np.float32))
    assert workspace.CreateNet(net) is True
    assert workspace.RunNet(net, num_iter=3) is True
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [8.0])
    assert workspace.RunNet(net.Name()) is True
    np.testing.assert_array_equal(workspace.FetchBlob("x"), [16.0])
    with pytest.raises(RuntimeError, match="respectfully refuse"):
        workspace.CreateNet(net)
    assert workspace.CreateNet(net, overwrite=True)


def test_create_net_snapshot_and_input_blobs() -> None:
    net = _scale_net("rt_snap")
    workspace.CreateNet(net, input_blobs=["x"])
    assert workspace.HasBlob("x")
    net.Proto().op[0].arg[0].f = 5.0  # later edits do not change the created net
    workspace.FeedBlob("x", np.array([1.0], np.float32))
    workspace.RunNet(net)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [2.0])


def test_create_net_checks() -> None:
    proto = caffe2_pb2.NetDef(name="rt_checks")
    proto.op.add().CopyFrom(core.CreateOperator("Scale", ["x"], ["y"]))
    proto.external_input.append("other")
    with pytest.raises(RuntimeError, match="Source for input 'x' is unknown"):
        workspace.CreateNet(proto)
    with pytest.raises(RuntimeError, match="Source for input 'x' is unknown"):
        workspace.RunNetOnce(proto)
    del proto.external_input[:]
    proto.external_output.append("nowhere")
    with pytest.raises(RuntimeError, match="Did not find output 'nowhere'"):
        workspace.CreateNet(proto)
    del proto.external_output[:]
    proto.op[0].type = "Scal"
    with pytest.raises(UnknownOperatorError, match="Did you mean: Scale"):
        workspace.CreateNet(proto)


def test_run_net_errors_and_allow_fail() -> None:
    with pytest.raises(RuntimeError, match="Can't find net"):
        workspace.RunNet("rt_missing_net")
    workspace.CreateNet(_scale_net("rt_fail"))
    with pytest.raises(OperatorError, match="non-existing input blob: 'x'"):
        workspace.RunNet("rt_fail")
    assert workspace.RunNet("rt_fail", allow_fail=True) is False


def test_allow_fail_covers_reported_failures_not_kernel_exceptions() -> None:
    failing = core.Net("rt_fail_op")
    failing.Fail([], [])
    workspace.CreateNet(failing)
    with pytest.raises(OperatorFailedError, match="Fail"):
        workspace.RunNet(failing)
    assert workspace.RunNet(failing, allow_fail=True) is False
    for op_type in ("ThrowException", "ThrowChildThreadException"):
        throwing = core.Net(f"rt_{op_type}")
        getattr(throwing, op_type)([], [], message="boom")
        workspace.CreateNet(throwing)
        for allow_fail in (False, True):
            with pytest.raises(OperatorError, match="boom"):
                workspace.RunNet(throwing, allow_fail=allow_fail)


def test_run_net_once_and_operators() -> None:
    workspace.FeedBlob("x", np.array([3.0], np.float32))
    assert workspace.RunNetOnce(_scale_net("rt_once")) is True
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [6.0])
    assert workspace.Nets() == []
    op = core.CreateOperator("Scale", ["x"], ["z"], scale=3.0)
    assert workspace.RunOperatorOnce(op) is True
    np.testing.assert_array_equal(workspace.FetchBlob("z"), [9.0])
    assert workspace.RunOperatorOnce(op.SerializeToString())
    ops = [core.CreateOperator("Scale", ["z"], ["w"], scale=2.0),
           core.CreateOperator("Relu", ["w"], ["v"])]
    assert workspace.RunOperatorsOnce(ops) is True
    np.testing.assert_array_equal(workspace.FetchBlob("v"), [18.0])


def test_run_net_once_accepts_proto_and_bytes() -> None:
    workspace.FeedBlob("x", np.array([1.0], np.float32))
    net = _scale_net("rt_bytes")
    workspace.RunNetOnce(net.Proto())
    workspace.RunNetOnce(net.Proto().SerializeToString())
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [2.0])


def test_serialize_deserialize_blob() -> None:
    x = np.arange(4, dtype=np.int32).reshape(2, 2)
    workspace.FeedBlob("x", x)
    data = workspace.SerializeBlob("x")
    proto = caffe2_pb2.BlobProto.FromString(data)
    assert proto.name == "x" and proto.type == "Tensor" and list(proto.tensor.dims) == [2, 2]
    workspace.DeserializeBlob("x2", data)
    got = workspace.FetchBlob("x2")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, x)
    workspace.FeedBlob("s", b"abc")
    workspace.DeserializeBlob("s2", workspace.SerializeBlob("s"))
    assert workspace.FetchBlob("s2") == b"abc"


def test_stringify_and_registry_helpers() -> None:
    net = _scale_net("rt_str")
    assert workspace.StringifyProto("abc") == "abc"
    assert workspace.StringifyProto(net) == net.Proto().SerializeToString()
    assert workspace.StringifyProto(net.Proto()) == net.Proto().SerializeToString()
    with pytest.raises(ValueError):
        workspace.StringifyProto(3)
    assert "Copy" in workspace.RegisteredOperators()
    assert workspace.operator_tracebacks is ir_net.operator_tracebacks
    assert workspace.StringifyNetName(net) == net.Name()


def test_global_init_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    # --caffe2_omp_num_threads sets OMP_NUM_THREADS for processes started later: keep it
    # from leaking into other tests' subprocesses (their BLAS would sum in another order)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))
    monkeypatch.delenv("OMP_NUM_THREADS")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert workspace.GlobalInit(["prog", "--caffe2_log_level=0",
                                     "--caffe2_omp_num_threads=1"]) is True
    with pytest.warns(UserWarning, match="unknown flag"):
        workspace.GlobalInit(["prog", "--definitely_not_a_flag=3"])
    assert core.GlobalInit(["prog"]) is True


def test_device_queries_without_gpus() -> None:
    assert workspace.NumGpuDevices() == 0 and workspace.NumCudaDevices() == 0
    assert workspace.GpuDeviceType == caffe2_pb2.CUDA
    assert workspace.has_gpu_support is False and workspace.has_cuda_support is False
    assert workspace.has_hip_support is False
    pattern = workspace.GetGpuPeerAccessPattern()
    assert isinstance(pattern, np.ndarray) and pattern.size == 0
    assert workspace.GetCUDAVersion() == 0 and workspace.GetCuDNNVersion() == 0
    with pytest.raises(RuntimeError, match="no GPU"):
        workspace.GetDeviceProperties(0)


def test_workspace_class_direct_use() -> None:
    from dpgraph.runtime import Workspace

    assert workspace.Workspace is workspace.C.Workspace  # Caffe2's alias
    ws = Workspace("rt_direct", seed=3)
    ws.feed_blob("x", np.array([2.0], np.float32))
    ws.run_net_once(_scale_net("rt_direct_net"))
    np.testing.assert_array_equal(ws.fetch_blob("y"), [4.0])
    assert not workspace.HasBlob("y")  # the current workspace is untouched
    workspace.SwitchWorkspace(ws)
    assert workspace.CurrentWorkspace() == "rt_direct" and workspace.HasBlob("y")


def test_failed_input_checks_carry_caffe2s_enforce_prefix() -> None:
    net = core.Net("enforce_split")
    net.Split(net.AddExternalInput("a"), ["b", "c"], axis=0)
    workspace.FeedBlob("a", np.array([1, 2, 3], dtype=np.float32))
    with pytest.raises(RuntimeError, match=r"failed: \[enforce fail at Split\] ShapeError"):
        workspace.RunNetOnce(net)
