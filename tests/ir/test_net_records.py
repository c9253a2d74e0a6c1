"""Net.set_input_record / set_output_record (Caffe2's schema records on nets)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, schema
from dpgraph.errors import NetError


def _record() -> schema.Struct:
    return schema.Struct(("a", schema.Scalar(np.float32)), ("b", schema.Scalar(np.int32)))


def test_input_record_without_blobs_gets_scoped_external_inputs() -> None:
    net = core.Net("records")
    name = net.Name()  # "records", or "records_<k>" when another net took the name
    record = net.set_input_record(_record())
    assert [str(b) for b in record.field_blobs()] == [f"{name}/a", f"{name}/b"]
    assert list(net.Proto().external_input) == [f"{name}/a", f"{name}/b"]
    assert net.has_input_record()
    with pytest.raises(NetError, match="cannot be reset"):
        net.set_input_record(_record())


def test_output_record_blobs_must_be_defined() -> None:
    net = core.Net("n")
    out = net.ConstantFill([], "out", shape=[1], value=1.0)
    with pytest.raises(NetError, match="not defined"):
        net.set_output_record(schema.Scalar(np.float32, core.BlobReference("missing")))
    net.set_output_record(schema.Scalar(np.float32, out))
    assert list(net.Proto().external_output) == ["out"] and net.has_output_record()


def _bound_net() -> core.Net:
    net = core.Net("bind_records")
    record = net.set_input_record(schema.Struct(("x", schema.Scalar(np.float32))))
    net.Relu(record.x(), "h")
    net.Relu("h", "y")
    net.set_output_record(schema.Struct(("y", schema.Scalar(np.float32, core.BlobReference("y")))))
    return net


def test_clone_keeps_records_with_renamed_blobs() -> None:
    net = _bound_net()
    x = str(net.input_record().x())
    clone = net.Clone("bind_records_clone", {x: "other_x", "y": "other_y"})
    assert [str(b) for b in clone.input_record().field_blobs()] == ["other_x"]
    assert [str(b) for b in clone.output_record().field_blobs()] == ["other_y"]
    assert [str(b) for b in net.input_record().field_blobs()] == [x]  # original unchanged
    assert clone.input_record().x().Net() is clone
    assert net.Clone("bind_records_plain", keep_schema=False).input_record() is None


def test_clone_and_bind_net_binds_the_input_record_fields() -> None:
    net = _bound_net()
    x = str(net.input_record().x())
    feed = schema.Struct(("x", schema.Scalar(np.float32, core.BlobReference("batch_x"))))
    cloned, remap = core.clone_and_bind_net(net, "bind_records_bound", "p/", inputs=feed)
    assert remap[x] == "batch_x" and remap["h"] == "p/h" and remap["y"] == "p/y"
    assert list(cloned.Proto().op[0].input) == ["batch_x"]
    assert [str(b) for b in cloned.input_record().field_blobs()] == ["batch_x"]
    unkept, _ = core.clone_and_bind_net(net, "bind_records_unkept", "q/", inputs=feed,
                                        keep_schema=False)
    assert unkept.input_record() is feed


def test_clone_and_bind_net_refuses_other_fields_or_no_record() -> None:
    wrong = schema.Struct(("z", schema.Scalar(np.float32, core.BlobReference("z"))))
    with pytest.raises(NetError, match=r"differ: \['x', 'z'\]"):
        core.clone_and_bind_net(_bound_net(), "bind_records_wrong", "p/", inputs=wrong)
    plain = core.Net("bind_records_none")
    plain.Relu("a", "b")
    with pytest.raises(NetError, match="has no input record"):
        core.clone_and_bind_net(plain, "bind_records_none2", "p/", inputs=wrong)
