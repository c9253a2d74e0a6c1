"""SparseToDenseMask: dense columns from (id, value) features, presence mask, the per-instance
skipped-row limit, typed errors, and its gradient against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import ArgumentError, ShapeError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import build_gradient, check_gradient, run_op

INDICES = np.array([2, 4, 6, 1, 2, 999999999, 2], dtype=np.int32)
VALUES = np.arange(1, 8, dtype=np.float32)
LENGTHS = np.array([3, 4], dtype=np.int32)


def _mask_op(*inputs: str, outputs: tuple[str, ...] = ("out",), **args: object):
    return CreateOperator("SparseToDenseMask", list(inputs), list(outputs), **args)


def test_rows_columns_and_last_repeated_id_wins() -> None:
    op = _mask_op("i", "v", "d", "l", mask=[999999999, 2, 6])
    (out,) = run_op(op, [INDICES, VALUES, np.float32(-1), LENGTHS])
    np.testing.assert_array_equal(out, [[-1, 1, 3], [6, 7, -1]])


def test_without_lengths_one_row_and_no_row_dimension() -> None:
    op = _mask_op("i", "v", "d", mask=[1, 2, 6])
    (out,) = run_op(op, [np.array([2, 4, 6]), np.array([1., 2., 3.]), np.float64(-1)])
    np.testing.assert_array_equal(out, [-1, 1, 3])


def test_value_blocks_and_presence_mask() -> None:
    values = np.array([[[1, -1]], [[2, -2]], [[3, -3]], [[4, -4]], [[5, -5]]], np.float32)
    op = _mask_op("i", "v", "d", "l", outputs=("out", "present"), mask=[999999999, 2, 888, 6],
                  return_presence_mask=True)
    out, present = run_op(op, [np.array([2, 4, 6, 999999999, 2], np.int64), values,
                               np.array([[-1, 0]], np.float32), np.array([2, 3], np.int32)])
    assert out.shape == (2, 4, 1, 2)
    np.testing.assert_array_equal(out[1, :, 0], [[4, -4], [5, -5], [-1, 0], [3, -3]])
    np.testing.assert_array_equal(present, [[False, True, False, False],
                                            [True, True, False, True]])


def test_strings_keep_their_dtype() -> None:
    op = _mask_op("i", "v", "d", "l", mask=[999999999, 2, 6])
    values = np.array([str(v) for v in range(1, 8)], dtype=object)
    (out,) = run_op(op, [INDICES, values, np.array("-1", dtype=object), LENGTHS])
    assert out.tolist() == [["-1", "1", "3"], ["6", "7", "-1"]]


def test_skipped_rows_are_counted_over_the_instances_runs() -> None:
    workspace.ResetWorkspace()
    op = core.CreateOperator("SparseToDenseMask", ["i", "v", "d", "l"], ["out"],
                             mask=[999999999, 2], max_skipped_indices=3)
    workspace.FeedBlob("i", np.array([-1, 1, 2, 3, 4, 5], np.int32))
    workspace.FeedBlob("v", np.arange(6, dtype=np.float32))
    workspace.FeedBlob("d", np.float32(-1))
    workspace.FeedBlob("l", np.array([6], np.int32))
    workspace.RunOperatorMultiple(op, 2)  # two skipped rows: under the limit
    np.testing.assert_array_equal(workspace.FetchBlob("out"), [[-1, 2]])
    with pytest.raises(RuntimeError, match="max_skipped_indices=3"):
        workspace.RunOperatorMultiple(op, 3)
    workspace.ResetWorkspace()


@pytest.mark.parametrize("args, inputs, error, text", [
    ({"mask": []}, None, ArgumentError, "non-empty 'mask'"),
    ({"mask": [1, 1]}, None, ArgumentError, "appears twice"),
    ({"mask": [-2]}, None, ArgumentError, ">= 0"),
    ({"mask": [1]}, [INDICES, VALUES[:3], np.float32(0), LENGTHS], ShapeError, "one row per"),
    ({"mask": [1]}, [INDICES, VALUES, np.zeros(2, np.float32), LENGTHS], ShapeError,
     "DEFAULT"),
    ({"mask": [1]}, [INDICES, VALUES, np.float32(0), np.array([3, 3], np.int32)], ShapeError,
     "sum to 6"),
])
def test_bad_input_is_a_typed_error(args, inputs, error, text) -> None:
    op = _mask_op("i", "v", "d", "l", **args)
    inputs = inputs or [INDICES, VALUES, np.float32(0), LENGTHS]
    with pytest.raises(error, match=text):
        run_op(op, inputs)


def test_gradient_wiring_and_numeric_gradient() -> None:
    op = _mask_op("i", "v", "d", "l", mask=[999999999, 2, 6])
    ops, _ = build_gradient(op, ["out_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("SparseToDenseMaskGradient", ["i", "out_grad", "l"], ["v_grad"])]
    values = np.random.default_rng(0).standard_normal((7, 2))
    check_gradient(op, [INDICES, values, np.zeros(2), LENGTHS], inputs_to_check=[1])
    no_lengths = _mask_op("i", "v", "d", mask=[2, 4])
    check_gradient(no_lengths, [np.array([2, 4, 2, 7]), np.arange(4.0), np.float64(0)],
                   inputs_to_check=[1])
