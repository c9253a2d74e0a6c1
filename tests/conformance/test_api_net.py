"""Spec §3: ``core.Net`` (naming, lookups, auto names, op creation, externals, Clone, ...)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpgraph import core, scope, workspace
from dpgraph.proto import caffe2_pb2

_ids = itertools.count()


def _uniq(base: str) -> str:
    return f"{base}_c{next(_ids)}x"


# --- naming ---------------------------------------------------------------------------------
def test_net_name_uniqueness() -> None:
    base = _uniq("conf_net")
    names = [core.Net(base).Name() for _ in range(3)]
    assert names == [base, base + "_1", base + "_2"]
    proto = caffe2_pb2.NetDef(name=base)
    assert core.Net(proto).Name() == base + "_3"
    assert str(core.Net(_uniq("s"))).startswith("s_c")


def test_net_from_proto_copies_or_takes() -> None:
    proto = caffe2_pb2.NetDef(name=_uniq("p"))
    proto.op.add(type="Relu", input=["x"], output=["y"])
    net = core.Net(proto)
    assert net.Proto() is not proto and net.Proto().op[0].type == "Relu"
    taken = core.Net(proto, inplace=True)
    assert taken.Proto() is proto


def test_next_name_index_quirk() -> None:
    name = _uniq("qq")
    proto = caffe2_pb2.NetDef(name=name)
    proto.op.add(type="Relu", input=[name + "_blob_3"], output=[name + "_blob_12"])
    net = core.Net(proto)
    # only the first digit is parsed: max(3, 1) + 1 = 4
    assert net.NextName() == name + "_blob_4"
    assert net.NextName() == name + "_blob_5"
    assert core.Net(_uniq("fresh")).NextName().endswith("_blob_0")


def test_proto_is_live() -> None:
    net = core.Net(_uniq("live"))
    net.Proto().op.add(type="Relu", input=["a"], output=["b"])
    assert net.BlobIsDefined("b")
    net.Proto().external_input.append("ext")
    assert net.BlobIsDefined("ext") and net.is_external_input("ext")


# --- blob queries ---------------------------------------------------------------------------
def test_blob_queries() -> None:
    net = core.Net(_uniq("q"))
    net.AddExternalInput("x")
    net.Relu("x", "y")
    assert net.BlobIsDefined("y") and net.BlobIsDefined(core.BlobReference("x"))
    assert not net.BlobIsDefined("z")
    assert net.UsesBlob("x") and not net.UsesBlob("y")
    assert set(net.UsedBlobNames()) == {"x", "y"}
    ref = net.GetBlobRef("y")
    assert ref == "y" and ref.Net() is net
    with pytest.raises(KeyError):
        net.GetBlobRef("nope")


# --- auto names -----------------------------------------------------------------------------
def test_next_name_with_prefix() -> None:
    name = _uniq("nn")
    net = core.Net(name)
    assert net.NextName("fc") == f"{name}/fc"
    assert net.NextName("fc", output_id=1) == f"{name}/fc:1"
    net.Relu([], f"{name}/fc")
    assert net.NextName("fc") == f"{name}/fc_2"
    with scope.NameScope("s"):
        assert net.NextName("fc") == f"{name}/fc"  # the scoped version is not defined
        net.Relu([], f"{name}/fc")
        assert net.NextName("fc") == f"{name}/fc_2"


def test_next_blob() -> None:
    net = core.Net(_uniq("nb"))
    a = net.NextBlob("tmp")
    assert isinstance(a, core.BlobReference) and a == "tmp"
    assert net.NextBlob("tmp") == "tmp_auto_0"
    assert net.NextBlob("tmp") == "tmp_auto_1"
    net.Relu([], "used")
    assert net.NextBlob("used") == "used_auto_0"
    assert net.NextBlob() == "unnamed"
    with scope.NameScope("g"):
        assert net.NextScopedBlob("w") == "g/w"
        assert net.NextScopedBlob("w") == "g/w_auto_0"


# --- op creation ----------------------------------------------------------------------------
def test_op_creation_outputs_and_return() -> None:
    name = _uniq("ops")
    net = core.Net(name)
    y = net.Relu("x", None)
    assert isinstance(y, core.BlobReference) and str(y) == f"{name}/Relu" and y.Net() is net
    outs = net.Split(y, 2, axis=0)
    assert isinstance(outs, tuple) and [str(o) for o in outs] == [f"{name}/Split:0",
                                                                  f"{name}/Split:1"]
    with scope.NameScope("gpu_0"):
        z = net.Relu("a")
        assert str(z) == f"gpu_0/{name}/Relu"
        w = net.Relu("a", "b")
        assert str(w) == "gpu_0/b"
        assert list(net.Proto().op[-1].input) == ["gpu_0/a"]
    assert net.Print("x", []) is None
    assert net.Proto().external_input[:2] == ["x", "gpu_0/a"]
    assert "x" in net.Proto().external_input and "gpu_0/a" in net.Proto().external_input


def test_op_creation_kwargs() -> None:
    net = core.Net(_uniq("kw"))
    dev = core.DeviceOption(caffe2_pb2.CUDA, 1)
    net.Conv(["x", "w", "b"], "y", kernel=3, engine="CUDNN", device_option=dev, name="c",
             control_input=["ctrl"])
    op = net.Proto().op[0]
    assert op.engine == "CUDNN" and op.device_option == dev and op.name == "c"
    assert list(op.control_input) == ["ctrl"]
    assert [a.name for a in op.arg] == ["kernel"]


def test_op_creation_records_traceback() -> None:
    net = core.Net(_uniq("tb"))
    net.Relu("x", "y")
    net.Relu("y", "z")
    assert set(workspace.operator_tracebacks[net.Name()]) == {0, 1}


def test_op_creation_errors() -> None:
    net = core.Net(_uniq("err"))
    with pytest.raises(AttributeError):
        net.__array_interface__  # noqa: B018
    with pytest.raises(AttributeError, match="Did you mean"):
        net.Relux("x", "y")
    assert not hasattr(net, "NoSuchOperatorXyz")
    with pytest.raises(TypeError):
        net.Relu(3, "y")
    with pytest.raises(TypeError):
        net.Relu("x", [None])
    assert len(net.Proto().op) == 0


def test_input_claiming_this_net_but_undefined() -> None:
    net = core.Net(_uniq("claim"))
    ghost = core.BlobReference("ghost", net)
    with pytest.raises(AssertionError):
        net.Relu(ghost, "y")


# --- externals ------------------------------------------------------------------------------
def test_add_external_input() -> None:
    net = core.Net(_uniq("ext"))
    one = net.AddExternalInput("a")
    assert isinstance(one, core.BlobReference) and one == "a"
    assert one.Net() is None  # Caffe2's long-standing _get_blob_ref behaviour
    many = net.AddExternalInputs("b", core.BlobReference("c", net))
    assert isinstance(many, list) and many == ["b", "c"]
    assert all(r.Net() is None for r in many)
    assert list(net.Proto().external_input) == ["a", "b", "c"]
    with pytest.raises(AssertionError, match="Net already contains an input named a"):
        net.AddExternalInput("a")
    with pytest.raises(AssertionError):
        net.AddExternalInput("d", "d")
    with pytest.raises(AssertionError):
        net.AddExternalInput()
    assert list(net.Proto().external_input) == ["a", "b", "c"]
    with scope.NameScope("s"):
        scoped = net.AddScopedExternalInputs("e")
    assert scoped == ["s/e"]
    assert [str(b) for b in net.external_inputs] == ["a", "b", "c", "s/e"]


def test_add_external_output() -> None:
    net = core.Net(_uniq("eo"))
    y = net.Relu("x", "y")
    net.AddExternalOutput(y)
    assert list(net.Proto().external_output) == ["y"]
    with pytest.raises(AssertionError):
        net.AddExternalOutput("y")  # must be a BlobReference
    with pytest.raises(AssertionError):
        net.AddExternalOutput(core.BlobReference("undefined"))
    assert [str(b) for b in net.external_outputs] == ["y"]
    assert all(isinstance(b, core.BlobReference) for b in net.external_outputs)
    assert core.Net.AddExternalOutputs is not None


# --- whole-net transformations --------------------------------------------------------------
def test_clone() -> None:
    net = core.Net(_uniq("orig"))
    net.AddExternalInput("x")
    net.Relu("x", "y")
    net.Sigmoid("y", "z")
    net.AddExternalOutput(net.GetBlobRef("z"))
    net.add_attribute("k", 1)
    name = _uniq("cl")
    clone = net.Clone(name, blob_remap={"y": "yy", core.BlobReference("z"): "zz"})
    assert clone.Name() == name
    assert [list(op.output) for op in clone.Proto().op] == [["yy"], ["zz"]]
    assert list(clone.Proto().op[1].input) == ["yy"]
    assert list(clone.Proto().external_output) == ["zz"]
    assert clone.get_attributes("k") == [1]
    seen: list[str] = []
    net.Clone(_uniq("rf"), remap_funcs={"Relu": lambda op, prefix, remap: seen.append(prefix)})
    assert len(seen) == 1 and seen[0].startswith("rf_c") and seen[0].endswith("/")
    masked = net.Clone(_uniq("m"), op_id_mask=[1, 0])
    assert [op.type for op in masked.Proto().op] == ["Sigmoid", "Relu"]
    again = net.Clone(name)
    assert again.Name() == name + "_1"  # uniquified
    partial = net.Clone(_uniq("p"), op_id_mask=[1], update_external_list=True)
    assert list(partial.Proto().external_input) == ["y"]
    assert len(net.Proto().op) == 2  # original untouched


def test_clone_partial() -> None:
    net = core.Net(_uniq("cp"))
    net.AddExternalInput("x")
    net.Relu("x", "h")
    net.Sigmoid("h", "out")
    net.Tanh("x", "other")
    name = _uniq("part")
    sub, outs = net.ClonePartial(name, ["x"], ["out"])
    assert [op.type for op in sub.Proto().op] == ["Relu", "Sigmoid"]
    assert list(sub.Proto().op[0].output) == [f"{name}/h"]
    assert [str(o) for o in outs] == [f"{name}/out"]
    assert list(sub.Proto().external_input) == ["x"]
    assert list(sub.Proto().external_output) == [f"{name}/out"]
    # a blob the path reads without producing it keeps its name and becomes an input
    net.Mul(["out", "other"], "prod")
    sub2, _ = net.ClonePartial(_uniq("part2"), ["h"], ["prod"])
    assert [op.type for op in sub2.Proto().op] == ["Sigmoid", "Tanh", "Mul"]
    assert list(sub2.Proto().external_input) == ["h", "x"]
    assert list(sub2.Proto().op[0].input) == ["h"] and list(sub2.Proto().op[1].input) == ["x"]
    with pytest.raises(AssertionError, match="partially clone"):
        net.ClonePartial(_uniq("bad"), ["out"], ["h"])


def test_append_net() -> None:
    a = core.Net(_uniq("a"))
    a.AddExternalInput("x")
    a.Relu("x", "y")
    b = core.Net(_uniq("b"))
    b.AddExternalInput("y", "w")
    b.Mul(["y", "w"], "z")
    b.AddExternalOutput(b.GetBlobRef("z"))
    assert a.AppendNet(b) is a
    assert list(a.Proto().external_input) == ["x", "w"]
    assert list(a.Proto().external_output) == ["z"]
    assert [op.type for op in a.Proto().op] == ["Relu", "Mul"]
    c = core.Net(_uniq("c"))
    c.AppendNet(b, device_option=core.DeviceOption(caffe2_pb2.CUDA, 1))
    assert c.Proto().op[0].device_option.device_id == 1
    assert not b.Proto().op[0].HasField("device_option")


def test_add_argument() -> None:
    net = core.Net(_uniq("arg"))
    net.AddArgument("k", 3)
    assert net.Proto().arg[0].name == "k" and net.Proto().arg[0].i == 3


def test_const() -> None:
    net = core.Net(_uniq("const"))
    cases = [
        (np.array([1.0, 2.0], dtype=np.float32), "GivenTensorFill"),
        (np.array([[1, 2]], dtype=np.int32), "GivenTensorIntFill"),
        (np.array([1, 2], dtype=np.int64), "GivenTensorInt64Fill"),
        (np.array([True]), "GivenTensorBoolFill"),
        (np.array(["a", "b"]), "GivenTensorStringFill"),
    ]
    for array, op_type in cases:
        out = net.Const(array)
        op = net.Proto().op[-1]
        assert op.type == op_type and isinstance(out, core.BlobReference)
        assert str(out).startswith(f"{net.Name()}/{op_type}")
        args = {a.name: a for a in op.arg}
        assert list(args["shape"].ints) == list(array.shape)
    out = net.Const(True, blob_out="flag")
    op = net.Proto().op[-1]
    assert op.type == "ConstantFill" and str(out) == "flag"
    args = {a.name: a for a in op.arg}
    assert args["dtype"].i == caffe2_pb2.TensorProto.BOOL and args["value"].i == 1
    workspace.ResetWorkspace()
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob(net.Proto().op[1].output[0]), [[1, 2]])
    workspace.ResetWorkspace()


def test_run_all_on_gpu_and_mkl() -> None:
    net = core.Net(_uniq("gpu"))
    net.Relu("x", "y")
    net.RunAllOnGPU(gpu_id=2, use_cudnn=True)
    assert net.Proto().device_option.device_type == caffe2_pb2.CUDA
    assert net.Proto().device_option.device_id == 2
    assert net.Proto().op[0].engine == "CUDNN"
    plain = core.Net(_uniq("gpu2"))
    plain.Relu("x", "y")
    plain.RunAllOnGPU()
    assert plain.Proto().op[0].engine == ""
    plain.RunAllOnMKL()
    assert plain.Proto().device_option.device_type == caffe2_pb2.MKLDNN


def test_deduplicate_gradient_slices() -> None:
    net = core.Net(_uniq("dedup"))
    g = core.GradientSlice(core.BlobReference("idx"), core.BlobReference("val"))
    out = net.DeduplicateGradientSlices(g)
    assert isinstance(out, core.GradientSlice)
    assert [op.type for op in net.Proto().op] == ["Unique", "UnsortedSegmentSum"]
    net.DeduplicateGradientSlices(g, aggregator="mean")
    assert net.Proto().op[-1].type == "UnsortedSegmentMean"
    workspace.ResetWorkspace()
    workspace.FeedBlob("idx", np.array([1, 0, 1], dtype=np.int64))
    workspace.FeedBlob("val", np.array([[1.0], [2.0], [3.0]], dtype=np.float32))
    workspace.RunNetOnce(net)
    # Caffe2's CPU Unique sorts: unique = [0, 1]
    np.testing.assert_array_equal(workspace.FetchBlob(out.indices), [0, 1])
    np.testing.assert_array_equal(workspace.FetchBlob(out.values), [[2.0], [4.0]])
    workspace.ResetWorkspace()


# --- module functions -----------------------------------------------------------------------
def test_ssa_helpers() -> None:
    net = core.Net(_uniq("ssa"))
    net.Relu("x", "y")
    net.Relu("y", "y")
    net.Relu("q", "z")
    ssa, versions = core.get_ssa(net.Proto())
    assert ssa[1] == ([("y", 1)], [("y", 2)])
    assert versions == {"x": 0, "y": 2, "q": 0, "z": 1}  # external inputs at version 0
    assert core.get_undefined_blobs(ssa) == {"x", "q"}
    assert core.get_output_producers(ssa)[("y", 2)] == 1
    assert core.get_op_ids_in_path(ssa, versions, ["x"], ["y"]) == [0, 1]
    assert core.get_op_ids_in_path(ssa, versions, [], ["z"]) == [2]
    seeded, _ = core.get_ssa(net.Proto(), {"x": 3})
    assert seeded[0] == ([("x", 3)], [("y", 1)])


def test_output_to_list() -> None:
    assert core.output_to_list(None) == []
    assert core.output_to_list("a") == ["a"]
    assert core.output_to_list(("a", "b")) == ["a", "b"]


def test_clone_and_bind_net() -> None:
    net = core.Net(_uniq("bind"))
    net.Relu("x", "h")
    net.Relu("h", "y")
    cloned, remap = core.clone_and_bind_net(net, _uniq("bound"), "p/")
    assert remap == {"x": "x", "h": "p/h", "y": "p/y"}
    assert [list(op.output) for op in cloned.Proto().op] == [["p/h"], ["p/y"]]


def test_execution_step_defaults() -> None:
    net = core.Net(_uniq("step"))
    step = core.execution_step("s", [net])
    assert step.Proto().num_iter == 1
    stop = core.execution_step("s2", [net], should_stop_blob="stop")
    assert not stop.Proto().HasField("num_iter")
    assert stop.Proto().should_stop_blob == "stop"
    plan = core.Plan("plan")
    plan.AddStep(step)
    assert isinstance(plan.Proto(), caffe2_pb2.PlanDef)


def test_execution_step_kwargs() -> None:
    net = core.Net(_uniq("stepkw"))
    report = core.Net(_uniq("report"))
    step = core.execution_step(
        "s", [net], num_iter=3, report_net=report, report_interval=5,
        concurrent_substeps=True, only_once=True, num_concurrent_instances=2,
        create_workspace=True, run_every_ms=7)
    proto = step.Proto()
    assert (proto.name, proto.num_iter, proto.report_net, proto.report_interval) == (
        "s", 3, report.Name(), 5)
    assert proto.only_once and proto.create_workspace
    assert proto.num_concurrent_instances == 2 and proto.run_every_ms == 7
    assert list(proto.network) == [net.Name()]


def test_set_rand_seed() -> None:
    net = core.Net(_uniq("seed"))
    net.Relu("a", "b")
    net.Relu("b", "c")
    net.set_rand_seed(seed=10)
    assert [op.device_option.random_seed for op in net.Proto().op] == [10, 11]
    net.set_rand_seed(seed=3, sequence_seed=False)
    assert [op.device_option.random_seed for op in net.Proto().op] == [3, 3]


def test_log_info_and_records() -> None:
    net = core.Net(_uniq("log"))
    net.LogInfo("hello", core.BlobReference("x"))
    assert [op.type for op in net.Proto().op] == ["GivenTensorStringFill", "Print", "Print"]
    assert list(net.Proto().op[2].input) == ["x"]
    assert net.input_record() is None and net.output_record() is None
