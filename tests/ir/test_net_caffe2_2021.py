"""Net pieces of Caffe2's final core.py: partial clones with renamed inputs, control-op
remapping, op insertion and rerouting, op names from creation sites."""

from __future__ import annotations

import pytest

from dpgraph import core
from dpgraph.errors import NetError


def test_clone_partial_renames_the_given_inputs() -> None:
    net = core.Net("partial_src")
    net.Relu("a1", "b1")
    net.Relu("a2", "b2")
    net.Sum(["b1", "b2"], "d")
    part, outputs = net.ClonePartial("f1", {"a1": "a11", "a2": "a22"}, ["d"])
    assert [list(op.input) for op in part.Proto().op] == [["a11"], ["a22"], ["f1/b1", "f1/b2"]]
    assert list(part.Proto().external_input) == ["a11", "a22"] and outputs == ["f1/d"]
    with pytest.raises(NetError, match="not defined"):
        net.ClonePartial("f2", ["a1"], ["nowhere"])


def test_clone_remaps_if_branches() -> None:
    then_net = core.Net("then_branch")
    then_net.Copy("x", "y")
    net = core.Net("with_if")
    net.If(["cond", "x"], ["y"], then_net=then_net.Proto())
    clone = net.Clone("cloned_if", blob_remap={"x": "x2", "y": "y2"})
    branch = {a.name: a for a in clone.Proto().op[0].arg}["then_net"].n
    assert list(branch.op[0].input) == ["x2"] and list(branch.op[0].output) == ["y2"]


def test_update_external_list_follows_caffe2() -> None:
    net = core.Net("ext")
    net.Relu("a", "b1")
    net.Relu("b1", "c1")
    net.Relu("a", "b2")
    clone = net.Clone("ext_clone", update_external_list=True)
    assert list(clone.Proto().external_input) == ["a", "a"]
    assert list(clone.Proto().external_output) == ["c1", "b2"]


def test_insert_and_reroute() -> None:
    net = core.Net("reroute")
    net.Relu("x", "h")
    net.Sigmoid("h", "out")
    scale = core.CreateOperator("Scale", ["h"], ["h_scaled"], scale=2.0)
    assert net.reroute_tensor("h", scale, can_modify=[net.Proto().op[1]]) == 1
    assert [op.type for op in net.Proto().op] == ["Relu", "Scale", "Sigmoid"]
    assert list(net.Proto().op[2].input) == ["h_scaled"]
    with pytest.raises(NetError, match="negative"):
        net.insert_op_at_idx(scale, -1)


def test_op_names_from_their_creation_site() -> None:
    net = core.Net("named_by_file")
    net.Relu("x", "y")
    net.PopulateProtoWithFileName()
    file, line, function = net.Proto().op[0].name.rsplit(":", 2)
    assert file.endswith("test_net_caffe2_2021.py") and function == (
        "test_op_names_from_their_creation_site") and int(line) > 0
    net._CheckLookupTables()
