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
