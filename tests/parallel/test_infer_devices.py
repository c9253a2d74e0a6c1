"""Blob device inference (Caffe2's ``_InferBlobDevice``): each blob takes the device
option of the first op that reads or writes it, init net first; ``Iter`` counts as CPU; a
RecurrentNetwork op's step nets follow its own blobs, the last step net first."""

from __future__ import annotations

from typing import Any

import pytest

from dpgraph.errors import ParallelizeError
from dpgraph.ir.blob import BlobReference
from dpgraph.parallel.config import make_config
from dpgraph.parallel.grouping import _map_ops, group_by_device
from dpgraph.parallel.state import ParallelState
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


def _grouped_by_reference(blobs: list[Any], prefix: str) -> dict[str, dict[int, Any]]:
    """Caffe2's ``_GroupByDevice`` for BlobReferences, spelled out."""
    grouped: dict[str, dict[int, Any]] = {}
    for blob in blobs:
        name = str(blob)
        head = name.split("/", 1)[0] if "/" in name else ""
        if not head.startswith(prefix + "_"):
            raise ParallelizeError("expected to have name scope")
        grouped.setdefault(name[name.find("/") + 1:], {})[int(head[len(prefix) + 1:])] = blob
    return grouped


@pytest.mark.parametrize("names", [
    ["cpu_0/w", "cpu_1/w", "cpu_1/b", "cpu_0/b"], ["cpu_01/w", "cpu_ 2/w", "cpu_+3/a/b"],
    ["cpu_0/a/b/c", "cpu_12/a/b/c"], ["gpu_0/w"], ["w"], ["cpu_x/w"], ["cpu_/w"],
    ["cpu_٣/w"],
])
def test_group_by_device_reads_device_and_name_from_the_first_scope(names: list[str]) -> None:
    config = make_config(devices=[0, 1], cpu_device=True, input_builder_fun=lambda m: None,
                         forward_pass_builder_fun=lambda m, s: [])
    state = ParallelState(model=None, config=config)
    blobs = [BlobReference(n) for n in names]
    try:
        expected: Any = _grouped_by_reference(blobs, "cpu")
    except (ParallelizeError, ValueError):
        with pytest.raises(ParallelizeError):
            group_by_device(state, blobs, [])
        return
    got = group_by_device(state, blobs, [])
    assert list(got) == list(expected)
    assert {k: list(v.items()) for k, v in got.items()} == \
        {k: list(v.items()) for k, v in expected.items()}


def test_blob_device_type_reads_the_full_name_then_the_master_copy() -> None:
    config = make_config(devices=[2, 3], cpu_device=False, input_builder_fun=lambda m: None,
                         forward_pass_builder_fun=lambda m, s: [])
    state = ParallelState(model=None, config=config)
    ideep = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_IDEEP)
    cpu = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_CPU)
    state.blob_to_device = {"gpu_2/w": ideep, "x": cpu}
    assert state.blob_device_type("w") == caffe2_pb2.PROTO_IDEEP  # the master's copy
    assert state.is_ideep_blob("w") and not state.is_gpu_blob("w")
    assert state.blob_device_type("x") == caffe2_pb2.PROTO_CPU and not state.is_gpu_blob("x")
    assert state.blob_device_type("unknown") == config.device_type  # no op touches it
    assert state.is_gpu_blob("unknown") and not state.is_ideep_blob("unknown")
