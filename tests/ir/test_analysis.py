"""SSA analyses, the verifier, the text format and cross-device copy injection."""

from __future__ import annotations

import pytest

from dpgraph import core
from dpgraph.core import DeviceOption, Net
from dpgraph.errors import TextFormatError, VerificationError
from dpgraph.ir import format_net, parse_net, verify, verify_problems
from dpgraph.ir.analysis import consumers, external_inputs_of, ops_in_path, producers
from dpgraph.proto import caffe2_pb2


def net_of(*ops: tuple[str, list[str], list[str]], inputs: tuple[str, ...] = ()
           ) -> caffe2_pb2.NetDef:
    proto = caffe2_pb2.NetDef(name="t")
    proto.external_input.extend(inputs)
    for op_type, ins, outs in ops:
        proto.op.add(type=op_type, input=ins, output=outs)
    return proto


def test_get_ssa_versions_and_producers() -> None:
    proto = net_of(("Relu", ["x"], ["x"]), ("Relu", ["x"], ["y"]), ("Sum", ["x", "y"], ["x"]))
    ssa, versions = core.get_ssa(proto)
    assert ssa[0] == ([("x", 0)], [("x", 1)])
    assert ssa[1] == ([("x", 1)], [("y", 1)])
    assert ssa[2] == ([("x", 1), ("y", 1)], [("x", 2)])
    assert versions == {"x": 2, "y": 1}
    assert core.get_undefined_blobs(ssa) == {"x"}
    assert core.get_output_producers(ssa)[("x", 2)] == 2
    assert producers(proto) == {"x": [0, 2], "y": [1]}
    assert consumers(proto) == {"x": [0, 1, 2], "y": [2]}
    assert external_inputs_of(proto.op) == ["x"]


def test_ops_in_path() -> None:
    proto = net_of(("Relu", ["a"], ["b"]), ("Relu", ["z"], ["q"]), ("Relu", ["b"], ["c"]))
    assert ops_in_path(proto.op, ["a"], ["c"]) == [0, 2]
    assert ops_in_path(proto.op, ["b"], ["c"]) == [2]


def test_infer_blob_devices_uses_net_default() -> None:
    proto = net_of(("Relu", ["a"], ["b"]), ("Relu", ["b"], ["c"]))
    proto.op[1].device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, 2))
    proto.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, 1))
    devices = core.InferBlobDevices(proto)
    assert devices["b"].device_id == 1 and devices["c"].device_id == 2


# --- verifier ----------------------------------------------------------------------------
def test_verifier_accepts_a_good_net() -> None:
    verify(net_of(("Relu", ["x"], ["y"]), inputs=("x",)))


def test_verifier_reports_every_problem() -> None:
    proto = net_of(("Relu", ["x"], ["y"]), ("Relu", ["missing"], ["z"]),
                   ("Relu", ["x", "y"], ["w"]), ("NoSuchOp", [], ["q"]), inputs=("x",))
    proto.external_output.append("never")
    with pytest.raises(VerificationError) as info:
        verify(proto)
    problems = info.value.problems
    assert any("op 1 (Relu)" in p and "'missing'" in p for p in problems)
    assert any("op 2 (Relu)" in p and "inputs" in p for p in problems)
    assert any("op 3" in p and "NoSuchOp" in p for p in problems)
    assert any("'never'" in p for p in problems)
    assert isinstance(info.value, AssertionError)


def test_verifier_device_namespaces() -> None:
    proto = net_of(("Relu", ["gpu_1/x"], ["gpu_0/y"]), ("Copy", ["gpu_0/y"], ["gpu_1/y"]))
    for op in proto.op:
        op.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, 0))
    problems = verify_problems(proto)
    assert len(problems) == 1
    assert "op 0 (Relu) on gpu_0" in problems[0] and "'gpu_1/x'" in problems[0]


def test_verifier_known_blobs() -> None:
    proto = net_of(("Relu", ["w"], ["y"]), inputs=("x",))
    assert verify_problems(proto)
    assert not verify_problems(proto, known_blobs=["w"])


# --- text format -------------------------------------------------------------------------
def test_text_round_trip_of_a_built_net() -> None:
    net = Net("text_net")
    with core.NameScope("gpu_0"), core.DeviceScope(DeviceOption(caffe2_pb2.CUDA, 0)):
        x = net.AddExternalInput(core.ScopedBlobReference("x"))
        y = net.Relu(x, "y", engine="CUDNN", control_input=["x"])
        net.Sum([x, y], "my blob", name="dpm", alpha=[0.5, 1.0], order="NCHW")
    net.Proto().type = "dag"
    net.Proto().num_workers = 8
    net.AddArgument("first_iter_only_one_worker", 1)
    text = format_net(net)
    assert 'op Relu gpu_0/x -> gpu_0/y {' in text and '"gpu_0/my blob"' in text
    assert parse_net(text) == net.Proto()


def test_text_rejects_garbage() -> None:
    with pytest.raises(TextFormatError, match="line 2"):
        parse_net('net "x"\nbogus line\n')
    with pytest.raises(TextFormatError):
        parse_net("op Relu x y\n")
    with pytest.raises(ValueError):
        parse_net('op Relu x -> y {"device": "tpu:0"}\n')


# --- InjectCrossDeviceCopies -------------------------------------------------------------
def test_inject_cross_device_copies() -> None:
    proto = net_of(("Relu", ["x"], ["y"]), ("Relu", ["y"], ["z"]), ("Relu", ["y"], ["w"]))
    proto.op[0].device_option.CopyFrom(DeviceOption(caffe2_pb2.CPU))
    for op in proto.op[1:]:
        op.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, 1))
    new_net, devices = core.InjectCrossDeviceCopies(proto)
    new = new_net.Proto()
    assert [op.type for op in new.op] == ["Relu", "CopyCPUToGPU", "Relu", "Relu"]
    assert list(new.op[1].output) == ["y_gpu_1"]
    assert list(new.op[2].input) == ["y_gpu_1"] and list(new.op[3].input) == ["y_gpu_1"]
    assert devices["y_gpu_1"].device_id == 1
    assert len(proto.op) == 3


def test_verifier_does_not_check_cpu_device_scopes() -> None:
    proto = net_of(("Sum", ["cpu_0/g", "cpu_1/g"], ["cpu_0/g"]), inputs=("cpu_0/g", "cpu_1/g"))
    proto.op[0].device_option.CopyFrom(DeviceOption(caffe2_pb2.CPU, 0))
    assert verify_problems(proto) == []
