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


# --- stability: logits up to +-1e4, float64 references ---------------------------------------
# Each loss and its gradient op run under numpy's strictest error state (overflow, divide and
# invalid raise; RuntimeWarnings are errors) and must equal a float64 reference written from
# the loss's definition (with Caffe2's clamps where Caffe2 clamps: log(max(p, FLT_MIN)) in the
# focal losses).  Underflow (exp(-1e4) -> 0) is exact rounding, not an error.
from scipy.special import expit, log_expit, log_softmax  # noqa: E402

FLT_MIN = float(np.finfo(np.float32).tiny)
EXTREME = np.array([-1e4, -3e3, -100.0, -88.0, -30.0, -1.0, 0.0, 0.5, 30.0, 88.0, 100.0,
                    3e3, 1e4, -1e4 + 7, 1e4 - 7, 2.0], np.float32)


def run_strict(op, inputs, grad_index: int = 0, d_loss: float = 1.3):
    """(forward outputs, d input 0) with numpy errors and warnings raising."""
    import warnings

    from dpgraph.ops.testing import analytic_gradients

    with warnings.catch_warnings(), np.errstate(over="raise", divide="raise",
                                                invalid="raise", under="ignore"):
        warnings.simplefilter("error")
        outs = run_op(op, inputs)
        grads = analytic_gradients(op, inputs, {grad_index: np.array(d_loss, np.float32)})
    for value in [*outs, grads[0]]:
        assert np.isfinite(np.asarray(value, np.float64)).all()
    return outs, grads[0]


def close(actual, expected, rtol=2e-6, atol_frac=1e-6):
    expected = np.asarray(expected, np.float64)
    atol = atol_frac * max(float(np.abs(expected).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def test_sigmoid_cross_entropy_loss_stable_for_extreme_logits() -> None:
    x = np.concatenate([EXTREME, EXTREME]).reshape(2, -1)
    t = np.where(RNG.random(x.shape) < 0.5, 1, 0).astype(np.int32)
    t[0, 3] = -1
    op = make_op("SigmoidCrossEntropyLoss", ["X", "t"], ["l"], scale=0.7)
    (loss,), dx = run_strict(op, [x, t])
    x64, valid = x.astype(np.float64), t != -1
    per = np.logaddexp(0.0, x64) - t * x64          # -t log p - (1 - t) log(1 - p)
    count = valid.sum()
    close(loss, 0.7 * np.where(valid, per, 0).sum() / count)
    close(dx, np.where(valid, expit(x64) - t, 0) * 0.7 * 1.3 / count)


def focal_inputs(num_classes: int, softmax: bool):
    x = np.tile(EXTREME, 2).reshape(1, 2 * EXTREME.size, 1, 1)  # A = 32 // K anchors
    anchors = x.shape[1] // num_classes
    high = num_classes if softmax else num_classes + 1
    labels = RNG.integers(-1, high, (1, anchors, 1, 1)).astype(np.int32)
    # anchor 2 holds [30, 88, 100, 3e3]: its last class has probability exactly 1
    labels[0, :4, 0, 0] = [1, 0, num_classes if not softmax else num_classes - 1, -1]
    return x, labels, np.array([5.0], np.float32)


@pytest.mark.parametrize("gamma", [2.0, 0.5, 1.0])
def test_sigmoid_focal_loss_stable_for_extreme_logits(gamma: float) -> None:
    x, labels, norm = focal_inputs(4, softmax=False)
    op = make_op("SigmoidFocalLoss", ["X", "L", "N"], ["loss"], num_classes=4, gamma=gamma,
                 alpha=0.25, scale=2.0)
    (loss,), dx = run_strict(op, [x, labels, norm])
    z = x.astype(np.float64).reshape(1, -1, 4, 1, 1)
    t = labels[:, :, None]
    cls = np.arange(1, 5).reshape(1, 1, 4, 1, 1)
    pos, neg = (t == cls) * 0.25 / 5, ((t != -1) & (t != cls)) * 0.75 / 5
    p = expit(z)
    log_p = np.maximum(log_expit(z), np.log(FLT_MIN))  # Caffe2's log(max(p, FLT_MIN))
    log_1mp = log_expit(-z)
    term1 = (1 - p) ** gamma * log_p
    term2 = p ** gamma * log_1mp
    close(loss, -2.0 * (pos * term1 + neg * term2).sum())
    d1 = (1 - p) ** gamma * (1 - p - p * gamma * log_p)
    d2 = p ** gamma * (log_1mp * (1 - p) * gamma - p)
    close(dx.reshape(z.shape), -(pos * d1 + neg * d2) * 2.0 * 1.3)


@pytest.mark.parametrize("gamma", [2.0, 0.5, 1.0])
def test_softmax_focal_loss_stable_for_extreme_logits(gamma: float) -> None:
    x, labels, norm = focal_inputs(4, softmax=True)
    op = make_op("SoftmaxFocalLoss", ["X", "L", "N"], ["loss", "P"], num_classes=4,
                 gamma=gamma, alpha=0.25)
    (loss, probs), dx = run_strict(op, [x, labels, norm])
    z = x.astype(np.float64).reshape(1, -1, 4, 1, 1)
    log_p = log_softmax(z, axis=2)
    p = np.exp(log_p)
    close(probs.reshape(z.shape), p, atol_frac=1e-7)
    t = labels[:, :, None]
    weight = np.where(t == 0, 0.75 / 5, np.where(t >= 1, 0.25 / 5, 0.0))
    safe = np.maximum(t, 0)
    p_t = np.take_along_axis(p, safe, axis=2)
    log_pt = np.maximum(np.take_along_axis(log_p, safe, axis=2), np.log(FLT_MIN))
    close(loss, -(weight * (1 - p_t) ** gamma * log_pt).sum())
    one_m = 1 - p_t
    with np.errstate(divide="ignore", invalid="ignore"):  # the reference takes the limit
        power = np.where(one_m > 0, gamma * one_m ** (gamma - 1) * p_t * log_pt, 0.0)
    buff = (-(one_m ** gamma) + power) * weight
    onehot = safe == np.arange(4).reshape(1, 1, 4, 1, 1)
    close(dx.reshape(z.shape), buff * (onehot - p) * 1.3, atol_frac=1e-6)


def test_softmax_with_loss_stable_for_extreme_logits() -> None:
    x = EXTREME.reshape(4, 4)
    label = np.array([0, 3, 1, 2], np.int32)
    op = make_op("SoftmaxWithLoss", ["X", "label"], ["P", "loss"])
    (p, loss), dx = run_strict(op, [x, label], grad_index=1)
    log_p = log_softmax(x.astype(np.float64), axis=1)
    close(loss, -log_p[np.arange(4), label].mean())  # exact, not clamped at -log(1e-20)
    assert float(loss) > 1e3
    onehot = np.eye(4)[label]
    close(dx, (np.exp(log_p) - onehot) * 1.3 / 4, atol_frac=1e-7)
    close(p, np.exp(log_p), atol_frac=1e-7)


@pytest.mark.parametrize("beta", [1.0, 0.11])
def test_smooth_l1_losses_stable_for_extreme_values(beta: float) -> None:
    y_hat = EXTREME.reshape(2, 8)
    y = EXTREME[::-1].reshape(2, 8).copy()
    a_in = np.full_like(y, 0.5)
    a_out = np.full_like(y, 2.0)
    op = make_op("SmoothL1Loss", ["Yh", "Y", "ai", "ao"], ["l"], beta=beta, scale=0.5)
    (loss,), dx = run_strict(op, [y_hat, y, a_in, a_out])
    d = 0.5 * (y_hat.astype(np.float64) - y)
    per = np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)
    close(loss, 0.5 * (2.0 * per).sum() / 2)
    close(dx, np.where(np.abs(d) < beta, d / beta, np.sign(d)) * 0.5 * 2.0 * 0.5 / 2 * 1.3)
    # SelectSmoothL1Loss on the same values, 4 channels per location
    y_hat4 = EXTREME.reshape(1, 8, 1, 2)
    locs = np.array([[0, 0, 0, 0], [0, 4, 0, 1]], np.float32)
    targets = np.stack([EXTREME[[1, 3, 5, 7]], EXTREME[[8, 10, 12, 14]]])[:, ::-1].copy()
    op = make_op("SelectSmoothL1Loss", ["Yh", "Y", "L", "S"], ["l"], beta=beta, scale=3.0)
    (loss,), dx = run_strict(op, [y_hat4, targets, locs, np.array([2.0], np.float32)])
    picked = np.stack([y_hat4[0, 0:4, 0, 0], y_hat4[0, 4:8, 0, 1]]).astype(np.float64)
    d = picked - targets
    per = np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)
    close(loss, 3.0 * per.sum() / 2)
    slope = np.where(np.abs(d) < beta, d / beta, np.sign(d)) * 3.0 * 1.3 / 2
    close(dx[0, 0:4, 0, 0], slope[0])
    close(dx[0, 4:8, 0, 1], slope[1])
