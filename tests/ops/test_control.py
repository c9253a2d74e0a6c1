"""Control-flow ops: Do scopes, If/While via control_ops_util, their gradients checked
numerically, and the counter ops."""

from __future__ import annotations

import numpy as np
import pytest
from _workspace import clean_runtime  # noqa: F401

from dpgraph import core, workspace
from dpgraph.control_ops_grad import disambiguate_grad_if_op_output
from dpgraph.control_ops_util import add_if_op, add_while_op, get_external_blob_names
from dpgraph.errors import ModelConfigError
from dpgraph.gradient_checker import NetGradientChecker
from dpgraph.proto import caffe2_pb2

X = np.array([1.0, 2.0, 3.0], np.float32)
W = np.array([0.5, -1.0, 2.0], np.float32)


def _if_net() -> core.Net:
    net = core.Net("if_net")
    then_net = core.Net("then")
    then_net.Mul(["x", "w"], "tmp")
    then_net.Tanh("tmp", "y")
    else_net = core.Net("else")
    else_net.Add(["x", "w"], "y")
    add_if_op(net, "cond", ["x", "w", "y", "cond"], then_net, else_net)
    return net


def test_if_op_structure_and_scoping() -> None:
    net = _if_net()
    types = [op.type for op in net.Proto().op]
    assert types == ["CreateScope", "CreateScope", "If"]
    if_op = net.Proto().op[-1]
    assert list(if_op.input)[:3] == ["cond", "w", "x"]
    assert list(if_op.output)[0] == "y"
    workspace.FeedBlob("x", X)
    workspace.FeedBlob("w", W)
    workspace.FeedBlob("cond", np.array(True))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("y"), np.tanh(X * W), rtol=1e-6)
    assert not workspace.HasBlob("tmp")  # branch-local blobs stay in the Do scope
    workspace.FeedBlob("cond", np.array(False))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("y"), X + W)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("wrt", ["x", "w"])
def test_if_gradient_numeric(cond: bool, wrt: str) -> None:
    values = {"x": X, "w": W, "cond": np.array(cond)}
    mean, biggest = NetGradientChecker.Check(_if_net(), ["y"], values, wrt, step_size=1e-2,
                                             threshold=1e-2, print_net=False)
    assert biggest < 1e-2


def _while_net() -> core.Net:
    net = core.Net("while_net")
    net.Copy("acc0", "acc")
    net.ConstantFill([], "i", shape=[1], value=0, dtype=core.DataType.INT32)
    net.ConstantFill([], "cond", shape=[], value=True, dtype=core.DataType.BOOL)
    body = core.Net("body")
    body.Mul(["x0", "w"], "xw")
    body.Sum(["acc", "xw"], "acc_sum")
    body.Tanh("acc_sum", "acc")
    body.Add(["i", "one"], "i")
    body.LT(["i", "n"], "cond")
    add_while_op(net, "cond", ["x0", "w", "acc", "i", "one", "n", "cond"], body)
    return net


WHILE_VALUES = {"x0": X, "w": W, "acc0": np.array([0.1, 0.2, -0.3], np.float32),
                "one": np.array([1], np.int32), "n": np.array([3], np.int32)}


def test_while_op_runs_the_loop() -> None:
    for name, value in WHILE_VALUES.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(_while_net())
    expected = WHILE_VALUES["acc0"]
    for _ in range(3):
        expected = np.tanh(expected + X * W)
    np.testing.assert_allclose(workspace.FetchBlob("acc"), expected, rtol=1e-6)
    assert int(workspace.FetchBlob("i")[0]) == 3
    assert not workspace.HasBlob("xw") and not workspace.HasBlob("acc_sum")


@pytest.mark.parametrize("wrt", ["acc0", "w", "x0"])
def test_while_gradient_numeric(wrt: str) -> None:
    _, biggest = NetGradientChecker.Check(_while_net(), ["acc"], WHILE_VALUES, wrt,
                                          step_size=1e-2, threshold=2e-2, print_net=False)
    assert biggest < 2e-2


def test_while_gradient_structure_uses_has_scope() -> None:
    net = _while_net()
    grads = net.AddGradientOperators(["acc"])
    assert {"acc0", "w", "x0"} <= {str(k) for k in grads}
    grad_while = [op for op in net.Proto().op if op.type == "While" and op.is_gradient_op]
    assert len(grad_while) == 1
    cond_net = [a.n for a in grad_while[0].arg if a.name == "cond_net"][0]
    assert [op.type for op in cond_net.op][0] == "HasScope"


def test_external_blob_names_checks_the_scope() -> None:
    net = core.Net("ext")
    net.Add(["a", "b"], "c")
    assert get_external_blob_names(net, ["a", "b", "c"]) == ({"a", "b"}, {"c"})
    with pytest.raises(ModelConfigError, match="Input blob b is undefined"):
        get_external_blob_names(net, ["a", "c"])


def test_disambiguate_grad_if_op_output() -> None:
    then_net = core.Net("t")
    then_net.Copy("then_grad", "input_grad")
    else_net = core.Net("e")
    else_net.Copy("else_grad", "else_temp_grad")
    else_net.Copy("else_temp", "input_grad")
    op = core.CreateOperator("If", ["cond", "then_grad", "else_grad"],
                             ["input_grad", "else_temp_grad"], then_net=then_net.Proto(),
                             else_net=else_net.Proto())
    disambiguate_grad_if_op_output(op, 0, "input_grad_autosplit_0")
    assert op.output[0] == "input_grad_autosplit_0"
    nets = {a.name: a.n for a in op.arg}
    assert nets["else_net"].op[1].output[0] == "input_grad_autosplit_0"
    assert nets["then_net"].op[0].output[0] == "input_grad_autosplit_0"


def test_do_gradient_without_forward_scope_fails() -> None:
    net = _if_net()
    net.AddGradientOperators(["y"])
    workspace.FeedBlob("x", X)
    workspace.FeedBlob("w", W)
    workspace.FeedBlob("cond", np.array(True))
    workspace.RunNetOnce(net)
    grad_if = core.Net("only_grad")
    grad_if.Proto().op.extend([net.Proto().op[-1]])
    with pytest.raises(RuntimeError, match="no forward workspace"):
        workspace.RunNetOnce(grad_if)


def test_counter_ops() -> None:
    net = core.Net("counter")
    net.CreateCounter([], ["c"], init_count=2)
    net.CountDown(["c"], ["d1"])
    net.CountDown(["c"], ["d2"])
    net.CountDown(["c"], ["d3"])
    net.RetrieveCount(["c"], ["n"])
    net.ResetCounter(["c"], ["prev"], init_count=5)
    net.CountUp(["c"], ["before"])
    net.CheckCounterDone(["c"], ["done"])
    workspace.RunNetOnce(net)
    got = [bool(workspace.FetchBlob(b)) for b in ("d1", "d2", "d3", "done")]
    assert got == [False, False, True, False]
    assert int(workspace.FetchBlob("n")) == -1 and int(workspace.FetchBlob("prev")) == -1
    assert int(workspace.FetchBlob("before")) == 5


def test_counter_blobs_save_and_load(tmp_path) -> None:
    path = str(tmp_path / "counter.minidb")
    workspace.RunOperatorOnce(core.CreateOperator("CreateCounter", [], ["ctr"], init_count=22))
    workspace.RunOperatorOnce(core.CreateOperator("Save", ["ctr"], [], absolute_path=1,
                                                  db=path, db_type="minidb"))
    workspace.RunOperatorOnce(core.CreateOperator("CountUp", ["ctr"], ["ignored"]))
    workspace.RunOperatorOnce(core.CreateOperator("Load", [], ["ctr"], absolute_path=1,
                                                  db=path, db_type="minidb"))
    workspace.RunOperatorOnce(core.CreateOperator("RetrieveCount", ["ctr"], ["n"]))
    assert int(workspace.FetchBlob("n")) == 22


def test_do_binds_inner_blobs_by_index_without_the_workspace_blob() -> None:
    subnet = core.Net("do_sub")
    subnet.Add(["X", "Y"], "Z")
    net = core.Net("do_net")
    net.CreateScope([], "W")
    net.Do(["outer_X", "outer_Y", "W"], ["outer_Z", "W"], net=subnet.Proto(),
           inner_blobs=["X", "Y", "Z"], outer_blobs_idx=[0, 1, 2])
    workspace.FeedBlob("outer_X", np.asarray([1, 2]))
    workspace.FeedBlob("outer_Y", np.asarray([3, 4]))
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("outer_Z").tolist() == [4, 6]
    assert not workspace.HasBlob("Z")


def test_do_reuse_workspace_sees_the_previous_scope() -> None:
    init = core.Net("do_init")
    init.ConstantFill([], "X", shape=[1], value=1.0)
    init.ConstantFill([], "Y", shape=[1], value=2.0)
    body = core.Net("do_body")
    body.Add(["X", "Y"], "Z")
    net = core.Net("do_reuse")
    net.CreateScope([], "W")
    net.Do("W", "W", net=init.Proto(), inner_blobs=[], outer_blobs_idx=[])
    net.Do("W", ["outer_Z", "W"], net=body.Proto(), inner_blobs=["Z"], outer_blobs_idx=[0],
           reuse_workspace=True)
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("outer_Z").tolist() == [3.0]
    with pytest.raises(RuntimeError, match="out of range"):
        bad = core.Net("do_bad")
        bad.CreateScope([], "W2")
        bad.Do("W2", "W2", net=body.Proto(), inner_blobs=["Z"], outer_blobs_idx=[0])
        workspace.RunNetOnce(bad)


@pytest.mark.parametrize("save_scopes,disable_scopes", [(0, 0), (1, 0), (0, 1)])
@pytest.mark.parametrize("max_trip,condition", [(0, True), (3, True), (20, True), (5, False)])
def test_onnx_while_fibonacci(save_scopes: int, disable_scopes: int, max_trip: int,
                              condition: bool) -> None:
    body = core.Net("onnx_body")
    body.Add(["first", "second"], "third")
    limit = body.ConstantFill([], "limit_const", shape=[1], value=100.0)
    body.LT(["third", limit], "cond_new")
    proto = caffe2_pb2.NetDef(name="onnx_body")
    proto.op.extend(body.Proto().op)
    proto.external_input.extend(["i", "cond", "first", "second"])
    proto.external_output.extend(["cond_new", "second", "third", "third"])
    op = core.CreateOperator("ONNXWhile", ["max_trip", "condition", "first_init",
                                           "second_init"], ["first_a", "second_a", "third_a"],
                             body=proto, has_cond=True, has_trip_count=True,
                             save_scopes=save_scopes, disable_scopes=disable_scopes)
    workspace.FeedBlob("max_trip", np.array(max_trip, np.int64))
    workspace.FeedBlob("condition", np.array(condition))
    workspace.FeedBlob("first_init", np.array([1.0], np.float32))
    workspace.FeedBlob("second_init", np.array([1.0], np.float32))
    workspace.RunOperatorOnce(op)
    first, second, results = 1.0, 1.0, []
    if condition:
        for _ in range(max_trip):
            first, second = second, first + second
            results.append(second)
            if second > 100:
                break
    assert workspace.FetchBlob("first_a").tolist() == [first]
    assert workspace.FetchBlob("second_a").tolist() == [second]
    assert workspace.FetchBlob("third_a").tolist() == results
    assert workspace.HasBlob("cond_new") == bool(disable_scopes and results)
