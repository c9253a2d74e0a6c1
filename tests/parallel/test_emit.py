"""Ops the passes emit in place (``emit_op``) equal ``emit(net, make_op(...))``: the same
bytes, external inputs and lookup tables."""

from __future__ import annotations

from typing import Any

import pytest

from dpgraph.core import Net
from dpgraph.errors import ArgumentError
from dpgraph.ir.blob import BlobReference
from dpgraph.parallel._emit import device_option, emit, emit_op, make_op
from dpgraph.proto import caffe2_pb2

CASES: list[tuple[str, list[Any], list[Any], dict[str, Any]]] = [
    ("Copy", ["a"], ["b"], {}),
    ("Copy", ["b"], ["c"], {"device": device_option(caffe2_pb2.PROTO_CPU, 0)}),
    ("Copy", ["a"], ["b"], {"device": caffe2_pb2.DeviceOption()}),
    ("Sum", ["g0", "g1"], ["g0"], {"device": device_option(caffe2_pb2.PROTO_CUDA, 3),
                                   "name": "dpm"}),
    ("Sum", ["a", "new", "new", "a"], ["a"], {"engine": ""}),
    ("NCCLAllreduce", [BlobReference("x"), b"y"], [BlobReference("x")],
     {"engine": "NCCL", "control_input": ["c", BlobReference("d")]}),
    ("If", ["cond"], [], {"control_input": [], "then_net": caffe2_pb2.NetDef(name="sub")}),
    ("ConstantFill", [], ["k"], {"shape": [1], "value": 0, "dtype": None, "name": "x",
                                 "values": [1.0, 2.0], "s": "str"}),
]


def _pair() -> tuple[Net, Net]:
    nets = Net("emitted_copy"), Net("emitted_in_place")
    for net in nets:
        net.Relu("pre", "b")
    return nets


def _same(copied: Net, in_place: Net) -> None:
    proto, other = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    proto.CopyFrom(copied.Proto())
    other.CopyFrom(in_place.Proto())
    other.name = proto.name
    assert other.SerializeToString() == proto.SerializeToString()
    in_place._CheckLookupTables()
    assert in_place._op_outputs == copied._op_outputs
    assert in_place._external_input_map == copied._external_input_map


@pytest.mark.parametrize("op_type,inputs,outputs,kwargs", CASES)
def test_emit_op_equals_make_op_then_emit(op_type: str, inputs: list[Any],
                                          outputs: list[Any], kwargs: dict[str, Any]) -> None:
    copied, in_place = _pair()
    emit(copied, make_op(op_type, inputs, outputs, **kwargs))
    op = emit_op(in_place, op_type, inputs, outputs, **kwargs)
    assert op == in_place.Proto().op[-1]
    _same(copied, in_place)


def test_a_sequence_of_emitted_ops_declares_each_input_once() -> None:
    copied, in_place = _pair()
    for op_type, inputs, outputs, kwargs in CASES:
        emit(copied, make_op(op_type, inputs, outputs, **kwargs))
        emit_op(in_place, op_type, inputs, outputs, **kwargs)
    _same(copied, in_place)
    assert list(in_place.Proto().external_input) == ["pre", "a", "g0", "g1", "new", "x",
                                                     "b'y'", "cond"]


def test_a_failed_emit_leaves_the_net_unchanged() -> None:
    net = Net("emit_fails")
    net.Relu("x", "y")
    before = net.Proto().SerializeToString()
    with pytest.raises(ArgumentError):
        emit_op(net, "Copy", ["undeclared"], ["z"], bad=object())
    assert net.Proto().SerializeToString() == before
    assert not net.BlobIsDefined("z") and not net.BlobIsDefined("undeclared")
