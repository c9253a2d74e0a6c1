"""Blob device inference (Caffe2's ``_InferBlobDevice``): each blob takes the device
option of the first op that reads or writes it, init net first; ``Iter`` counts as CPU; a
RecurrentNetwork op's step nets follow its own blobs, the last step net first."""

from __future__ import annotations

from typing import Any

from dpgraph.parallel.grouping import _map_ops
from dpgraph.proto import caffe2_pb2


def _reference(ops: Any, mapping: dict[str, Any]) -> None:
    """Caffe2's formulation, blob by blob."""
    for op in ops:
        option = op.device_option
        if op.type == "Iter":
            option = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_CPU)
        for blob in list(op.input) + list(op.output):
            mapping.setdefault(blob, option)
        if op.type.startswith("RecurrentNetwork"):
            steps = [a for a in op.arg if a.name.endswith("step_net")]
            for arg in reversed(steps):
                _reference(arg.n.op, mapping)


def _op(op_type: str, inputs: list[str], outputs: list[str], device: int = -1,
        **nets: caffe2_pb2.NetDef) -> caffe2_pb2.OperatorDef:
    op = caffe2_pb2.OperatorDef(type=op_type, input=inputs, output=outputs)
    if device >= 0:
        op.device_option.device_type = caffe2_pb2.PROTO_CUDA
        op.device_option.device_id = device
    for name, net in nets.items():
        op.arg.add(name=name, n=net)
    return op


def test_first_op_wins_in_order_with_iter_and_step_nets() -> None:
    step = caffe2_pb2.NetDef(op=[_op("FC", ["h", "w_step"], ["h_next"], 3)])
    backward_step = caffe2_pb2.NetDef(op=[_op("FCGradient", ["h_next_grad"], ["w_grad"], 4)])
    init = caffe2_pb2.NetDef(op=[_op("ConstantFill", [], ["it"], 1),
                                 _op("Iter", ["it"], ["it", "fresh"], 2),
                                 _op("XavierFill", [], ["w"], 2)])
    net = caffe2_pb2.NetDef(op=[
        _op("Relu", ["w", "x"], ["y"], 5), _op("Copy", ["y"], ["y", "z"], 6),
        _op("RecurrentNetwork", ["x", "seq"], ["out"], 7, step_net=step,
            backward_step_net=backward_step),
        _op("Sum", ["h", "y"], ["s"]), _op("Relu", ["w_grad"], ["q"], 8),
    ])
    got: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for proto in (init, net):
        _map_ops(proto.op, got)
        _reference(proto.op, expected)
    assert list(got) == list(expected)
    assert {k: v.SerializeToString() for k, v in got.items()} == \
        {k: v.SerializeToString() for k, v in expected.items()}
    assert got["fresh"].device_type == caffe2_pb2.PROTO_CPU  # Iter
    assert got["w_grad"].device_id == 4 and got["h"].device_id == 3
    assert list(got).index("h_next_grad") < list(got).index("h")  # last step net first
    assert got["z"].device_id == 6 and got["it"].device_id == 1
