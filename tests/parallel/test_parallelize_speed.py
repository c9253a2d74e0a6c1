"""The bulk emission paths Parallelize uses for speed make exactly what the one-op-at-a-time
paths make: the same NetDef bytes, external inputs and blob lookups."""

from __future__ import annotations

from typing import Any

import pytest

from dpgraph.ir.net import Net
from dpgraph.parallel._emit import device_option, emit_copies, emit_op
from dpgraph.proto import caffe2_pb2


def _net(name: str) -> Net:
    net = Net(name)
    net.AddExternalInput("cpu_0/defined_input")
    net.ConstantFill([], "cpu_0/made", shape=[1], value=1.0)
    return net


def _snapshot(net: Net) -> tuple[list[bytes], list[str], list[bool]]:
    """The ops' bytes, the external inputs and which blobs the net says are defined."""
    proto = net.Proto()
    probes = ["cpu_0/w", "cpu_1/w", "cpu_3/w", "cpu_0/made", "cpu_9/none"]
    return ([op.SerializeToString() for op in proto.op], list(proto.external_input),
            [net.BlobIsDefined(b) for b in probes])


@pytest.mark.parametrize("source", ["cpu_0/w", "cpu_0/made", "cpu_0/defined_input"])
@pytest.mark.parametrize("gpu", [False, True])
def test_emit_copies_equals_one_emit_op_per_copy(source: str, gpu: bool) -> None:
    kind = caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU
    targets = [1, 3, 2]
    one_by_one, bulk = _net("one_by_one"), _net("bulk")
    for device in targets:
        emit_op(one_by_one, "Copy", [source], [f"cpu_{device}/w"],
                device_option(kind, device if gpu else 0))
    emit_copies(bulk, "Copy", [source], [[f"cpu_{d}/w"] for d in targets],
                device_option(kind, targets[0] if gpu else 0), targets if gpu else None)
    assert _snapshot(bulk) == _snapshot(one_by_one)
    assert len(bulk.Proto().op) == 1 + len(targets)
    bulk.Relu("cpu_1/w", "cpu_1/r")  # the lookup tables know the copies' outputs
    assert "cpu_1/w" not in bulk.Proto().external_input


def test_emit_copies_of_nothing_changes_nothing() -> None:
    net = _net("empty")
    before = net.Proto().SerializeToString()
    emit_copies(net, "Copy", ["cpu_0/undeclared"], [], device_option(caffe2_pb2.CPU))
    assert net.Proto().SerializeToString() == before


def test_extend_ops_in_place_equals_extend_ops() -> None:
    ops = [caffe2_pb2.OperatorDef(type="Relu", input=["cpu_0/made"], output=[f"cpu_0/r{i}"])
           for i in range(3)]
    copied, in_place = _net("copied"), _net("in_place")
    copied.extend_ops(ops)

    def fill(live: Any) -> None:
        for op in ops:
            live.add().CopyFrom(op)

    in_place.extend_ops_in_place(fill, [o for op in ops for o in op.output])
    assert _snapshot(in_place) == _snapshot(copied)
    assert in_place.BlobIsDefined("cpu_0/r2") and copied.BlobIsDefined("cpu_0/r2")


def test_extend_ops_in_place_removes_what_a_failing_fill_added() -> None:
    net = _net("failing")
    before = net.Proto().SerializeToString()

    def fill(live: Any) -> None:
        live.add(type="Relu", input=["cpu_0/made"], output=["cpu_0/half"])
        raise RuntimeError("fill failed")

    with pytest.raises(RuntimeError, match="fill failed"):
        net.extend_ops_in_place(fill, ["cpu_0/half"])
    assert net.Proto().SerializeToString() == before
    assert not net.BlobIsDefined("cpu_0/half")
