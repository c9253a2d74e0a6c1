"""Loss ops: numpy references, gradient-op structure and finite-difference gradient checks."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(7)


def softmax(x: np.ndarray, axis: int = 1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def grad_ops(op_type: str, inputs: list[str], outputs: list[str], g_out: list, **kw: object):
    return build_gradient(make_op(op_type, inputs, outputs, **kw), g_out)


# --- SoftmaxWithLoss -------------------------------------------------------------------------
def test_softmax_with_loss_matches_reference() -> None:
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    label = np.array([0, 3, 1, 2, 3], np.int32)
    op = make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"])
    p, loss = run_op(op, [x, label])
    ref = softmax(x)
    assert p.dtype == np.float32 and loss.shape == () and loss.dtype == np.float32
    np.testing.assert_allclose(p, ref, rtol=1e-5)
    np.testing.assert_allclose(loss, -np.log(ref[np.arange(5), label]).mean(), rtol=1e-5)


def test_softmax_with_loss_weights_scale_and_label_prob() -> None:
    x = RNG.standard_normal((3, 4))
    label = np.array([1, 0, 2], np.int32)
    w = np.array([0.5, 2.0, 1.0])
    op = make_op("SoftmaxWithLoss", ["X", "label", "w"], ["P", "loss"], scale=3.0)
    _, loss = run_op(op, [x, label, w])
    per = -np.log(softmax(x)[np.arange(3), label])
    np.testing.assert_allclose(loss, 3.0 * (per * w).sum() / w.sum(), rtol=1e-6)
    probs = softmax(RNG.standard_normal((3, 4)))
    op = make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"], label_prob=1)
    _, loss = run_op(op, [x, probs])
    np.testing.assert_allclose(loss, -(probs * np.log(softmax(x))).sum() / 3, rtol=1e-6)


def test_softmax_with_loss_axis_flattens() -> None:
    x = RNG.standard_normal((2, 3, 4))
    op = make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"], axis=2)
    p, _ = run_op(op, [x, np.zeros(6, np.int32)])
    np.testing.assert_allclose(p, softmax(x, axis=2), rtol=1e-6)


def test_softmax_with_loss_gradient_op_and_values() -> None:
    ops, g_in = grad_ops("SoftmaxWithLoss", ["X", "label", "w"], ["P", "loss"],
                         [None, "loss_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("SoftmaxWithLossGradient", ["X", "label", "w", "P", "loss_grad"], ["X_grad"])]
    assert g_in == ["X_grad", None, None]
    x = RNG.standard_normal((4, 3))
    label = np.array([0, 2, 1, 1], np.int32)
    for op in (make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"], scale=2.0),
               make_op("SoftmaxWithLoss", ["X", "label", "w"], ["P", "loss"])):
        inputs = [x, label] + ([RNG.uniform(0.5, 2, 4)] if len(op.input) == 3 else [])
        check_gradient(op, inputs, inputs_to_check=[0], outputs_with_grads=(1,))
    probs = softmax(RNG.standard_normal((4, 3)))
    check_gradient(make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"], label_prob=1),
                   [x, probs], inputs_to_check=[0], outputs_with_grads=(1,))


def test_softmax_with_loss_rejects_bad_labels() -> None:
    op = make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"])
    with pytest.raises(ShapeError, match="labels"):
        run_op(op, [np.zeros((2, 3), np.float32), np.array([0, 3], np.int32)])


# --- SpatialSoftmaxWithLoss ------------------------------------------------------------------
def spatial_reference(x: np.ndarray, label: np.ndarray, w: np.ndarray) -> float:
    p = softmax(x, axis=1)
    total, loss = 0.0, 0.0
    for n, h, k in np.ndindex(*label.shape):
        if label[n, h, k] >= 0:
            total += w[n, h, k]
            loss -= np.log(p[n, label[n, h, k], h, k]) * w[n, h, k]
    return loss / total


def test_spatial_softmax_with_loss_ignores_dont_care() -> None:
    x = RNG.standard_normal((2, 3, 2, 3))
    label = RNG.integers(-1, 3, (2, 2, 3)).astype(np.int32)
    label[0, 0, 0] = 1
    w = RNG.uniform(0.5, 1.5, label.shape)
    op = make_op("SpatialSoftmaxWithLoss", ["X", "label", "w"], ["P", "loss"])
    p, loss = run_op(op, [x, label, w])
    np.testing.assert_allclose(p, softmax(x, axis=1), rtol=1e-6)
    np.testing.assert_allclose(loss, spatial_reference(x, label, w), rtol=1e-6)
    check_gradient(op, [x, label, w], inputs_to_check=[0], outputs_with_grads=(1,))
    op2 = make_op("SpatialSoftmaxWithLoss", ["X", "label"], ["P", "loss"])
    check_gradient(op2, [x, label], inputs_to_check=[0], outputs_with_grads=(1,))


# --- cross entropies -------------------------------------------------------------------------
def test_label_cross_entropy_and_gradient() -> None:
    p = RNG.uniform(0.1, 1, (4, 5))
    label = np.array([4, 0, 2, 2], np.int32)
    op = make_op("LabelCrossEntropy", ["P", "label"], ["Y"])
    (y,) = run_op(op, [p, label])
    np.testing.assert_allclose(y, -np.log(p[np.arange(4), label]))
    (y0,) = run_op(op, [np.zeros((1, 2), np.float32), np.array([1], np.int32)])
    np.testing.assert_allclose(y0, [-np.log(np.float32(1e-20))], rtol=1e-5)
    ops, _ = grad_ops("LabelCrossEntropy", ["P", "label"], ["Y"], ["Y_grad"])
    assert (ops[0].type, list(ops[0].input)) == ("LabelCrossEntropyGradient",
                                                 ["P", "label", "Y_grad"])
    check_gradient(op, [p, label], inputs_to_check=[0])


def test_cross_entropy_and_gradient() -> None:
    p = RNG.uniform(0.1, 1, (3, 4))
    label = softmax(RNG.standard_normal((3, 4)))
    op = make_op("CrossEntropy", ["P", "label"], ["Y"])
    (y,) = run_op(op, [p, label])
    np.testing.assert_allclose(y, -(label * np.log(p)).sum(axis=1))
    check_gradient(op, [p, label], inputs_to_check=[0])


def test_make_two_class_and_gradient() -> None:
    x = RNG.uniform(0, 1, (3, 2))
    op = make_op("MakeTwoClass", ["X"], ["Y"])
    (y,) = run_op(op, [x])
    np.testing.assert_allclose(y, np.stack([1 - x, x], axis=-1))
    check_gradient(op, [x])


# --- distances, averages, accuracy -----------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 3), (5,), (2, 3, 2)])
def test_squared_l2_distance_and_gradient(shape: tuple[int, ...]) -> None:
    x, y = RNG.standard_normal(shape), RNG.standard_normal(shape)
    op = make_op("SquaredL2Distance", ["X", "Y"], ["D"])
    (d,) = run_op(op, [x, y])
    np.testing.assert_allclose(d, 0.5 * ((x - y) ** 2).reshape(shape[0], -1).sum(axis=1))
    ops, g_in = grad_ops("SquaredL2Distance", ["X", "Y"], ["D"], ["D_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("SquaredL2DistanceGradient", ["X", "Y", "D_grad"], ["X_grad", "Y_grad"])]
    check_gradient(op, [x, y])


def test_averaged_loss_is_scalar_and_gradient() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    op = make_op("AveragedLoss", ["X"], ["L"])
    (loss,) = run_op(op, [x])
    assert loss.shape == () and loss.dtype == np.float32
    np.testing.assert_allclose(loss, x.mean(), rtol=1e-6)
    ops, _ = grad_ops("AveragedLoss", ["X"], ["L"], ["L_grad"])
    assert (ops[0].type, list(ops[0].input)) == ("AveragedLossGradient", ["X", "L_grad"])
    (dx,) = run_op(ops[0], [x, np.float32(6.0)])
    np.testing.assert_allclose(dx, np.full((3, 4), 0.5, np.float32))
    check_gradient(op, [x.astype(np.float64)])


def test_accuracy_top_k_with_ties() -> None:
    pred = np.array([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4], [0.6, 0.3, 0.1]],
                    np.float32)
    label = np.array([1, 1, 0, 2], np.int32)
    (top1,) = run_op(make_op("Accuracy", ["P", "label"], ["acc"]), [pred, label])
    assert top1.shape == () and top1.dtype == np.float32
    assert float(top1) == pytest.approx(0.25)  # the tie in row 1 goes to the lower column
    (top2,) = run_op(make_op("Accuracy", ["P", "label"], ["acc"], top_k=2), [pred, label])
    assert float(top2) == pytest.approx(0.75)


def test_dot_product_and_gradient() -> None:
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    op = make_op("DotProduct", ["X", "Y"], ["D"])
    (d,) = run_op(op, [x, y])
    np.testing.assert_allclose(d, (x * y).sum(axis=1))
    check_gradient(op, [x, y])


# --- criteria --------------------------------------------------------------------------------
def test_cosine_embedding_criterion_and_gradient() -> None:
    s = np.array([0.9, -0.6, 0.4, 0.25])
    y = np.array([1, -1, -1, 1], np.int32)
    op = make_op("CosineEmbeddingCriterion", ["S", "Y"], ["out"], margin=0.1)
    (out,) = run_op(op, [s, y])
    np.testing.assert_allclose(out, [0.1, 0.0, 0.3, 0.75])
    check_gradient(op, [s, y], inputs_to_check=[0])


def test_margin_ranking_criterion_and_gradient() -> None:
    x1, x2 = np.array([1.0, 0.2, -0.5, 2.0]), np.array([0.3, 1.0, 0.5, -1.0])
    y = np.array([1, 1, -1, -1], np.int32)
    op = make_op("MarginRankingCriterion", ["X1", "X2", "Y"], ["loss"], margin=0.2)
    (loss,) = run_op(op, [x1, x2, y])
    np.testing.assert_allclose(loss, np.maximum(0, -y * (x1 - x2) + 0.2))
    check_gradient(op, [x1, x2, y], inputs_to_check=[0, 1])


def test_bernoulli_jsd_and_gradient() -> None:
    p, q = RNG.uniform(0.1, 0.9, 6), RNG.uniform(0.1, 0.9, 6)
    op = make_op("BernoulliJSD", ["p", "q"], ["l"])
    (loss,) = run_op(op, [p, q])
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a * np.log(a / b) + (1 - a) * np.log((1 - a) / (1 - b))

    np.testing.assert_allclose(loss, (kl(p, m) + kl(q, m)) / 2, rtol=1e-6)
    ops, _ = grad_ops("BernoulliJSD", ["p", "q"], ["l"], ["l_grad"])
    assert list(ops[0].input) == ["l_grad", "p", "q"]
    check_gradient(op, [p, q], inputs_to_check=[0])


def test_pair_wise_loss_groups_and_gradient() -> None:
    x = RNG.standard_normal(7)
    label = np.array([1.0, 0.0, 2.0, 2.0, 0.0, 1.0, 1.0])
    lengths = np.array([4, 0, 3], np.int32)
    op = make_op("PairWiseLoss", ["X", "label", "lengths"], ["out"])
    (out,) = run_op(op, [x, label, lengths])
    want = []
    for lo, hi in ((0, 4), (4, 4), (4, 7)):
        terms = [np.log1p(np.exp(-np.sign(label[i] - label[j]) * (x[i] - x[j])))
                 for i in range(lo, hi) for j in range(lo, hi) if label[i] != label[j]]
        want.append(np.mean(terms) if terms else 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    ops, _ = grad_ops("PairWiseLoss", ["X", "label", "lengths"], ["out"], ["out_grad"])
    assert list(ops[0].input) == ["X", "label", "out_grad", "lengths"]
    check_gradient(op, [x, label, lengths], inputs_to_check=[0])
    single = make_op("PairWiseLoss", ["X", "label"], ["out"])
    assert run_op(single, [x, label])[0].shape == (1,)
    check_gradient(single, [x, label], inputs_to_check=[0])


def test_label_cross_entropy_one_dimensional_input_is_one_row() -> None:
    p = np.array([0.2, 0.5, 0.3])
    (y,) = run_op(make_op("LabelCrossEntropy", ["P", "label"], ["Y"]), [p, np.array([1])])
    np.testing.assert_allclose(y, [-np.log(0.5)])
