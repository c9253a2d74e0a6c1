"""Range and the Bitwise* ops (Caffe2's final release)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph.errors import ArgumentError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import build_gradient, run_op


@pytest.mark.parametrize("inputs, expected", [
    ([np.array(5, np.int32)], np.arange(5, dtype=np.int32)),
    ([np.array(2, np.int64), np.array(7, np.int64)], np.arange(2, 7, dtype=np.int64)),
    ([np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.25, np.float32)],
     np.arange(1.0, 2.0, 0.25, dtype=np.float32)),
    ([np.array(5, np.int32), np.array(0, np.int32), np.array(-2, np.int32)],
     np.array([5, 3, 1], np.int32)),
])
def test_range(inputs: list, expected: np.ndarray) -> None:
    names = ["a", "b", "c"][:len(inputs)]
    (y,) = run_op(CreateOperator("Range", names, ["y"]), inputs)
    assert y.dtype == expected.dtype
    np.testing.assert_allclose(y, expected)
    assert build_gradient(CreateOperator("Range", names, ["y"]), ["y_grad"])[0] == []


def test_range_refuses_zero_step_and_mixed_types() -> None:
    with pytest.raises(ArgumentError, match="non-zero"):
        run_op(CreateOperator("Range", ["a", "b", "c"], ["y"]),
               [np.array(0, np.int32), np.array(3, np.int32), np.array(0, np.int32)])
    with pytest.raises(ArgumentError, match="one type"):
        run_op(CreateOperator("Range", ["a", "b"], ["y"]),
               [np.array(0, np.int32), np.array(3, np.int64)])


@pytest.mark.parametrize("op_type, fn", [("BitwiseAnd", np.bitwise_and),
                                         ("BitwiseOr", np.bitwise_or),
                                         ("BitwiseXor", np.bitwise_xor)])
def test_bitwise(op_type: str, fn: np.ufunc) -> None:
    a = np.array([[1, 2, 7], [8, 5, 3]], np.int32)
    b = np.array([3, 6, 1], np.int32)
    (c,) = run_op(CreateOperator(op_type, ["A", "B"], ["C"], broadcast=1), [a, b])
    np.testing.assert_array_equal(c, fn(a, b))
    with pytest.raises(ArgumentError, match="bool or integer"):
        run_op(CreateOperator(op_type, ["A", "B"], ["C"]), [a.astype(np.float32), a])
