"""dpgraph.testing: structural assertions for users' own graph tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpgraph import testing
from dpgraph.core import DeviceOption
from dpgraph.proto import caffe2_pb2


def two_device_net(first_id: int = 0, name: str = "n") -> caffe2_pb2.NetDef:
    proto = caffe2_pb2.NetDef(name=name)
    for device in (first_id, first_id + 1):
        op = proto.op.add(type="Relu", input=[f"gpu_{device}/x"], output=[f"gpu_{device}/y"])
        op.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, device))
    sum_op = proto.op.add(type="Sum", name="dpm",
                          input=[f"gpu_{first_id}/y", f"gpu_{first_id + 1}/y"],
                          output=[f"gpu_{first_id}/y"])
    sum_op.device_option.CopyFrom(DeviceOption(caffe2_pb2.CUDA, first_id))
    return proto


def test_counts_and_grouping() -> None:
    net = two_device_net()
    assert testing.count_ops(net) == 3
    assert testing.count_ops(net, type="Relu") == 2
    assert testing.count_ops(net, type="Relu", device="gpu_1") == 1
    assert {k: len(v) for k, v in testing.ops_by_device(net).items()} == {"gpu_0": 2,
                                                                         "gpu_1": 1}
    assert [op.type for op in testing.collectives(net)] == ["Sum"]
    assert testing.op_types(net)["Relu"] == 2


def test_assert_nets_equal_diff_and_options() -> None:
    testing.assert_nets_equal(two_device_net(), two_device_net())
    with pytest.raises(AssertionError) as info:
        testing.assert_nets_equal(two_device_net(), two_device_net(name="m"))
    assert '-net "n"' in str(info.value) and '+net "m"' in str(info.value)
    testing.assert_nets_equal(two_device_net(), two_device_net(name="m"), ignore_names=True)
    with pytest.raises(AssertionError):
        testing.assert_nets_equal(two_device_net(0), two_device_net(2))
    testing.assert_nets_equal(two_device_net(0), two_device_net(2), ignore_device_ids=True)


def test_arg_order_option() -> None:
    a, b = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    op_a = a.op.add(type="Relu")
    op_a.arg.add(name="x", i=1)
    op_a.arg.add(name="y", i=2)
    op_b = b.op.add(type="Relu")
    op_b.arg.add(name="y", i=2)
    op_b.arg.add(name="x", i=1)
    with pytest.raises(AssertionError):
        testing.assert_nets_equal(a, b)
    testing.assert_nets_equal(a, b, ignore_arg_order=True)


def test_snapshot_written_then_compared(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = tmp_path / "snap" / "net.txt"
    testing.assert_matches_snapshot(two_device_net(), snapshot)
    assert snapshot.read_text().startswith('net "n"')
    testing.assert_matches_snapshot(two_device_net(), snapshot)
    with pytest.raises(AssertionError):
        testing.assert_matches_snapshot(two_device_net(name="other"), snapshot)
    monkeypatch.setenv(testing.UPDATE_ENV, "1")
    testing.assert_matches_snapshot(two_device_net(name="other"), snapshot)
    assert snapshot.read_text().startswith('net "other"')
