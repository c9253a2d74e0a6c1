"""Lengths/segment-id conversions, Perplexity and MultiClassAccuracy, RowMul/ReduceTailSum,
Logit, ReplaceNaN and HasElements: numpy references, gradients, typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ShapeError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(11)
LENGTHS = np.array([2, 0, 3], dtype=np.int32)


def _run(op_type: str, inputs: list, outputs: int = 1, **args):
    names = [f"i{k}" for k in range(len(inputs))]
    op = CreateOperator(op_type, names, [f"o{k}" for k in range(outputs)], **args)
    return run_op(op, inputs)


def test_lengths_to_offsets_and_weights() -> None:
    (offsets,) = _run("LengthsToOffsets", [LENGTHS])
    assert offsets.dtype == np.int32 and offsets.tolist() == [0, 2, 2]
    (with_last,) = _run("LengthsToOffsets", [LENGTHS], include_last_offset=1)
    assert with_last.tolist() == [0, 2, 2, 5]
    (empty,) = _run("LengthsToOffsets", [LENGTHS[:0]], include_last_offset=1)
    assert empty.tolist() == [0]
    (weights,) = _run("LengthsToWeights", [LENGTHS], power=1.0)
    np.testing.assert_allclose(weights, [0.5, 0.5, 1 / 3, 1 / 3, 1 / 3], rtol=1e-6)
    with pytest.raises(ShapeError, match="non-negative"):
        _run("LengthsToOffsets", [np.array([1, -1], np.int32)])


def test_segment_ids_to_lengths_and_ranges() -> None:
    ids = np.array([0, 0, 2, 2, 2, 3], dtype=np.int32)
    (lengths,) = _run("SegmentIdsToLengths", [ids])
    assert lengths.dtype == np.int32 and lengths.tolist() == [2, 0, 3, 1]
    (padded,) = _run("SegmentIdsToLengths", [ids, np.zeros((6, 2))])
    assert padded.tolist() == [2, 0, 3, 1, 0, 0]
    (ranges,) = _run("SegmentIdsToRanges", [ids])
    assert ranges.tolist() == [[0, 2], [2, 0], [2, 3], [5, 1]]
    (none,) = _run("SegmentIdsToRanges", [ids[:0]])
    assert none.shape == (0, 2)
    with pytest.raises(ShapeError, match="sorted"):
        _run("SegmentIdsToLengths", [np.array([1, 0], np.int32)])
    with pytest.raises(ShapeError, match="out of range"):
        _run("SegmentIdsToLengths", [ids, np.zeros(2)])


def test_perplexity_and_multi_class_accuracy() -> None:
    p = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    (value,) = _run("Perplexity", [p])
    assert value.shape == () and value == pytest.approx(np.prod(p ** (-1 / 3)), rel=1e-6)
    prediction = np.array([[0.9, 0.1, 0], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0, 0, 1]],
                          dtype=np.float32)
    labels = np.array([0, 1, 1, 2], dtype=np.int32)
    accuracies, amounts = _run("MultiClassAccuracy", [prediction, labels], outputs=2)
    np.testing.assert_allclose(accuracies, [1.0, 0.5, 1.0])
    assert amounts.dtype == np.int32 and amounts.tolist() == [1, 2, 1]
    with pytest.raises(ShapeError, match="labels must be in"):
        _run("MultiClassAccuracy", [prediction, np.array([0, 1, 1, 3], np.int32)], outputs=2)


def test_row_mul_forward_and_gradient() -> None:
    x, w = RNG.standard_normal((4, 3)), RNG.standard_normal(4)
    op = CreateOperator("RowMul", ["X", "W"], ["Y"])
    (y,) = run_op(op, [x, w])
    np.testing.assert_allclose(y, x * w[:, None])
    ops, _ = build_gradient(op, ["Y_grad"])
    assert [o.type for o in ops] == ["RowMul", "Mul", "ReduceTailSum"]
    check_gradient(op, [x, w])
    with pytest.raises(ShapeError, match="one value per row"):
        run_op(op, [x, w[:2]])


def test_logit_and_its_gradient() -> None:
    x = np.array([0.0, 0.2, 0.5, 0.9, 1.0])
    (y,) = _run("Logit", [x], eps=0.01)
    clipped = np.clip(x, 0.01, 0.99)
    np.testing.assert_allclose(y, np.log(clipped / (1 - clipped)))
    op = CreateOperator("Logit", ["X"], ["Y"], eps=1e-3)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert [(o.type, list(o.input)) for o in ops] == [("LogitGradient", ["X", "Y_grad"])]
    check_gradient(op, [RNG.uniform(0.1, 0.9, size=(3, 2))])
    (dx,) = run_op(ops[0], [np.array([0.0, 0.5]), np.ones(2)])
    assert dx.tolist() == [0.0, 4.0]  # zero where X was clipped


def test_replace_nan_and_has_elements() -> None:
    (y,) = _run("ReplaceNaN", [np.array([1.0, np.nan, 3.0], np.float32)], value=-2.0)
    assert y.tolist() == [1.0, -2.0, 3.0] and y.dtype == np.float32
    (some,) = _run("HasElements", [np.zeros(0), np.zeros(2)])
    (none,) = _run("HasElements", [np.zeros(0), np.zeros((0, 3))])
    assert bool(some) and not bool(none)


@pytest.mark.parametrize("replicate", [0, 1])
def test_dot_product_with_padding(replicate: int) -> None:
    x, y = RNG.standard_normal((3, 2)), RNG.standard_normal((3, 4))
    op = CreateOperator("DotProductWithPadding", ["X", "Y"], ["Z"], pad_value=0.5,
                        replicate=replicate)
    (z,) = run_op(op, [x, y])
    wide = np.tile(x, (1, 2)) if replicate else np.concatenate([x, np.full((3, 2), 0.5)], 1)
    np.testing.assert_allclose(z, (wide * y).sum(axis=1))
    check_gradient(op, [x, y])
    check_gradient(op, [y, x])
    if replicate:
        with pytest.raises(ShapeError, match="multiple"):
            run_op(op, [x, RNG.standard_normal((3, 3))])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_space_to_batch_and_back(order: str) -> None:
    x = RNG.standard_normal((2, 3, 4, 2))  # NCHW
    data = x if order == "NCHW" else x.transpose(0, 2, 3, 1)
    to_batch = CreateOperator("SpaceToBatch", ["X"], ["Y"], pad=1, block_size=2, order=order)
    (y,) = run_op(to_batch, [data])
    y_nchw = y if order == "NCHW" else y.transpose(0, 3, 1, 2)
    assert y_nchw.shape == (8, 3, 3, 2)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    # image (oh * 2 + ow) * N + n holds padded[n, :, oh::2, ow::2]
    np.testing.assert_array_equal(y_nchw[(1 * 2 + 0) * 2 + 1], padded[1, :, 1::2, 0::2])
    back = CreateOperator("BatchToSpace", ["Y"], ["Z"], pad=1, block_size=2, order=order)
    (z,) = run_op(back, [y])
    np.testing.assert_array_equal(z, data)
    check_gradient(to_batch, [data])
    with pytest.raises(ShapeError, match="multiple of block_size"):
        run_op(to_batch, [RNG.standard_normal((1, 1, 3, 3))])
