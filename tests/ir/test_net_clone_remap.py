"""Caffe2 details of Net: str() external inputs, RecurrentNetwork remap in Clone, AppendNet."""

from __future__ import annotations

from dpgraph import core
from dpgraph.proto import caffe2_pb2


def test_add_external_inputs_names_any_object_by_str() -> None:
    net = core.Net("n")
    ref = net.AddExternalInputs(["input"])  # Caffe2's recurrent tests pass a list
    assert str(ref) == "['input']" and list(net.Proto().external_input) == ["['input']"]


def _rnn_net() -> core.Net:
    step = core.Net("step")
    step.Relu("x_t", "h_t")
    net = core.Net("outer")
    net.RecurrentNetwork(["x"], ["h"], step_net=step.Proto(), timestep="t",
                         link_internal=["h_t"], link_external=["h"])
    return net


def test_clone_remaps_recurrent_network_arguments_and_step_net() -> None:
    clone = _rnn_net().Clone("c", blob_remap={"h": "c/h", "t": "c/t", "x_t": "c/x_t"})
    args = {a.name: a for a in clone.Proto().op[0].arg}
    assert list(args["link_external"].strings) == [b"c/h"]
    assert args["timestep"].s == b"c/t"
    # Caffe2 clones the step net as core.Net("cloned_sub_net"): unique within the process,
    # so a suffix when an earlier test already cloned one
    assert args["step_net"].n.name.startswith("cloned_sub_net")
    assert list(args["step_net"].n.op[0].input) == ["c/x_t"]


def test_append_net_places_step_net_ops_too() -> None:
    target = core.Net("t")
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 2)
    target.AppendNet(_rnn_net(), device_option=gpu)
    op = target.Proto().op[0]
    step = {a.name: a for a in op.arg}["step_net"].n
    assert op.device_option.device_id == 2 and step.op[0].device_option.device_id == 2
