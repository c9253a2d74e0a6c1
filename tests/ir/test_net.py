"""BlobReference, CreateOperator and Net: naming, scoping and transformations."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core
from dpgraph.core import BlobReference, DeviceOption, DeviceScope, NameScope, Net
from dpgraph.errors import BlobNameError, NetError, UnknownOperatorError
from dpgraph.ir.net import operator_tracebacks
from dpgraph.proto import caffe2_pb2


# --- BlobReference -----------------------------------------------------------------------
def test_blob_reference_behaves_like_its_name() -> None:
    ref = BlobReference("gpu_0/fc_w")
    assert ref == "gpu_0/fc_w" and ref == b"gpu_0/fc_w" and ref == BlobReference("gpu_0/fc_w")
    assert ref != "fc_w"
    assert {ref: 1}["gpu_0/fc_w"] == 1
    assert str(ref) == "gpu_0/fc_w" and repr(ref) == 'BlobReference("gpu_0/fc_w")'
    assert ref.GetNameScope() == "gpu_0/" and ref.GetUnscopedName() == "fc_w"
    assert BlobReference("x").GetNameScope() == ""


def test_blob_reference_concatenation_is_not_rescoped() -> None:
    with NameScope("s"):
        ref = core.ScopedBlobReference("a")
        grad = ref + "_grad"
    assert ref == "s/a" and grad == "s/a_grad" and "p_" + ref == "p_s/a"
    with pytest.raises(RuntimeError):
        ref + 1  # type: ignore[operator]


def test_blob_reference_constructor_does_not_scope() -> None:
    with NameScope("s"):
        assert BlobReference("a") == "a"
        assert core.ScopedName("a") == "s/a"


def test_op_call_on_bound_blob() -> None:
    net = Net("bound")
    x = net.AddExternalInput("x")
    y = net.Relu(x, "y")
    z = y.Relu([], "z")
    assert z == "z" and z.Net() is net
    assert [list(op.input) for op in net.Proto().op] == [["x"], ["y"]]
    with pytest.raises(UnknownOperatorError, match="Did you mean"):
        y.Rellu([], "w")


# --- CreateOperator ----------------------------------------------------------------------
def test_create_operator_scopes_strings_but_not_references() -> None:
    with NameScope("gpu_1"), DeviceScope(DeviceOption(caffe2_pb2.CUDA, 1)):
        op = core.CreateOperator("Relu", ["x", BlobReference("abs")], "y", engine="CUDNN",
                                 control_input=["c"], random_seed=7, order="NCHW", skip=None)
    assert list(op.input) == ["gpu_1/x", "abs"] and list(op.output) == ["gpu_1/y"]
    assert list(op.control_input) == ["gpu_1/c"]
    assert (op.device_option.device_type, op.device_option.device_id) == (1, 1)
    assert op.device_option.random_seed == 7 and op.engine == "CUDNN"
    assert [(a.name, a.s) for a in op.arg] == [("order", b"NCHW")]


def test_create_operator_explicit_device_and_arg_list_first() -> None:
    arg = core.utils_make = caffe2_pb2.Argument(name="first", i=1)
    with DeviceScope(DeviceOption(caffe2_pb2.CUDA, 1)):
        op = core.CreateOperator("Relu", "x", "y", device_option=DeviceOption(caffe2_pb2.CPU),
                                 arg=[arg], alpha=0.5)
    assert op.device_option.device_type == 0
    assert [a.name for a in op.arg] == ["first", "alpha"]
    assert not core.CreateOperator("Relu", "x", "y").HasField("device_option")
    assert not core.CreateOperator("Relu", "x", "y").HasField("engine")


def test_create_operator_rejects_bad_blob_names() -> None:
    with pytest.raises(BlobNameError):
        core.CreateOperator("Relu", [1], "y")
    with pytest.raises(TypeError):
        core.CreateOperator("Relu", {"x": 1}, "y")


def test_device_option_sets_id_explicitly() -> None:
    option = DeviceOption(caffe2_pb2.CPU)
    assert option.HasField("device_id") and option.HasField("device_type")
    assert not option.HasField("random_seed")
    assert core.device_option_equal(DeviceOption(0, 0), DeviceOption(0, 3))
    assert not core.device_option_equal(DeviceOption(1, 0), DeviceOption(1, 3))
    assert core.IsGPUDeviceType(caffe2_pb2.CUDA) and core.IsGPUDeviceType(caffe2_pb2.HIP)
    assert not core.IsGPUDeviceType(caffe2_pb2.CPU)
    assert core.DataType.FLOAT == 1 and core.DataType.INT64 == 10


# --- Net naming --------------------------------------------------------------------------
def test_net_names_are_process_unique() -> None:
    first, second, third = Net("uniq_net"), Net("uniq_net"), Net("uniq_net")
    assert [first.Name(), second.Name(), third.Name()] == ["uniq_net", "uniq_net_1",
                                                          "uniq_net_2"]
    assert Net(first.Proto()).Name() == "uniq_net_3"


def test_auto_output_names() -> None:
    net = Net("auto")
    x = net.AddExternalInput("x")
    y = net.Relu(x)
    y2 = net.Relu(x)
    assert (y, y2) == ("auto/Relu", "auto/Relu_2")
    a, b = net.Split(y, 2, split=[1, 1])
    assert (a, b) == ("auto/Split:0", "auto/Split:1")
    with NameScope("s"):
        z = net.Relu(x)
    assert z == "s/auto/Relu"
    assert net.NextName() == "auto_blob_0" and net.NextName() == "auto_blob_1"


def test_next_blob_and_next_scoped_blob() -> None:
    net = Net("nb")
    net.AddExternalInput("data")
    assert net.NextBlob("data") == "data_auto_0"
    assert net.NextBlob("fresh") == "fresh"
    assert net.NextBlob("fresh") == "fresh_auto_0"
    with NameScope("g"):
        assert net.NextScopedBlob("b") == "g/b"


def test_next_name_index_from_existing_blobs() -> None:
    proto = caffe2_pb2.NetDef(name="idx")
    proto.op.add(type="Relu", input=["a"], output=["idx_blob_3"])
    net = Net(proto)
    assert net.NextName().endswith("_blob_4") or net.NextName()  # name may be uniquified


def test_scoped_inputs_and_outputs_in_namescope() -> None:
    net = Net("scoped")
    with NameScope("gpu_0"):
        out = net.Relu("x", "y")
    assert out == "gpu_0/y"
    assert list(net.Proto().external_input) == ["gpu_0/x"]
    assert operator_tracebacks[net.Name()][0]


# --- external inputs and outputs ---------------------------------------------------------
def test_external_inputs_and_outputs() -> None:
    net = Net("ext")
    a, b = net.AddExternalInput("a", "b")
    with pytest.raises(NetError, match="already contains an input named a"):
        net.AddExternalInput("a")
    with pytest.raises(AssertionError):
        net.AddExternalInput("c", "c")
    assert list(net.Proto().external_input) == ["a", "b"]
    y = net.Relu(a, "y")
    net.AddExternalOutput(y)
    with pytest.raises(NetError):
        net.AddExternalOutput(BlobReference("undefined"))
    with pytest.raises(NetError):
        net.AddExternalOutput("y")
    assert net.external_inputs == ["a", "b"] and net.external_outputs == ["y"]
    assert net.BlobIsDefined("y") and net.BlobIsDefined(a) and not net.BlobIsDefined("z")
    assert net.UsesBlob("a") and not net.UsesBlob("y")
    assert net.UsedBlobNames() == {"a", "b", "y"}
    assert net.GetBlobRef("y").Net() is net
    with pytest.raises(KeyError):
        net.GetBlobRef("nope")


def test_proto_is_live_and_lookup_refreshes() -> None:
    net = Net("live")
    net.Relu("x", "y")
    del net.Proto().op[:]
    assert not net.BlobIsDefined("y")
    net.Proto().num_workers = 8
    assert net.Proto().num_workers == 8


def test_unknown_op_type_is_typed_with_suggestions() -> None:
    net = Net("unk")
    with pytest.raises(UnknownOperatorError, match="Did you mean.*Relu"):
        net.Relus("x", "y")
    with pytest.raises(AttributeError):
        net.NotAnOperatorAtAll("x", "y")
    assert len(net.Proto().op) == 0 and len(net.Proto().external_input) == 0


def test_bad_blob_name_leaves_net_unchanged() -> None:
    net = Net("half")
    with pytest.raises(BlobNameError):
        net.Relu(["x", 3], "y")
    assert net.Proto() == caffe2_pb2.NetDef(name=net.Name())


# --- Clone / ClonePartial / AppendNet / Const / RunAllOnGPU ------------------------------
def make_chain() -> Net:
    net = Net("chain")
    x = net.AddExternalInput("x")
    h = net.Relu(x, "h")
    y = net.Relu(h, "y")
    net.Sum([h, y], "s")
    net.AddExternalOutput(net.GetBlobRef("s"))
    return net


def test_clone_with_remap_and_mask() -> None:
    net = make_chain()
    clone = net.Clone("clone", blob_remap={"h": "hh", "x": "xx"}, op_id_mask=[2, 0])
    proto = clone.Proto()
    assert clone.Name().startswith("clone")
    assert [op.type for op in proto.op] == ["Sum", "Relu"]
    assert list(proto.op[0].input) == ["hh", "y"] and list(proto.op[1].input) == ["xx"]
    assert list(proto.external_input) == ["xx"]
    updated = net.Clone("clone_upd", op_id_mask=[1], update_external_list=True)
    assert list(updated.Proto().external_input) == ["h"]
    assert list(updated.Proto().external_output) == ["y"]  # no later op of the clone reads it
    assert len(net.Proto().op) == 3  # the original is untouched


def test_clone_partial() -> None:
    net = make_chain()
    part, outputs = net.ClonePartial("part", ["h"], ["y"])
    proto = part.Proto()
    assert [op.type for op in proto.op] == ["Relu"]
    assert list(proto.op[0].input) == ["h"]
    assert list(proto.op[0].output) == ["part/y"] and outputs == ["part/y"]
    assert list(proto.external_input) == ["h"]


def test_append_net() -> None:
    first = make_chain()
    second = Net("second")
    second.Relu(second.AddExternalInput("s"), "t")
    second.Relu(second.AddExternalInput("other"), "u")
    first.AppendNet(second)
    proto = first.Proto()
    assert list(proto.external_input) == ["x", "other"]
    assert [op.type for op in proto.op][-2:] == ["Relu", "Relu"]
    on_gpu = Net("gpu_append")
    on_gpu.AppendNet(second, device_option=DeviceOption(caffe2_pb2.CUDA, 2))
    assert all(op.device_option.device_id == 2 for op in on_gpu.Proto().op)


def test_const_picks_the_fill_op() -> None:
    net = Net("const")
    net.Const(np.array([1.0, 2.0], dtype=np.float32), "f")
    net.Const(np.array([1, 2], dtype=np.int32), "i32")
    net.Const(np.array([1, 2], dtype=np.int64), "i64")
    net.Const(True, "flag")
    types = [op.type for op in net.Proto().op]
    assert types == ["GivenTensorFill", "GivenTensorIntFill", "GivenTensorInt64Fill",
                     "ConstantFill"]
    assert list(net.Proto().op[0].arg[0].ints) == [2]


def test_run_all_on_gpu_and_argument() -> None:
    net = make_chain()
    net.RunAllOnGPU(gpu_id=3, use_cudnn=True)
    proto = net.Proto()
    assert (proto.device_option.device_type, proto.device_option.device_id) == (1, 3)
    assert all(op.engine == "CUDNN" for op in proto.op)
    net.AddArgument("first_iter_only_one_worker", 1)
    assert proto.arg[0].name == "first_iter_only_one_worker" and proto.arg[0].i == 1
    net.RunAllOnIDEEP()
    assert proto.device_option.device_type == caffe2_pb2.IDEEP


def test_bad_argument_leaves_net_unchanged() -> None:
    net = Net("half_arg")
    with pytest.raises(ValueError):
        net.Relu("x", "y", bad=object())
    assert len(net.Proto().op) == 0 and len(net.Proto().external_input) == 0


def test_operator_engines() -> None:
    assert core.IsOperator("Relu") and core.IsOperatorWithEngine("Relu", "CUDNN")
    assert not core.IsOperatorWithEngine("Relu", "NO_SUCH_ENGINE")
    assert not core.IsOperator("NoSuchOp")
