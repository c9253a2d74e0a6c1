"""Net names under a name prefix provider; appending fields to a net's output record."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, schema
from dpgraph.errors import NetError
from dpgraph.ir import net as ir_net


def test_net_names_take_the_current_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ir_net, "NET_NAME_PREFIXES", [lambda: "trainer_1/task_2"])
    assert core.Net("init").Name().startswith("trainer_1/task_2/init")


def test_append_output_record_field() -> None:
    net = core.Net("append_record")
    a = net.ConstantFill([], "a", shape=[1], value=1.0)
    b = net.ConstantFill([], "b", shape=[1], value=2.0)
    with pytest.raises(NetError, match="missing output record"):
        net.AppendOutputRecordField("b", schema.Scalar(np.float32, b))
    net.set_output_record(schema.Struct(("a", schema.Scalar(np.float32, a))))
    net.AppendOutputRecordField("b", schema.Scalar(np.float32, b))
    assert net.output_record().field_names() == ["a", "b"]
    assert list(net.Proto().external_output) == ["a", "b"]
