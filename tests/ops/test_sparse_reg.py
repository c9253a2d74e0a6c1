"""Sparse dropout with replacement, SparseLpRegularizer, SparseNormalize and the weighted
segment sums: numpy references written from the op descriptions, gradient checks."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(3)


def _run(op_type: str, inputs: list, outputs: int = 1, names: list | None = None,
         **args) -> list:
    names = names or [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(outputs)]
    return run_op(CreateOperator(op_type, names, outs, **args), inputs)


def test_sparse_dropout_with_replacement_segments() -> None:
    x = np.arange(1, 8, dtype=np.int64)
    lengths = np.array([2, 0, 3, 2], np.int32)
    y, ly = _run("SparseDropoutWithReplacement", [x, lengths], 2, ratio=0.0)
    assert y.tolist() == x.tolist() and ly.tolist() == lengths.tolist() and ly.dtype == np.int32
    y, ly = _run("SparseDropoutWithReplacement", [x, lengths], 2, ratio=1.0,
                 replacement_value=-5)
    assert y.tolist() == [-5] * 4 and ly.tolist() == [1] * 4
    y, ly = _run("SparseDropoutWithReplacement", [x, lengths], 2, ratio=0.5, replacement_value=0)
    # each segment is either intact or a single 0
    pieces = np.split(y, np.cumsum(ly)[:-1])
    originals = np.split(x, np.cumsum(lengths)[:-1])
    assert all(p.tolist() in (o.tolist(), [0]) for p, o in zip(pieces, originals))
    with pytest.raises(Exception, match="sum to"):
        _run("SparseDropoutWithReplacement", [x, np.array([1], np.int32)], 2)
    with pytest.raises(Exception, match="probability"):
        _run("SparseDropoutWithReplacement", [x, lengths], 2, ratio=1.5)


def test_sparse_itemwise_dropout_keeps_lengths() -> None:
    x = np.arange(1, 11, dtype=np.int64)
    lengths = np.array([5, 5], np.int32)
    y, ly = _run("SparseItemwiseDropoutWithReplacement", [x, lengths], 2, ratio=1.0,
                 replacement_value=-1)
    assert y.tolist() == [-1] * 10 and ly.tolist() == [5, 5]
    y, _ = _run("SparseItemwiseDropoutWithReplacement", [x, lengths], 2, ratio=0.5,
                replacement_value=-1)
    assert all(v in (orig, -1) for v, orig in zip(y.tolist(), x.tolist()))
    y, ly = _run("SparseItemwiseDropoutWithReplacement",
                 [np.zeros(0, np.int64), np.array([0], np.int32)], 2, ratio=1.0)
    assert y.size == 0 and ly.tolist() == [0]


def test_sparse_lp_regularizer_l1_l2_and_repeats() -> None:
    param = np.array([[0.5, -0.05], [0.2, -0.3], [1.0, 1.0]], np.float32)
    (l2,) = _run("SparseLpRegularizer", [param, np.array([0, 2])], names=["p", "i"], p=2.0,
                 reg_lambda=0.1)
    np.testing.assert_allclose(l2, [[0.45, -0.045], [0.2, -0.3], [0.9, 0.9]], rtol=1e-6)
    (l1,) = _run("SparseLpRegularizer", [param, np.array([0, 1, 1])], names=["p", "i"], p=1.0,
                 reg_lambda=0.1)
    # row 1 is shrunk twice, as Caffe2's loop does
    np.testing.assert_allclose(l1, [[0.4, 0.0], [0.0, -0.1], [1.0, 1.0]], atol=1e-6)
    with pytest.raises(Exception, match="p must be"):
        _run("SparseLpRegularizer", [param, np.array([0])], p=3.0)
    with pytest.raises(Exception, match="reg_lambda"):
        _run("SparseLpRegularizer", [param, np.array([0])], reg_lambda=1.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sparse_normalize_max_norm_and_constant_norm(dtype: type) -> None:
    op_type = "SparseNormalize" if dtype == np.float32 else "Float16SparseNormalize"
    param = np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]], dtype)
    idx = np.array([0, 1], np.int64)
    (capped,) = _run(op_type, [param, idx], names=["p", "i"], norm=2.0)
    np.testing.assert_allclose(capped, [[1.2, 1.6], [0.3, 0.4], [6.0, 8.0]], rtol=2e-3)
    assert capped.dtype == dtype
    (fixed,) = _run(op_type, [param, idx, param[idx]], names=["p", "i", "g"], norm=2.0,
                    use_max_norm=0)
    np.testing.assert_allclose(fixed, [[1.2, 1.6], [1.2, 1.6], [6.0, 8.0]], rtol=2e-3)
    with pytest.raises(Exception, match="must be"):
        _run(op_type, [param.astype(np.float64), idx], names=["p", "i"])


def test_segment_weighted_sums_reference_and_gradients() -> None:
    data = RNG.standard_normal((6, 3))
    w = RNG.standard_normal(4)
    idx = np.array([5, 0, 5, 2], np.int64)
    seg = np.array([2, 0, 2, 1], np.int32)
    ref = np.zeros((4, 3))
    for i in range(4):
        ref[seg[i]] += w[i] * data[idx[i]]
    (out,) = _run("SparseUnsortedSegmentWeightedSum", [data, w, idx, seg], num_segments=4)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    (dense,) = _run("UnsortedSegmentWeightedSum", [data[idx], w, seg])
    np.testing.assert_allclose(dense, ref[:3], rtol=1e-12)
    sorted_seg = np.array([0, 0, 1, 3], np.int32)
    (srt,) = _run("SortedSegmentWeightedSum", [data[:4], w, sorted_seg])
    assert srt.shape == (4, 3)
    np.testing.assert_allclose(srt[0], w[0] * data[0] + w[1] * data[1], rtol=1e-12)
    with pytest.raises(Exception, match="sorted"):
        _run("SortedSegmentWeightedSum", [data[:4], w, seg])
    op = CreateOperator("SparseUnsortedSegmentWeightedSum", ["D", "W", "I", "S"], ["Y"],
                        num_segments=4)
    ops, grads = build_gradient(op, ["Y_grad"])
    assert [o.type for o in ops] == ["UnsortedSegmentWeightedSumGradient"]
    assert list(ops[0].input) == ["W", "Y_grad", "S"]
    assert isinstance(grads[0], GradientSlice) and str(grads[0].indices) == "I"
    check_gradient(op, [data, w, idx, seg], inputs_to_check=[0])
    check_gradient(CreateOperator("UnsortedSegmentWeightedSum", ["D", "W", "S"], ["Y"]),
                   [data[:4], w, seg], inputs_to_check=[0])
    with pytest.raises(Exception, match="grad_on_weights"):
        build_gradient(CreateOperator("UnsortedSegmentWeightedSum", ["D", "W", "S"], ["Y"],
                                      grad_on_weights=1), ["Y_grad"])
