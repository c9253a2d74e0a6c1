"""Utility ops: identities, Cast, Print, Free, ZeroGradient and the index helpers."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ArgumentError, GradientError, NoGradientError, OperatorError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import run_op, run_ops
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


def structure(ops) -> list:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def test_stop_gradient_identity_without_gradient() -> None:
    x = np.arange(3.0)
    np.testing.assert_array_equal(run_op(CreateOperator("StopGradient", ["X"], ["Y"]), [x])[0],
                                  x)
    ops, g_in = build_gradient(CreateOperator("StopGradient", ["X"], ["Y"]), ["Y_grad"])
    assert ops == [] and g_in == [None]
    with pytest.raises(NoGradientError):  # SHOULD_NOT_DO_GRADIENT ops have no maker
        build_gradient(CreateOperator("Size", ["X"], ["n"]), ["n_grad"])


def test_alias_and_ensure_dense_pass_through() -> None:
    for op_type in ("Alias", "EnsureDense"):
        op = CreateOperator(op_type, ["X"], ["Y"])
        np.testing.assert_array_equal(run_op(op, [np.ones(2)])[0], np.ones(2))
        ops, g_in = build_gradient(op, ["Y_grad"])
        assert ops == [] and g_in == ["Y_grad"]
    with pytest.raises(GradientError, match="dense"):
        build_gradient(CreateOperator("Alias", ["X"], ["Y"]), [GradientSlice("i", "v")])
    ops, g_in = build_gradient(CreateOperator("EnsureDense", ["X"], ["Y"]),
                               [GradientSlice("i", "v")])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("SparseToDense", ["i", "v", "X"], ["X_grad"])]
    assert g_in == ["X_grad"]


def test_cast_and_gradient() -> None:
    x = np.array([1.7, -2.2], np.float32)
    op = CreateOperator("Cast", ["X"], ["Y"], to=DT.INT32, from_type=DT.FLOAT)
    (y,) = run_op(op, [x])
    assert y.dtype == np.int32 and y.tolist() == [1, -2]
    assert run_op(CreateOperator("Cast", ["X"], ["Y"], to="int64"), [x])[0].dtype == np.int64
    ops, _ = build_gradient(op, ["Y_grad"])
    assert structure(ops) == [("Cast", ["Y_grad"], ["X_grad"])]
    assert arguments_dict(ops[0].arg) == {"to": DT.FLOAT, "from_type": DT.INT32}
    with pytest.raises(GradientError, match="from_type"):
        build_gradient(CreateOperator("Cast", ["X"], ["Y"], to=DT.INT32), ["Y_grad"])
    with pytest.raises(ArgumentError):
        run_op(CreateOperator("Cast", ["X"], ["Y"]), [x])


def test_print_logs_and_prints(capsys, caplog) -> None:
    schema = OPERATORS.lookup("Print")
    assert schema.side_effects and schema.max_outputs == 0
    with caplog.at_level(logging.INFO, logger="dpgraph.ops.utility"):
        run_ops([CreateOperator("Print", ["blob"], [])], {"blob": np.array([1.0, 2.0])})
    assert "blob" in capsys.readouterr().out
    assert any("blob" in r.getMessage() for r in caplog.records)


def test_free_returns_none() -> None:
    state = run_ops([CreateOperator("Free", ["a", "b"], ["a", "b"])],
                    {"a": np.ones(2), "b": np.ones(3)})
    assert state["a"] is None and state["b"] is None


def test_zero_gradient() -> None:
    op = CreateOperator("ZeroGradient", ["cell"], [])
    assert run_op(op, [np.ones(2)]) == []
    ops, g_in = build_gradient(op, [])
    assert structure(ops) == [("ConstantFill", ["cell"], ["cell_grad"])]
    assert arguments_dict(ops[0].arg) == {"value": 0.0} and g_in == ["cell_grad"]
    state = run_ops(ops, {"cell": np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(state["cell_grad"], np.zeros((2, 2)))


def test_nan_check() -> None:
    op = CreateOperator("NanCheck", ["X"], ["Y"])
    np.testing.assert_array_equal(run_op(op, [np.ones(3)])[0], np.ones(3))
    with pytest.raises(OperatorError, match="NaN"):
        run_op(op, [np.array([1.0, np.nan])])
    assert structure(build_gradient(op, ["Y_grad"])[0]) == [("NanCheck", ["Y_grad"],
                                                              ["X_grad"])]


def test_lengths_to_ranges_and_lengths_tile() -> None:
    (ranges,) = run_op(CreateOperator("LengthsToRanges", ["L"], ["R"]),
                       [np.array([3, 0, 2], np.int32)])
    assert ranges.dtype == np.int32 and ranges.tolist() == [[0, 3], [3, 0], [3, 2]]
    data = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    op = CreateOperator("LengthsTile", ["D", "L"], ["Y"])
    (tiled,) = run_op(op, [data, np.array([2, 1], np.int32)])
    np.testing.assert_array_equal(tiled, [[1, 2], [1, 2], [3, 4]])
    assert structure(build_gradient(op, ["Y_grad"])[0]) == [
        ("LengthsSum", ["Y_grad", "L"], ["D_grad"])]


def test_find_and_find_duplicates() -> None:
    (pos,) = run_op(CreateOperator("Find", ["idx", "X"], ["y"]),
                    [np.array([7, 5, 9], np.int32), np.array([9, 4, 7], np.int32)])
    assert pos.tolist() == [2, -1, 0]
    (pos,) = run_op(CreateOperator("Find", ["idx", "X"], ["y"], missing_value=-5),
                    [np.zeros(0, np.int64), np.array([1], np.int64)])
    assert pos.tolist() == [-5]
    (dups,) = run_op(CreateOperator("FindDuplicateElements", ["d"], ["i"]),
                     [np.array([3, 1, 3, 2, 1, 3])])
    assert dups.dtype == np.int64 and dups.tolist() == [2, 4, 5]
    strings = np.array([b"a", b"b", b"a"], dtype=object)
    assert run_op(CreateOperator("FindDuplicateElements", ["d"], ["i"]), [strings])[0].tolist(
    ) == [2]


def test_conditional() -> None:
    cond = np.array([True, False])
    t, f = np.ones((2, 3)), np.zeros((2, 3))
    (out,) = run_op(CreateOperator("Conditional", ["c", "t", "f"], ["o"]), [cond, t, f])
    np.testing.assert_array_equal(out, [[1, 1, 1], [0, 0, 0]])


def test_identities_copy_unless_in_place() -> None:
    x = np.ones(3)
    for op_type in ("StopGradient", "EnsureDense", "NanCheck"):
        (y,) = run_op(CreateOperator(op_type, ["X"], ["Y"]), [x])
        assert y is not x and np.array_equal(y, x)
        state = run_ops([CreateOperator(op_type, ["X"], ["X"])], {"X": x})
        assert state["X"] is x


def _control_net(name: str, op_type: str, inputs: list, outputs: list) -> caffe2_pb2.NetDef:
    net = caffe2_pb2.NetDef(name=name)
    net.op.append(CreateOperator(op_type, inputs, outputs))
    return net


def _run_in_workspace(op: caffe2_pb2.OperatorDef, feeds: dict) -> dict:
    from dpgraph import workspace

    workspace.ResetWorkspace()
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(op)
    result = {name: workspace.FetchBlob(name) for name in workspace.Blobs()}
    workspace.ResetWorkspace()
    return result


def test_if_runs_the_branch_in_the_workspace() -> None:
    then_net = _control_net("then", "Copy", ["a"], ["out"])
    else_net = _control_net("else", "Copy", ["b"], ["out"])
    op = CreateOperator("If", ["c", "a", "b"], ["out"], then_net=then_net, else_net=else_net)
    a, b = np.array([1.0], np.float32), np.array([2.0], np.float32)
    assert _run_in_workspace(op, {"c": np.array(True), "a": a, "b": b})["out"].tolist() == [1.0]
    assert _run_in_workspace(op, {"c": np.array([False]), "a": a, "b": b})["out"].tolist() == [2.0]
    no_else = CreateOperator("If", ["c", "a"], ["out"], then_net=then_net)
    kept = _run_in_workspace(no_else, {"c": np.array(False), "a": a, "out": b})
    assert kept["out"].tolist() == [2.0]


def test_while_reevaluates_the_condition_net() -> None:
    loop_net = _control_net("loop", "Add", ["acc", "step"], ["acc"])
    cond_net = caffe2_pb2.NetDef(name="cond")
    cond_net.op.extend([CreateOperator("Add", ["n", "one"], ["n"]),
                        CreateOperator("LT", ["n", "limit"], ["c"])])
    op = CreateOperator("While", ["c", "acc", "step", "n", "one", "limit"], ["acc", "n", "c"],
                        loop_net=loop_net, cond_net=cond_net)
    feeds = {"c": np.array(True), "acc": np.array(0), "step": np.array(3), "n": np.array(0),
             "one": np.array(1), "limit": np.array(4)}
    out = _run_in_workspace(op, feeds)
    assert (int(out["acc"]), int(out["n"]), bool(out["c"])) == (9, 4, False)


def test_control_flow_argument_errors() -> None:
    with pytest.raises(OperatorError, match="then_net"):
        _run_in_workspace(CreateOperator("If", ["c"], []), {"c": np.array(True)})
    loop_net = _control_net("loop", "Copy", ["x"], ["y"])
    with pytest.raises(OperatorError, match="one element"):
        _run_in_workspace(CreateOperator("While", ["c"], [], loop_net=loop_net),
                          {"c": np.array([True, False])})


def test_cast_to_string_formats_like_std_to_string() -> None:
    """Caffe2's Cast to STRING: std::to_string (decimal ints and bools, %f floats), bytes."""
    op = CreateOperator("Cast", ["x"], ["y"], to=caffe2_pb2.TensorProto.STRING)
    (floats,) = run_op(op, [np.array([[1.5, 2.0], [-3.25, 0.1]], np.float32)])
    assert floats.dtype == object and floats.shape == (2, 2)
    assert floats.tolist() == [[b"1.500000", b"2.000000"], [b"-3.250000", b"0.100000"]]
    assert run_op(op, [np.array([True, False])])[0].tolist() == [b"1", b"0"]
    assert run_op(op, [np.array(-7, np.int64)])[0].item() == b"-7"
