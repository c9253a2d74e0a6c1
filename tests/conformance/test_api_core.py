"""Spec §3 (module level, BlobReference, _RectifyInputOutput, CreateOperator, MakeArgument)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from dpgraph import core, scope, utils
from dpgraph.proto import caffe2_pb2


# --- module level ---------------------------------------------------------------------------
def test_datatype_class() -> None:
    assert core.DataType.FLOAT == 1
    assert core.DataType.INT64 == 10
    assert core.DataType.BOOL == 5
    assert core.DataType.INT32 == 2
    assert core.DataType.FLOAT16 == 12


def test_is_operator() -> None:
    assert core.IsOperator("Relu")
    assert core.IsOperatorWithEngine("Relu", "DEFAULT")
    assert not core.IsOperator("NoSuchOpXyz")
    assert core.RefreshRegisteredOperators() is None
    assert "Relu" in core.RegisteredOperators()
    assert core.GlobalInit(["python"]) in (None, True)


def test_is_gpu_device_type() -> None:
    assert core.IsGPUDeviceType(caffe2_pb2.CUDA)
    assert core.IsGPUDeviceType(caffe2_pb2.HIP)
    assert not core.IsGPUDeviceType(caffe2_pb2.CPU)
    assert not core.IsGPUDeviceType(caffe2_pb2.IDEEP)


def test_device_option_signature_and_presence() -> None:
    params = list(inspect.signature(core.DeviceOption).parameters)
    assert params == ["device_type", "device_id", "random_seed", "node_name", "numa_node_id",
                      "extra_info"]
    option = core.DeviceOption(caffe2_pb2.CPU)
    assert option.HasField("device_type") and option.HasField("device_id")
    assert not option.HasField("random_seed") and not option.HasField("node_name")
    assert not option.HasField("numa_node_id")
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 3, random_seed=7, node_name="n",
                            extra_info=["k:v"])
    assert (gpu.device_type, gpu.device_id, gpu.random_seed, gpu.node_name) == (1, 3, 7, "n")
    assert list(gpu.extra_info) == ["k:v"]
    assert core.DeviceOption(caffe2_pb2.CPU, numa_node_id=1).numa_node_id == 1
    with pytest.raises(AssertionError):
        core.DeviceOption(caffe2_pb2.CUDA, 0, numa_node_id=1)


def test_device_option_equal() -> None:
    eq = core.device_option_equal
    assert eq(None, None)
    assert not eq(None, core.DeviceOption(caffe2_pb2.CUDA, 0))
    assert eq(core.DeviceOption(caffe2_pb2.CPU, 0), core.DeviceOption(caffe2_pb2.CPU, 5))
    assert not eq(core.DeviceOption(caffe2_pb2.CPU, 0), core.DeviceOption(caffe2_pb2.CUDA, 0))
    assert eq(core.DeviceOption(caffe2_pb2.CUDA, 1), core.DeviceOption(caffe2_pb2.CUDA, 1))
    assert not eq(core.DeviceOption(caffe2_pb2.CUDA, 1), core.DeviceOption(caffe2_pb2.CUDA, 2))
    a = core.DeviceOption(caffe2_pb2.CUDA, 1, node_name="a")
    b = core.DeviceOption(caffe2_pb2.CUDA, 1, node_name="b")
    assert eq(a, b)
    assert not eq(a, b, ignore_node_name=False)
    assert not eq(core.DeviceOption(caffe2_pb2.CUDA, 1, random_seed=1),
                  core.DeviceOption(caffe2_pb2.CUDA, 1, random_seed=2),
                  ignore_random_seed=False)


def test_device_equal_and_infer_blob_devices() -> None:
    assert core.device_equal(core.DeviceOption(1, 2), core.DeviceOption(1, 2))
    assert not core.device_equal(core.DeviceOption(0, 0), core.DeviceOption(0, 1))
    net = core.Net("infer_dev")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        net.Relu("x", "y")
    devices = core.InferBlobDevices(net)
    assert devices["y"] == core.DeviceOption(caffe2_pb2.CUDA, 1)


def test_gradient_slice_namedtuple() -> None:
    g = core.GradientSlice("i", "v")
    assert g._fields == ("indices", "values")
    assert (g.indices, g.values) == ("i", "v")
    assert isinstance(g, tuple)


def test_scoped_name_and_reference() -> None:
    with scope.NameScope("s"):
        assert core.ScopedName("x") == "s/x"
        assert core.ScopedName(b"x") == "s/x"
        ref = core.ScopedBlobReference("y")
        assert str(ref) == "s/y" and isinstance(ref, core.BlobReference)
    assert core.ScopedName("x") == "x"


# --- BlobReference --------------------------------------------------------------------------
def test_blob_reference_basics() -> None:
    with scope.NameScope("ns"):
        ref = core.BlobReference("a/b")
    assert str(ref) == "a/b"  # constructor does not add the scope
    assert repr(ref) == 'BlobReference("a/b")'
    assert ref.Net() is None and ref.meta == {}
    assert str(core.BlobReference(b"bytes")) == "bytes"
    assert str(core.BlobReference(5)) == "5"
    net = core.Net("blobref_net")
    assert core.BlobReference("x", net).Net() is net


def test_blob_reference_hash_and_equality() -> None:
    ref = core.BlobReference("w")
    assert ref == "w" and ref == b"w" and ref == core.BlobReference("w")
    assert ref != "v" and not (ref != "w")
    assert hash(ref) == hash("w")
    assert {"w": 1}[ref] == 1
    assert {ref: 2}["w"] == 2


def test_blob_reference_add() -> None:
    net = core.Net("add_net")
    ref = core.BlobReference("gpu_0/fc_w", net)
    with scope.NameScope("other"):
        grad = ref + "_grad"
        pre = "p_" + ref
    assert isinstance(grad, core.BlobReference) and str(grad) == "gpu_0/fc_w_grad"
    assert grad.Net() is net
    assert str(pre) == "p_gpu_0/fc_w"
    with pytest.raises(RuntimeError):
        ref + 1  # noqa: B018
    with pytest.raises(RuntimeError):
        1 + ref  # noqa: B018


def test_blob_reference_scope_parts() -> None:
    assert core.BlobReference("a/b/c").GetNameScope() == "a/b/"
    assert core.BlobReference("c").GetNameScope() == ""
    assert core.BlobReference("a/b/c").GetUnscopedName() == "c"
    assert core.BlobReference("c").GetUnscopedName() == "c"


def test_blob_reference_op_call() -> None:
    net = core.Net("ref_call")
    x = net.AddExternalInput("x")
    x = core.BlobReference("x", net)
    y = x.Relu([], "y")
    assert str(y) == "y" and y.Net() is net
    assert list(net.Proto().op[0].input) == ["x"]
    z = y.Add("x", "z")
    assert list(net.Proto().op[1].input) == ["y", "x"]
    assert str(z) == "z"
    with pytest.raises(AttributeError):
        _ = x.__array__
    with pytest.raises(AttributeError):
        _ = x.NotARealOperatorXyz
    with pytest.raises(AttributeError):  # [late]: unbound reference -> AttributeError
        _ = core.BlobReference("free").Relu


def test_blob_reference_unknown_op_did_you_mean() -> None:
    x = core.BlobReference("x", core.Net("dym"))
    with pytest.raises(AttributeError, match="Did you mean"):
        _ = x.Rel


# --- _RectifyInputOutput --------------------------------------------------------------------
def test_rectify_input_output() -> None:
    ref = core.BlobReference("r")
    with scope.NameScope("s"):
        assert [str(b) for b in core._RectifyInputOutput("x")] == ["s/x"]
        assert [str(b) for b in core._RectifyInputOutput(b"x")] == ["s/x"]
        assert core._RectifyInputOutput(ref)[0] is ref
        out = core._RectifyInputOutput(["a", ref, b"c"])
        assert [str(b) for b in out] == ["s/a", "r", "s/c"]
        assert [str(b) for b in core._RectifyInputOutput(("a",))] == ["s/a"]
    with pytest.raises(TypeError):
        core._RectifyInputOutput(3)
    with pytest.raises(TypeError):
        core._RectifyInputOutput(["a", 3])


# --- CreateOperator -------------------------------------------------------------------------
def test_create_operator_signature() -> None:
    params = list(inspect.signature(core.CreateOperator).parameters)
    assert params[:9] == ["operator_type", "inputs", "outputs", "name", "control_input",
                          "device_option", "arg", "engine", "debug_info"]
    sig = inspect.signature(core.CreateOperator)
    assert sig.parameters["name"].default == ""
    for p in ("control_input", "device_option", "arg", "engine", "debug_info"):
        assert sig.parameters[p].default is None


def test_create_operator_fields() -> None:
    with scope.NameScope("s"):
        op = core.CreateOperator("Relu", "x", core.BlobReference("y"), name="r",
                                 control_input=["c"])
    assert isinstance(op, caffe2_pb2.OperatorDef)
    assert op.type == "Relu" and op.name == "r"
    assert list(op.input) == ["s/x"] and list(op.output) == ["y"]
    assert list(op.control_input) == ["s/c"]
    assert not op.HasField("device_option")
    assert not op.HasField("engine")
    assert not op.HasField("is_gradient_op")


def test_create_operator_device() -> None:
    explicit = core.DeviceOption(caffe2_pb2.CUDA, 2)
    with scope.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        assert core.CreateOperator("Relu", "x", "y").device_option.device_id == 1
        op = core.CreateOperator("Relu", "x", "y", device_option=explicit)
        assert op.device_option == explicit
    op = core.CreateOperator("Relu", "x", "y", engine="CUDNN")
    assert op.engine == "CUDNN"


def test_create_operator_random_seed_and_args() -> None:
    extra = utils.MakeArgument("first", 1)
    op = core.CreateOperator("ConstantFill", [], "y", arg=[extra], random_seed=5,
                             shape=[2], value=1.5, skipped=None, dtype=1)
    assert op.device_option.random_seed == 5
    assert [a.name for a in op.arg] == ["first", "shape", "value", "dtype"]
    assert list(op.arg[1].ints) == [2]
    assert op.arg[2].f == 1.5


def test_create_operator_debug_info(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not core.CreateOperator("Relu", "x", "y").debug_info
    monkeypatch.setenv("CAFFE2_DEBUG", "1")
    assert core.CreateOperator("Relu", "x", "y").debug_info


# --- MakeArgument ---------------------------------------------------------------------------
def test_make_argument_scalars() -> None:
    ma = utils.MakeArgument
    assert ma("a", 1.5).f == 1.5 and ma("a", 1.5).HasField("f")
    assert ma("a", 3).i == 3
    assert ma("a", True).i == 1 and not ma("a", True).HasField("f")
    assert ma("a", b"x").s == b"x"
    assert ma("a", "é").s == "é".encode()
    assert ma("a", np.float32(2.0)).f == 2.0
    assert ma("a", np.int64(4)).i == 4
    net = caffe2_pb2.NetDef(name="n")
    assert ma("a", net).n == net
    dev = core.DeviceOption(1, 1)
    assert ma("a", dev).s == dev.SerializeToString()
    assert ma("a", 1.5).name == "a"


def test_make_argument_lists() -> None:
    ma = utils.MakeArgument
    assert list(ma("a", [1.0, 2.0]).floats) == [1.0, 2.0]
    assert list(ma("a", [1, 2]).ints) == [1, 2]
    assert list(ma("a", [True, False]).ints) == [1, 0]
    assert list(ma("a", ["x", b"y"]).strings) == [b"x", b"y"]
    nets = [caffe2_pb2.NetDef(name="a"), caffe2_pb2.NetDef(name="b")]
    assert [n.name for n in ma("a", nets).nets] == ["a", "b"]
    devs = [core.DeviceOption(1, 0)]
    assert list(ma("a", devs).strings) == [devs[0].SerializeToString()]
    empty = ma("a", [])
    assert empty.name == "a" and len(empty.ListFields()) == 1  # only the name is set
    assert list(ma("a", np.array([1, 2], dtype=np.float32)).floats) == [1.0, 2.0]
    assert list(ma("a", np.array([[1, 2]], dtype=np.int64)).ints) == [1, 2]
    assert list(ma("a", np.array([1.0], dtype=np.float64)).floats) == [1.0]
    with pytest.raises(ValueError):
        ma("a", object())
    with pytest.raises(ValueError):
        ma("a", [1, "x"])
