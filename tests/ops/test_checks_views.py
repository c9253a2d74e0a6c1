"""Assert, AliasWithName, EnsureClipped, PrependDim/MergeDim."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import OperatorError, ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op


def test_assert_passes_or_fails_with_the_message() -> None:
    assert list(run_op(make_op("Assert", ["X"], []), [np.array([1, 2], np.int32)])) == []
    with pytest.raises(OperatorError, match="labels must be set"):
        run_op(make_op("Assert", ["X"], [], error_msg="labels must be set"),
               [np.array([True, False])])


def test_alias_with_name_is_identity_and_marks_its_gradient() -> None:
    x = np.arange(3.0)
    op = make_op("AliasWithName", ["X"], ["Y"], name="feature")
    np.testing.assert_array_equal(run_op(op, [x])[0], x)
    ops, _ = build_gradient(op, ["Y_grad"])
    args = {a.name: (a.s or a.i) for a in ops[0].arg}
    assert ops[0].type == "AliasWithName" and args["is_backward"] == 1


def test_ensure_clipped_dense_and_sparse() -> None:
    param = np.array([[-1.0, 2.0], [-3.0, 4.0], [5.0, -6.0]], np.float32)
    (dense,) = run_op(make_op("EnsureClipped", ["P"], ["Q"], min=0.0), [param])
    assert dense.tolist() == [[0, 2], [0, 4], [5, 0]]
    (sparse,) = run_op(make_op("EnsureClipped", ["P", "I", "G"], ["P"], min=0.0, max=4.5),
                       [param.copy(), np.array([1, 2]), np.zeros((2, 2), np.float32)])
    assert sparse.tolist() == [[-1, 2], [0, 4], [4.5, 0]]
    with pytest.raises(ShapeError, match="in place"):
        run_op(make_op("EnsureClipped", ["P", "I", "G"], ["Q"], min=0.0),
               [param, np.array([1]), np.zeros((1, 2), np.float32)])


def test_prepend_dim_and_merge_dim() -> None:
    x = np.random.default_rng(0).standard_normal((8, 3))
    op = make_op("PrependDim", ["X"], ["Y"], dim_size=2)
    (y,) = run_op(op, [x])
    assert y.shape == (2, 4, 3)
    np.testing.assert_array_equal(run_op(make_op("MergeDim", ["Y"], ["Z"]), [y])[0], x)
    check_gradient(op, [x])
    with pytest.raises(ShapeError, match="divide"):
        run_op(make_op("PrependDim", ["X"], ["Y"], dim_size=3), [x])


def test_enforce_finite_and_bucketize() -> None:
    assert list(run_op(make_op("EnforceFinite", ["X"], []), [np.ones(3)])) == []
    with pytest.raises(OperatorError, match="inf at flat index 1"):
        run_op(make_op("EnforceFinite", ["X"], []), [np.array([1.0, np.inf])])
    x = np.array([-2.0, 0.0, 0.5, 3.0], np.float32)
    (idx,) = run_op(make_op("Bucketize", ["X"], ["I"], boundaries=[0.0, 1.0]), [x])
    np.testing.assert_array_equal(idx, np.digitize(x, [0.0, 1.0], right=True))
