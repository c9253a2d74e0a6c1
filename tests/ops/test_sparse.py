"""Sparse and segment ops: references, sparse gradients (GradientSlice) and gradient checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import OperatorError, ShapeError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(11)


def summary(ops: list) -> list[tuple]:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


# --- gathers ---------------------------------------------------------------------------------
def test_gather_rows_and_sparse_gradient() -> None:
    data = RNG.standard_normal((5, 3))
    idx = np.array([[4, 0], [4, 2]], np.int32)
    op = make_op("Gather", ["D", "I"], ["Y"])
    (y,) = run_op(op, [data, idx])
    np.testing.assert_array_equal(y, data[idx])
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert ops == [] and g_in == [GradientSlice("I", "Y_grad"), None]
    check_gradient(op, [data, idx], inputs_to_check=[0])
    (empty,) = run_op(op, [data.astype(np.float32), np.zeros(0, np.int64)])
    assert empty.shape == (0, 3) and empty.dtype == np.float32
    with pytest.raises(ShapeError, match="indices"):
        run_op(op, [data, np.array([5])])


def test_gather_axis_and_dense_gradient_variants() -> None:
    data = RNG.standard_normal((2, 4, 3))
    idx = np.array([3, 1, 3])
    op = make_op("Gather", ["D", "I"], ["Y"], axis=1)
    (y,) = run_op(op, [data, idx])
    np.testing.assert_array_equal(y, data[:, idx])
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("BatchGatherGradient", ["D", "I", "Y_grad"], ["D_grad"])]
    check_gradient(op, [data, idx], inputs_to_check=[0])
    dense = make_op("Gather", ["D", "I"], ["Y"], dense_gradient=1)
    ops, _ = build_gradient(dense, ["Y_grad"])
    assert summary(ops) == [("SparseToDense", ["I", "Y_grad", "D"], ["D_grad"])]
    check_gradient(dense, [data[0], idx], inputs_to_check=[0])


def test_batch_gather_and_gradient() -> None:
    data = RNG.standard_normal((3, 4, 2))
    idx = np.array([[0, 3], [3, 3]], np.int64)
    op = make_op("BatchGather", ["D", "I"], ["Y"])
    (y,) = run_op(op, [data, idx])
    assert y.shape == (3, 2, 2, 2)
    np.testing.assert_array_equal(y, data[:, idx])
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("BatchGatherGradient", ["D", "I", "Y_grad"], ["D_grad"])]
    check_gradient(op, [data, idx], inputs_to_check=[0])


# --- scatter / unique ------------------------------------------------------------------------
def test_scatter_assign_in_place_and_copy() -> None:
    data = RNG.standard_normal((4, 2)).astype(np.float16)
    slices = RNG.standard_normal((2, 2)).astype(np.float16)
    op = make_op("ScatterAssign", ["D", "I", "S"], ["D"])
    buffer = data.copy()
    (out,) = run_op(op, [buffer, np.array([3, 1], np.int32), slices])
    want = data.copy()
    want[[3, 1]] = slices
    np.testing.assert_array_equal(out, want)
    assert out is buffer and out.dtype == np.float16
    (copy,) = run_op(make_op("ScatterAssign", ["D", "I", "S"], ["Y"]),
                     [data, np.array([0, 2], np.int32), slices])
    assert copy is not data and not np.array_equal(copy, data)


def test_unique_with_remapping() -> None:
    x = np.array([5, 2, 5, 9, 2, 2], np.int64)
    uniq, remap = run_op(make_op("Unique", ["X"], ["U", "R"]), [x])
    np.testing.assert_array_equal(uniq[remap], x)
    assert sorted(set(x.tolist())) == uniq.tolist() and uniq.dtype == np.int64
    (empty,) = run_op(make_op("Unique", ["X"], ["U"]), [np.zeros(0, np.int32)])
    assert empty.shape == (0,) and empty.dtype == np.int32


# --- lengths reductions ----------------------------------------------------------------------
def segments(rows: np.ndarray, lengths: np.ndarray, mean: bool) -> np.ndarray:
    out, start = [], 0
    for n in lengths:
        part = rows[start:start + n]
        total = part.sum(axis=0) if n else np.zeros(rows.shape[1:])
        out.append(total / n if mean and n else total)
        start += n
    return np.array(out).reshape(len(lengths), *rows.shape[1:])


@pytest.mark.parametrize("mean", [False, True])
def test_sparse_lengths_sum_mean_and_gradients(mean: bool) -> None:
    op_type = "SparseLengthsMean" if mean else "SparseLengthsSum"
    data = RNG.standard_normal((6, 2))
    idx = np.array([5, 0, 5, 2, 1], np.int64)
    lengths = np.array([2, 0, 3], np.int32)
    op = make_op(op_type, ["D", "I", "L"], ["Y"])
    (y,) = run_op(op, [data, idx, lengths])
    np.testing.assert_allclose(y, segments(data[idx], lengths, mean))
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [(op_type + "Gradient", ["Y_grad", "L"], ["D_grad_values"])]
    assert g_in == [GradientSlice("I", "D_grad_values"), None, None]
    check_gradient(op, [data, idx, lengths], inputs_to_check=[0])


def test_sparse_lengths_weighted_sum_and_gradient() -> None:
    data, w = RNG.standard_normal((4, 3)), RNG.standard_normal(5)
    idx, lengths = np.array([3, 3, 0, 1, 2]), np.array([1, 4], np.int32)
    op = make_op("SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"])
    (y,) = run_op(op, [data, w, idx, lengths])
    np.testing.assert_allclose(y, segments(data[idx] * w[:, None], lengths, False))
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("SparseLengthsWeightedSumGradient", ["W", "Y_grad", "L"],
                             ["D_grad_values"])]
    assert g_in[0] == GradientSlice("I", "D_grad_values")
    check_gradient(op, [data, w, idx, lengths], inputs_to_check=[0])


def test_float16_lengths_sum_gives_float32() -> None:
    data = RNG.standard_normal((3, 2)).astype(np.float16)
    (y,) = run_op(make_op("SparseLengthsSum", ["D", "I", "L"], ["Y"]),
                  [data, np.array([0, 2]), np.array([2], np.int32)])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, data[[0, 2]].astype(np.float32).sum(0, keepdims=True))


@pytest.mark.parametrize("op_type,mean,weighted", [
    ("LengthsSum", False, False), ("LengthsMean", True, False),
    ("LengthsWeightedSum", False, True)])
def test_dense_lengths_ops_and_gradients(op_type: str, mean: bool, weighted: bool) -> None:
    data, w = RNG.standard_normal((5, 2)), RNG.standard_normal(5)
    lengths = np.array([3, 0, 2], np.int32)
    inputs = [data, w, lengths] if weighted else [data, lengths]
    names = ["D", "W", "L"] if weighted else ["D", "L"]
    op = make_op(op_type, names, ["Y"])
    (y,) = run_op(op, inputs)
    rows = data * w[:, None] if weighted else data
    np.testing.assert_allclose(y, segments(rows, lengths, mean))
    ops, _ = build_gradient(op, ["Y_grad"])
    expected_in = ["W", "Y_grad", "L"] if weighted else ["Y_grad", "L"]
    assert summary(ops) == [(op_type + "Gradient", expected_in, ["D_grad"])]
    check_gradient(op, inputs, inputs_to_check=[0])
    with pytest.raises(ShapeError, match="lengths sum"):
        run_op(op, [data, w, np.array([1], np.int32)] if weighted else [data, lengths[:1]])


# --- segment reductions ----------------------------------------------------------------------
@pytest.mark.parametrize("op_type", ["UnsortedSegmentSum", "UnsortedSegmentMean",
                                     "SortedSegmentSum", "SortedSegmentMean"])
def test_segment_reductions_and_gradients(op_type: str) -> None:
    data = RNG.standard_normal((6, 2))
    ids = np.array([0, 0, 1, 3, 3, 3] if op_type.startswith("Sorted") else [3, 0, 3, 1, 0, 3])
    op = make_op(op_type, ["D", "S"], ["Y"])
    (y,) = run_op(op, [data, ids])
    want = np.zeros((4, 2))
    for i, s in enumerate(ids):
        want[s] += data[i]
    if op_type.endswith("Mean"):
        want /= np.maximum(np.bincount(ids, minlength=4), 1)[:, None]
    np.testing.assert_allclose(y, want)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [(op_type + "Gradient", ["Y_grad", "S"], ["D_grad"])]
    check_gradient(op, [data, ids], inputs_to_check=[0])


def test_unsorted_segment_sum_num_segments_and_sorted_check() -> None:
    data = np.ones((3, 1))
    op = make_op("UnsortedSegmentSum", ["D", "S"], ["Y"], num_segments=5)
    (y,) = run_op(op, [data, np.array([1, 1, 4])])
    np.testing.assert_array_equal(y.ravel(), [0, 2, 0, 0, 1])
    with pytest.raises(ShapeError, match="sorted"):
        run_op(make_op("SortedSegmentSum", ["D", "S"], ["Y"]), [data, np.array([1, 0, 2])])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=6))
def test_lengths_to_segment_ids_matches_repeat(lengths: list[int]) -> None:
    (ids,) = run_op(make_op("LengthsToSegmentIds", ["L"], ["S"]),
                    [np.array(lengths, np.int32)])
    assert ids.dtype == np.int32
    assert ids.tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]


# --- dense conversions, one-hots, masks ------------------------------------------------------
def test_sparse_to_dense_sums_and_gradient_is_gather() -> None:
    idx, values = np.array([2, 0, 2]), RNG.standard_normal((3, 2))
    op = make_op("SparseToDense", ["I", "V", "like"], ["Y"])
    (y,) = run_op(op, [idx, values, np.zeros((4, 7))])
    want = np.zeros((4, 2))
    np.add.at(want, idx, values)
    np.testing.assert_allclose(y, want)
    (inferred,) = run_op(make_op("SparseToDense", ["I", "V"], ["Y"]), [idx, values])
    assert inferred.shape == (3, 2)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("Gather", ["Y_grad", "I"], ["V_grad"])]
    check_gradient(op, [idx, values, np.zeros((4, 7))], inputs_to_check=[1])


def test_one_hot_family() -> None:
    (y,) = run_op(make_op("OneHot", ["I", "n"], ["Y"]), [np.array([2, 0]), np.array(3)])
    np.testing.assert_array_equal(y, [[0, 0, 1], [1, 0, 0]])
    assert y.dtype == np.float32
    (seg,) = run_op(make_op("SegmentOneHot", ["L", "I", "n"], ["Y"]),
                    [np.array([2, 0, 1], np.int32), np.array([0, 2, 1]), np.array(3)])
    np.testing.assert_array_equal(seg, [[1, 0, 1], [0, 0, 0], [0, 1, 0]])
    x = np.array([[1, 5], [2, 6]], np.int32)
    (b,) = run_op(make_op("BatchOneHot", ["X", "L", "V"], ["Y"]),
                  [x, np.array([2, 1], np.int32), np.array([2, 1, 6], np.int32)])
    np.testing.assert_array_equal(b, [[0, 1, 0], [1, 0, 1]])
    assert b.dtype == np.int32


def test_boolean_mask_and_gradient() -> None:
    data = RNG.standard_normal((4, 2))
    mask = np.array([True, False, True, True])
    op = make_op("BooleanMask", ["D", "M"], ["Y", "idx"])
    y, idx = run_op(op, [data, mask])
    np.testing.assert_array_equal(y, data[mask])
    assert idx.tolist() == [0, 2, 3]
    ops, _ = build_gradient(make_op("BooleanMask", ["D", "M"], ["Y"]), ["Y_grad"])
    assert summary(ops) == [("BooleanMaskGradient", ["M", "Y_grad"], ["D_grad"])]
    check_gradient(make_op("BooleanMask", ["D", "M"], ["Y"]), [data, mask], inputs_to_check=[0])


def test_sequence_mask_modes_and_gradient() -> None:
    x = RNG.standard_normal((3, 4))
    op = make_op("SequenceMask", ["X", "L"], ["Y"], mode="sequence", fill_val=-5.0)
    (y,) = run_op(op, [x, np.array([0, 2, 4], np.int32)])
    keep = np.arange(4)[None, :] < np.array([0, 2, 4])[:, None]
    np.testing.assert_array_equal(y, np.where(keep, x, -5.0))
    (upper,) = run_op(make_op("SequenceMask", ["X"], ["Y"], mode="upper", fill_val=0.0), [x])
    np.testing.assert_array_equal(upper, np.tril(x))
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("SequenceMask", ["Y_grad", "L"], ["X_grad"])]
    assert [a.name for a in ops[0].arg] == ["mode", "fill_val", "grad"]
    check_gradient(op, [x, np.array([1, 2, 3], np.int32)], inputs_to_check=[0])


def test_sequence_mask_batch_and_repeat_from_axis() -> None:
    x = RNG.standard_normal((2, 3, 4))
    lens = np.array([1, 4, 0], np.int32)
    batched = make_op("SequenceMask", ["X", "L"], ["Y"], mode="sequence", axis=2, batch=0,
                      fill_val=9.0)
    (y,) = run_op(batched, [x, lens])  # each of the 2 blocks masked as a 3 x 4 matrix
    keep = np.arange(4)[None, :] < lens[:, None]
    np.testing.assert_array_equal(y, np.where(keep[None], x, 9.0))
    (lower,) = run_op(make_op("SequenceMask", ["X"], ["Y"], mode="lower", axis=2, batch=0,
                              fill_val=0.0), [x])
    np.testing.assert_array_equal(lower, np.triu(x))
    repeated = make_op("SequenceMask", ["X", "L"], ["Y"], mode="sequence", axis=1,
                       repeat_from_axis=-1, fill_val=0.0)
    (r,) = run_op(repeated, [x, np.array([2, 0], np.int32)])  # rows of 3 x 4 blocks
    np.testing.assert_array_equal(r[0, :2], x[0, :2])
    assert not r[0, 2:].any() and not r[1].any()
    check_gradient(batched, [x, lens], inputs_to_check=[0])
    with pytest.raises((ShapeError, OperatorError), match="Out of bound"):
        run_op(batched, [x, lens[:2]])
    with pytest.raises((ShapeError, OperatorError), match="must come before axis"):
        run_op(make_op("SequenceMask", ["X", "L"], ["Y"], axis=1, batch=1), [x, lens])


def test_batch_bucket_one_hot() -> None:
    x = np.array([[0.5, 3.0], [2.0, -1.0], [1.0, 9.0]], np.float32)
    lens = np.array([2, 1], np.int32)
    bounds = np.array([1.0, 2.0, 0.0], np.float32)
    (y,) = run_op(make_op("BatchBucketOneHot", ["X", "L", "B"], ["Y"]), [x, lens, bounds])
    # feature 0 buckets: x <= 1, 1 < x <= 2, x > 2; feature 1: x <= 0, x > 0
    np.testing.assert_array_equal(y, [[1, 0, 0, 0, 1], [0, 1, 0, 1, 0], [1, 0, 0, 0, 1]])


def test_batch_sparse_to_dense_and_back() -> None:
    lengths = np.array([2, 0, 1], np.int64)
    idx = np.array([3, 0, 1], np.int64)
    values = RNG.standard_normal(3)
    op = make_op("BatchSparseToDense", ["L", "I", "V"], ["O"], dense_last_dim=4,
                 default_value=-1.0)
    (dense,) = run_op(op, [lengths, idx, values])
    want = np.full((3, 4), -1.0)
    want[0, 3], want[0, 0], want[2, 1] = values
    np.testing.assert_array_equal(dense, want)
    ops, _ = build_gradient(op, ["O_grad"])
    assert summary(ops) == [("BatchDenseToSparse", ["L", "I", "O_grad"], ["V_grad"])]
    check_gradient(op, [lengths, idx, values], inputs_to_check=[2])
    back = make_op("BatchDenseToSparse", ["L", "I", "D"], ["V"])
    np.testing.assert_array_equal(run_op(back, [lengths, idx, dense])[0], values)
    ops, _ = build_gradient(back, ["V_grad"])
    assert summary(ops) == [("BatchSparseToDense", ["L", "I", "V_grad", "D"], ["D_grad"])]
    check_gradient(back, [lengths, idx, dense], inputs_to_check=[2])


def test_shape_functions() -> None:
    from dpgraph.ir.registry import OPERATORS

    gather = make_op("Gather", ["D", "I"], ["Y"], axis=1)
    fn = OPERATORS.lookup("Gather").shape_fn
    assert fn(gather, [(2, 5, 3), (4,)], [1, 2]) == [((2, 4, 3), 1)]
    sls = OPERATORS.lookup("SparseLengthsWeightedSum").shape_fn
    op = make_op("SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"])
    assert sls(op, [(10, 4), (7,), (7,), (3,)], [12, 1, 10, 2]) == [((3, 4), 1)]


def test_sparse_lengths_weighted_sum_gradient_on_weights() -> None:
    data, w = RNG.standard_normal((4, 3)), RNG.standard_normal(5)
    idx, lengths = np.array([3, 3, 0, 1, 2]), np.array([1, 4], np.int32)
    op = make_op("SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"], grad_on_weights=1)
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("SparseLengthsWeightedSumWithMainInputGradient",
                             ["W", "Y_grad", "L", "D", "I"], ["D_grad_values", "W_grad"])]
    assert g_in[:2] == [GradientSlice("I", "D_grad_values"), "W_grad"]
    check_gradient(op, [data, w, idx, lengths], inputs_to_check=[0, 1])


@pytest.mark.parametrize("op_type", ["Gather", "BatchGather"])
def test_gather_match_outer_and_its_gradient(op_type: str) -> None:
    rng = np.random.default_rng(5)
    data = rng.standard_normal((2, 3, 4, 2))
    idx = rng.integers(0, 4, size=(2, 3, 5)).astype(np.int32)
    op = make_op(op_type, ["D", "I"], ["Y"], axis=2, match_outer=1)
    (y,) = run_op(op, [data, idx])
    expected = np.stack([np.stack([data[b, r, idx[b, r]] for r in range(3)]) for b in range(2)])
    np.testing.assert_array_equal(y, expected)
    check_gradient(op, [data, idx], inputs_to_check=[0])
    with pytest.raises(ShapeError, match="outer dims"):
        run_op(op, [data, idx[:1]])


def test_indices_in_gradient_forms_and_empty_weighted_main_input_gradient() -> None:
    dout = np.arange(6.0).reshape(3, 2)
    lengths = np.array([2, 0, 1], np.int32)
    indices = np.array([4, 1, 3], np.int64)
    (summed,) = run_op(make_op("SparseLengthsIndicesInGradientSumGradient",
                               ["dY", "L", "I"], ["dX"]), [dout, lengths, indices])
    np.testing.assert_array_equal(summed, [[0, 1], [0, 1], [4, 5]])
    (mean,) = run_op(make_op("SparseLengthsIndicesInGradientMeanGradient",
                             ["dY", "L", "I"], ["dX"]), [dout, lengths, indices])
    np.testing.assert_array_equal(mean, [[0, 0.5], [0, 0.5], [4, 5]])
    with pytest.raises(ShapeError, match="INDICES"):
        run_op(make_op("SparseLengthsIndicesInGradientSumGradient", ["dY", "L", "I"], ["dX"]),
               [dout, lengths, indices[:2]])
    empty = run_op(make_op("SparseLengthsWeightedSumWithMainInputGradient",
                           ["W", "dY", "L", "D", "I"], ["dV", "dW"]),
                   [np.zeros(0), np.zeros((2, 3)), np.zeros(2, np.int32), np.ones((4, 3)),
                    np.zeros(0, np.int64)])
    assert [e.shape for e in empty] == [(0, 3), (0,)]


@pytest.mark.parametrize("op_type", ["SparseSortedSegmentSum", "SparseSortedSegmentMean",
                                     "SparseUnsortedSegmentSum", "SparseUnsortedSegmentMean"])
def test_sparse_segment_ops_and_their_slice_gradients(op_type: str) -> None:
    rng = np.random.default_rng(3)
    data = rng.standard_normal((5, 2))
    indices = np.array([4, 0, 0, 2], np.int64)
    segments = np.array([0, 0, 1, 1] if "Sorted" in op_type and "Unsorted" not in op_type
                        else [1, 0, 1, 0], np.int32)
    op = make_op(op_type, ["D", "I", "S"], ["Y"])
    (y,) = run_op(op, [data, indices, segments])
    reduce = np.mean if op_type.endswith("Mean") else np.sum
    expected = [reduce(data[indices[segments == s]], axis=0) for s in range(2)]
    np.testing.assert_allclose(y, expected)
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert isinstance(g_in[0], GradientSlice) and g_in[0].indices == "I"
    assert ops[0].type == op_type + "Gradient" and list(ops[0].input) == ["Y_grad", "S"]


@pytest.mark.parametrize("kind", ["Sum", "Mean", "Max", "LogSumExp", "LogMeanExp"])
def test_sorted_segment_range_ops_and_gradients(kind: str) -> None:
    rng = np.random.default_rng(9)
    data = rng.standard_normal((5, 3))
    segments = np.array([0, 0, 1, 1, 1], np.int32)
    op = make_op(f"SortedSegmentRange{kind}", ["D", "S"], ["Y"])
    (y,) = run_op(op, [data, segments])
    reduce = {"Sum": np.sum, "Mean": np.mean, "Max": np.max,
              "LogSumExp": lambda a, axis: np.log(np.exp(a).sum(axis)),
              "LogMeanExp": lambda a, axis: np.log(np.exp(a).mean(axis))}[kind]
    np.testing.assert_allclose(y, [reduce(data[:2], axis=0), reduce(data[2:], axis=0)])
    check_gradient(op, [data, segments], inputs_to_check=[0])
    with pytest.raises(ShapeError, match="sorted"):
        run_op(op, [data, segments[::-1].copy()])


def test_sparse_lengths_positional_weighted_sum() -> None:
    data = np.arange(12.0).reshape(6, 2)
    weights = np.array([1.0, 10.0, 100.0])
    indices = np.array([5, 0, 1, 2], np.int64)
    lengths = np.array([3, 1], np.int32)
    (y,) = run_op(make_op("SparseLengthsPositionalWeightedSum", ["D", "W", "I", "L"], ["Y"]),
                  [data, weights, indices, lengths])
    np.testing.assert_allclose(y, [data[5] + 10 * data[0] + 100 * data[1], data[2]])
    with pytest.raises(ShapeError, match="positional weights"):
        run_op(make_op("SparseLengthsPositionalWeightedSum", ["D", "W", "I", "L"], ["Y"]),
               [data, weights[:2], indices, lengths])
