"""Detection ops: numpy references (loop-based, mirroring Caffe2's kernels), hand-computed
cases, gradient-op structure, finite-difference gradient checks and empty inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import ShapeError
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(11)
F32 = np.float32


def grad_structure(op_type: str, inputs: list[str], outputs: list[str], **kw: object) -> list:
    ops, g_in = build_gradient(make_op(op_type, inputs, outputs, **kw), [outputs[0] + "_grad"])
    return [(o.type, list(o.input), list(o.output)) for o in ops] + [g_in]


def test_all_detection_ops_registered_with_gradients() -> None:
    for op_type in ("SmoothL1Loss", "SigmoidCrossEntropyLoss", "SigmoidCrossEntropyWithLogits",
                    "ResizeNearest", "RoIAlign", "BatchPermutation", "SpatialNarrowAs",
                    "SigmoidFocalLoss", "SoftmaxFocalLoss"):
        assert OPERATORS.lookup(op_type).gradient is not None
        assert OPERATORS.lookup(op_type + "Gradient").kernel is not None


# --- SmoothL1Loss ----------------------------------------------------------------------------
def smooth_l1_ref(y_hat, y, a_in, a_out, beta=1.0, scale=1.0):
    d = a_in * (y_hat - y)
    per = np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)
    return scale * (a_out * per).sum() / y_hat.shape[0]


def test_smooth_l1_hand_computed() -> None:
    y_hat = np.array([[0.5, 3.0]], F32)
    y = np.zeros((1, 2), F32)
    ones = np.ones((1, 2), F32)
    (loss,) = run_op(make_op("SmoothL1Loss", ["p", "t", "ai", "ao"], ["l"]),
                     [y_hat, y, ones, ones])
    # 0.5 * 0.25 + (3 - 0.5) = 2.625, N = 1
    assert loss.shape == () and loss.dtype == F32
    assert float(loss) == pytest.approx(2.625)
    (loss,) = run_op(make_op("SmoothL1Loss", ["p", "t", "ai", "ao"], ["l"], beta=2.0, scale=3.0),
                     [y_hat, y, ones, 2 * ones])
    # beta 2: 0.25/4 = 0.0625; 3 - 1 = 2; times alpha_out 2, scale 3 -> 3 * 2 * 2.0625
    assert float(loss) == pytest.approx(12.375)


def test_smooth_l1_matches_reference_and_gradient() -> None:
    shape = (4, 6)
    y_hat, y = RNG.standard_normal(shape).astype(F32), RNG.standard_normal(shape).astype(F32)
    a_in = RNG.integers(0, 2, shape).astype(F32)
    a_out = RNG.uniform(0.5, 2, shape).astype(F32)
    op = make_op("SmoothL1Loss", ["p", "t", "ai", "ao"], ["l"], beta=0.5, scale=2.0)
    (loss,) = run_op(op, [y_hat, y, a_in, a_out])
    assert float(loss) == pytest.approx(smooth_l1_ref(y_hat, y, a_in, a_out, 0.5, 2.0), rel=1e-5)
    assert grad_structure("SmoothL1Loss", ["p", "t", "ai", "ao"], ["l"]) == [
        ("SmoothL1LossGradient", ["p", "t", "ai", "ao", "l_grad"], ["p_grad"]),
        ["p_grad", None, None, None]]
    # keep |alpha_in * diff| away from the kink at beta
    diff = a_in * (y_hat - y)
    y_hat = np.where(np.abs(np.abs(diff) - 0.5) < 0.05, y_hat + 0.2, y_hat).astype(F32)
    check_gradient(op, [y_hat, y, a_in, a_out], inputs_to_check=[0])


def test_smooth_l1_empty_batch_and_shape_errors() -> None:
    op = make_op("SmoothL1Loss", ["p", "t", "ai", "ao"], ["l"])
    empty = np.zeros((0, 4), F32)
    (loss,) = run_op(op, [empty] * 4)
    assert loss.shape == () and float(loss) == 0.0
    with pytest.raises(ShapeError, match="elements"):
        run_op(op, [np.zeros((2, 4), F32)] * 3 + [np.zeros((2, 3), F32)])
    with pytest.raises(ShapeError, match="batch size"):
        run_op(op, [np.zeros((2, 4), F32), np.zeros((4, 2), F32)] + [np.zeros(8, F32)] * 2)
    # like Caffe2, only element counts must match beyond dimension 0
    y_hat = RNG.standard_normal((2, 6)).astype(F32)
    y, a_in, a_out = (RNG.standard_normal((2, 3, 2)).astype(F32) for _ in range(3))
    (loss,) = run_op(op, [y_hat, y, a_in, a_out])
    assert float(loss) == pytest.approx(smooth_l1_ref(
        y_hat, y.reshape(2, 6), a_in.reshape(2, 6), a_out.reshape(2, 6)), rel=1e-5)


# --- SigmoidCrossEntropyLoss -----------------------------------------------------------------
def sigmoid_xent_ref(x, t, scale=1.0, normalize=1):
    x = x.astype(np.float64)
    p = 1 / (1 + np.exp(-x))
    per = -(t * np.log(p) + (1 - t) * np.log(1 - p))
    valid = t != -1
    loss = np.where(valid, per, 0).sum()
    if normalize:
        loss /= max(valid.sum(), 1e-5)
    return scale * loss


def test_sigmoid_cross_entropy_loss_hand_computed() -> None:
    x = np.array([0.0, 0.0, 5.0], F32)
    t = np.array([1, 0, -1], np.int32)
    (loss,) = run_op(make_op("SigmoidCrossEntropyLoss", ["X", "t"], ["l"]), [x, t])
    assert loss.shape == () and loss.dtype == F32
    assert float(loss) == pytest.approx(math.log(2), rel=1e-6)  # (log2 + log2) / 2
    op = make_op("SigmoidCrossEntropyLoss", ["X", "t"], ["l"], normalize=0, scale=0.5)
    assert float(run_op(op, [x, t])[0]) == pytest.approx(math.log(2), rel=1e-6)


def test_sigmoid_cross_entropy_loss_reference_gradient_and_empty() -> None:
    x = (RNG.standard_normal((3, 5)) * 3).astype(F32)
    t = RNG.integers(-1, 2, (3, 5)).astype(np.int32)
    for kw in ({}, {"scale": 2.0}, {"normalize": 0}):
        op = make_op("SigmoidCrossEntropyLoss", ["X", "t"], ["l"], **kw)
        assert float(run_op(op, [x, t])[0]) == pytest.approx(
            sigmoid_xent_ref(x, t, kw.get("scale", 1.0), kw.get("normalize", 1)), rel=1e-5)
        check_gradient(op, [x, t])
    assert grad_structure("SigmoidCrossEntropyLoss", ["X", "t"], ["l"]) == [
        ("SigmoidCrossEntropyLossGradient", ["X", "t", "l_grad"], ["X_grad"]), ["X_grad", None]]
    op = make_op("SigmoidCrossEntropyLoss", ["X", "t"], ["l"])
    all_ignored = run_op(op, [x, np.full((3, 5), -1, np.int32)])[0]
    assert float(all_ignored) == 0.0
    assert float(run_op(op, [np.zeros((0, 3), F32), np.zeros((0, 3), np.int32)])[0]) == 0.0
    with pytest.raises(ShapeError, match="int32"):
        run_op(op, [x, t.astype(F32)])


# --- SigmoidCrossEntropyWithLogits -----------------------------------------------------------
def with_logits_ref(lgt, tgt, mode=""):
    lgt, tgt = lgt.astype(np.float64), tgt.astype(np.float64)
    p = 1 / (1 + np.exp(-lgt))
    if mode == "unjoined":  # t * logit - (1 - t) * softplus(logit)
        value = tgt * lgt + (tgt - 1) * np.log1p(np.exp(lgt))
    elif mode == "log_d":
        value = (2 * tgt - 1) * np.log(p)
    else:
        value = tgt * np.log(p) + (1 - tgt) * np.log(1 - p)
    return -value.mean(axis=-1)


def test_sigmoid_cross_entropy_with_logits_reference() -> None:
    lgt = RNG.standard_normal((2, 3, 4)).astype(F32)
    tgt = RNG.uniform(0, 1, (2, 3, 4)).astype(F32)
    for mode, kw in (("", {}), ("log_d", {"log_D_trick": 1}),
                     ("unjoined", {"unjoined_lr_loss": 1})):
        op = make_op("SigmoidCrossEntropyWithLogits", ["L", "T"], ["out"], **kw)
        (out,) = run_op(op, [lgt, tgt])
        assert out.shape == (2, 3) and out.dtype == F32
        np.testing.assert_allclose(out, with_logits_ref(lgt, tgt, mode), rtol=1e-5, atol=1e-6)
        check_gradient(op, [lgt, tgt], inputs_to_check=[0])
    # hand case: logit 0, target 1 -> log 2; 1-D input gives a 0-d output
    op = make_op("SigmoidCrossEntropyWithLogits", ["L", "T"], ["out"])
    (out,) = run_op(op, [np.zeros(2, F32), np.array([1, 0], F32)])
    assert out.shape == () and float(out) == pytest.approx(math.log(2))
    assert grad_structure("SigmoidCrossEntropyWithLogits", ["L", "T"], ["out"]) == [
        ("SigmoidCrossEntropyWithLogitsGradient", ["out_grad", "L", "T"], ["L_grad"]),
        ["L_grad", None]]
    assert run_op(op, [np.zeros((0, 3), F32)] * 2)[0].shape == (0,)
    weights = RNG.uniform(0, 2, lgt.shape).astype(F32)
    op = make_op("WeightedSigmoidCrossEntropyWithLogits", ["L", "T", "W"], ["out"])
    (out,) = run_op(op, [lgt, tgt, weights])
    lg, tg = lgt.astype(np.float64), tgt.astype(np.float64)
    ref = (weights * (np.logaddexp(0, lg) - tg * lg)).mean(axis=-1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    check_gradient(op, [lgt, tgt, weights], inputs_to_check=[0])
    assert grad_structure("WeightedSigmoidCrossEntropyWithLogits", ["L", "T", "W"], ["o"]) == [
        ("WeightedSigmoidCrossEntropyWithLogitsGradient", ["o_grad", "L", "T", "W"],
         ["L_grad"]), ["L_grad", None, None]]
    bad = make_op("SigmoidCrossEntropyWithLogits", ["L", "T"], ["out"], log_D_trick=1,
                  unjoined_lr_loss=1)
    with pytest.raises(ShapeError, match="cannot both"):
        run_op(bad, [lgt, tgt])


# --- ResizeNearest ---------------------------------------------------------------------------
def resize_ref(x, hs, ws):
    n, c, h, w = x.shape
    oh, ow = int(F32(h) * F32(hs)), int(F32(w) * F32(ws))
    y = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = x[:, :, min(int(F32(i) / F32(hs)), h - 1),
                              min(int(F32(j) / F32(ws)), w - 1)]
    return y


def test_resize_nearest_hand_and_reference() -> None:
    x = np.array([[[[1, 2], [3, 4]]]], F32)
    op = make_op("ResizeNearest", ["X"], ["Y"], width_scale=2.0, height_scale=2.0)
    (y,) = run_op(op, [x])
    np.testing.assert_array_equal(y[0, 0], [[1, 1, 2, 2], [1, 1, 2, 2],
                                            [3, 3, 4, 4], [3, 3, 4, 4]])
    x = RNG.standard_normal((2, 3, 5, 4)).astype(F32)
    for hs, ws in ((2.0, 3.0), (0.5, 1.5), (1.7, 0.6)):
        op = make_op("ResizeNearest", ["X"], ["Y"], width_scale=ws, height_scale=hs)
        np.testing.assert_array_equal(run_op(op, [x])[0], resize_ref(x, hs, ws))
        check_gradient(op, [x])
    op = make_op("ResizeNearest", ["X"], ["Y"], width_scale=2.0, height_scale=3.0, order="NHWC")
    (y,) = run_op(op, [x.transpose(0, 2, 3, 1)])
    np.testing.assert_array_equal(y, resize_ref(x, 3.0, 2.0).transpose(0, 2, 3, 1))


def test_resize_nearest_scales_input_gradient_structure_and_empty() -> None:
    x = RNG.standard_normal((1, 2, 3, 3)).astype(F32)
    op = make_op("ResizeNearest", ["X", "s"], ["Y"])
    (y,) = run_op(op, [x, np.array([2.0, 1.0], F32)])
    np.testing.assert_array_equal(y, resize_ref(x, 2.0, 1.0))
    assert grad_structure("ResizeNearest", ["X", "s"], ["Y"]) == [
        ("ResizeNearestGradient", ["Y_grad", "X", "s"], ["X_grad"]), ["X_grad", None]]
    assert grad_structure("ResizeNearest", ["X"], ["Y"], width_scale=2.0)[0] == (
        "ResizeNearestGradient", ["Y_grad", "X"], ["X_grad"])
    op = make_op("ResizeNearest", ["X"], ["Y"], width_scale=2.0, height_scale=2.0)
    assert run_op(op, [np.zeros((0, 2, 3, 3), F32)])[0].shape == (0, 2, 6, 6)
    with pytest.raises(ShapeError, match="> 0"):
        run_op(make_op("ResizeNearest", ["X"], ["Y"], width_scale=0.0), [x])


# --- RoIAlign --------------------------------------------------------------------------------
def _bilinear(h: int, w: int, y: float, x: float) -> list[tuple[int, int, float]]:
    """Caffe2's bilinear_interpolate: [(row, col, weight)] for one sample point."""
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= h - 1:
        y_high = y_low = h - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= w - 1:
        x_high = x_low = w - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    return [(y_low, x_low, hy * hx), (y_low, x_high, hy * lx),
            (y_high, x_low, ly * hx), (y_high, x_high, ly * lx)]


def roi_align_ref(x, rois, scale=1.0, ph=1, pw=1, ratio=-1, aligned=False):
    """Loop-based RoIAlign, statement by statement as Caffe2's CPU kernel (float32)."""
    n, c, h, w = x.shape
    y = np.zeros((len(rois), c, ph, pw), np.float64)
    for r, roi in enumerate(rois.astype(F32)):
        b, box = (int(roi[0]), roi[1:]) if len(roi) == 5 else (0, roi)
        off = F32(0.5) if aligned else F32(0)
        x1, y1, x2, y2 = (F32(v) * F32(scale) - off for v in box)
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, F32(1)), max(rh, F32(1))
        bh, bw = rh / F32(ph), rw / F32(pw)
        gh = ratio if ratio > 0 else int(math.ceil(rh / F32(ph)))
        gw = ratio if ratio > 0 else int(math.ceil(rw / F32(pw)))
        count = max(gh * gw, 1)
        for i in range(ph):
            for j in range(pw):
                acc = np.zeros(c)
                for iy in range(gh):
                    yy = y1 + F32(i) * bh + F32(iy + 0.5) * bh / F32(gh)
                    for ix in range(gw):
                        xx = x1 + F32(j) * bw + F32(ix + 0.5) * bw / F32(gw)
                        for row, col, wt in _bilinear(h, w, float(yy), float(xx)):
                            acc += wt * x[b, :, row, col]
                y[r, :, i, j] = acc / count
    return y


def test_roi_align_hand_computed() -> None:
    x = np.arange(16, dtype=F32).reshape(1, 1, 4, 4)  # value = 4 * row + col
    rois = np.array([[0, 0.0, 0.0, 2.0, 2.0]], F32)
    # one bin, adaptive grid 2 x 2: samples at (0.5, 0.5), (0.5, 1.5), (1.5, 0.5), (1.5, 1.5);
    # bilinear on a linear map is exact: mean of 4y + x over them = 4 * 1 + 1 = 5
    (y,) = run_op(make_op("RoIAlign", ["X", "R"], ["Y"]), [x, rois])
    assert y.shape == (1, 1, 1, 1) and y.dtype == F32
    assert float(y[0, 0, 0, 0]) == pytest.approx(5.0)
    (y,) = run_op(make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=2, pooled_w=2,
                          sampling_ratio=1), [x, rois])
    # bin centres at 0.5 and 1.5 -> 4y + x
    np.testing.assert_allclose(y[0, 0], [[2.5, 3.5], [6.5, 7.5]], rtol=1e-6)
    (y,) = run_op(make_op("RoIAlign", ["X", "R"], ["Y"], aligned=1), [x, rois])
    assert float(y[0, 0, 0, 0]) == pytest.approx(4 * 0.5 + 0.5)  # shifted by half a pixel


@pytest.mark.parametrize("kw", [
    {"pooled_h": 3, "pooled_w": 2, "spatial_scale": 0.5},
    {"pooled_h": 2, "pooled_w": 3, "sampling_ratio": 2, "spatial_scale": 0.25},
    {"pooled_h": 2, "pooled_w": 2, "aligned": 1, "spatial_scale": 0.5},
])
def test_roi_align_matches_loop_reference(kw: dict) -> None:
    x = RNG.standard_normal((2, 3, 7, 9)).astype(F32)
    rois = np.array([[0, 1.0, 2.0, 13.0, 9.0], [1, -4.0, -3.0, 6.0, 30.0],
                     [1, 3.0, 3.0, 3.5, 3.2], [0, 15.0, 10.0, 40.0, 33.0],
                     [1, 0.0, 0.0, 17.9, 13.9]], F32)
    (y,) = run_op(make_op("RoIAlign", ["X", "R"], ["Y"], **kw), [x, rois])
    ref = roi_align_ref(x, rois, kw["spatial_scale"], kw["pooled_h"], kw["pooled_w"],
                        kw.get("sampling_ratio", -1), bool(kw.get("aligned", 0)))
    assert y.shape == ref.shape and y.dtype == F32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    op = make_op("RoIAlign", ["X", "R"], ["Y"], order="NHWC", **kw)
    (y_nhwc,) = run_op(op, [x.transpose(0, 2, 3, 1), rois])
    np.testing.assert_allclose(y_nhwc, ref.transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-5)


def test_roi_align_four_columns_gradient_and_empty() -> None:
    x = RNG.standard_normal((1, 2, 5, 6)).astype(F32)
    rois4 = np.array([[0.3, 0.7, 4.1, 3.6], [1.2, 0.1, 5.7, 4.9]], F32)
    op = make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=2, pooled_w=2)
    np.testing.assert_allclose(run_op(op, [x, rois4])[0], roi_align_ref(x, rois4, ph=2, pw=2),
                               rtol=1e-4, atol=1e-5)
    assert grad_structure("RoIAlign", ["X", "R"], ["Y"]) == [
        ("RoIAlignGradient", ["X", "R", "Y_grad"], ["X_grad"]), ["X_grad", None]]
    x2 = RNG.standard_normal((2, 2, 5, 6)).astype(F32)
    rois = np.array([[1, 0.3, 0.7, 4.1, 3.6], [0, 1.2, 0.1, 5.7, 4.9],
                     [1, -1.5, 2.2, 7.0, 6.5]], F32)
    for kw in ({"pooled_h": 2, "pooled_w": 3}, {"sampling_ratio": 2, "aligned": 1}):
        check_gradient(make_op("RoIAlign", ["X", "R"], ["Y"], **kw), [x2, rois],
                       inputs_to_check=[0])
    check_gradient(make_op("RoIAlign", ["X", "R"], ["Y"], order="NHWC", pooled_h=2),
                   [x2.transpose(0, 2, 3, 1).copy(), rois], inputs_to_check=[0])
    empty = np.zeros((0, 5), F32)
    (y,) = run_op(make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=3, pooled_w=2), [x2, empty])
    assert y.shape == (0, 2, 3, 2)
    (dx,) = run_op(make_op("RoIAlignGradient", ["X", "R", "dY"], ["dX"], pooled_h=3,
                           pooled_w=2), [x2, empty, y])
    assert dx.shape == x2.shape and not dx.any()
    with pytest.raises(ShapeError, match="batch indices"):
        run_op(op, [x, np.array([[1, 0, 0, 1, 1]], F32)])


# --- BatchPermutation ------------------------------------------------------------------------
def test_batch_permutation() -> None:
    x = RNG.standard_normal((4, 2, 3)).astype(F32)
    idx = np.array([2, 0, 3, 1], np.int32)
    op = make_op("BatchPermutation", ["X", "i"], ["Y"])
    (y,) = run_op(op, [x, idx])
    np.testing.assert_array_equal(y, x[idx])
    np.testing.assert_array_equal(run_op(op, [np.array([10.0, 20.0], F32),
                                              np.array([1, 0], np.int32)])[0], [20.0, 10.0])
    assert grad_structure("BatchPermutation", ["X", "i"], ["Y"]) == [
        ("BatchPermutationGradient", ["i", "Y_grad"], ["X_grad"]), ["X_grad", None]]
    check_gradient(op, [x, idx], inputs_to_check=[0])
    (dx,) = run_op(make_op("BatchPermutationGradient", ["i", "dY"], ["dX"]), [idx, y])
    np.testing.assert_array_equal(dx, x)
    assert run_op(op, [np.zeros((0, 3), F32), np.zeros(0, np.int32)])[0].shape == (0, 3)
    with pytest.raises(ShapeError, match="indices"):
        run_op(op, [x, np.array([0, 1, 2, 4], np.int32)])


# --- SpatialNarrowAs -------------------------------------------------------------------------
def test_spatial_narrow_as() -> None:
    a = RNG.standard_normal((2, 3, 5, 6)).astype(F32)
    b = np.zeros((2, 3, 4, 3), F32)
    op = make_op("SpatialNarrowAs", ["A", "B"], ["C"])
    (c,) = run_op(op, [a, b])
    np.testing.assert_array_equal(c, a[:, :, :4, :3])
    (c3,) = run_op(op, [a, b[:, 0]])  # B may be (N, H', W'): A keeps its channels
    np.testing.assert_array_equal(c3, a[:, :, :4, :3])
    assert grad_structure("SpatialNarrowAs", ["A", "B"], ["C"]) == [
        ("SpatialNarrowAsGradient", ["A", "B", "C_grad"], ["A_grad"]), ["A_grad", None]]
    check_gradient(op, [a[:1, :2], b[:1, :2]], inputs_to_check=[0])
    check_gradient(op, [a[:1, :2], b[:1, 0]], inputs_to_check=[0])
    with pytest.raises(ShapeError, match="height must be >="):
        run_op(op, [a[:, :, :3], b])
    with pytest.raises(ShapeError, match="width must be >="):
        run_op(op, [a[:, :, :, :2], b])
    with pytest.raises(ShapeError, match="Input dim 1 must be equal"):
        run_op(op, [a, np.zeros((2, 7, 4, 3), F32)])
    with pytest.raises(ShapeError, match="Input dim 0 must be equal"):
        run_op(op, [a, b[:1]])
    with pytest.raises(ShapeError, match="A must be 4-D"):
        run_op(op, [a[:, 0], b[:, 0]])


def test_roi_align_chunked_matches_unchunked(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpgraph.ops import detection

    x = RNG.standard_normal((2, 3, 6, 5)).astype(F32)
    rois = np.array([[1, 0.5, 0.5, 4.0, 5.0], [0, 1.0, 0.0, 3.0, 2.5],
                     [1, 2.0, 1.0, 4.5, 4.5], [1, 0.0, 0.0, 1.0, 1.0]], F32)
    op = make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=2, pooled_w=2)
    grad = make_op("RoIAlignGradient", ["X", "R", "dY"], ["dX"], pooled_h=2, pooled_w=2)
    dy = RNG.standard_normal((4, 3, 2, 2)).astype(F32)
    whole = run_op(op, [x, rois])[0], run_op(grad, [x, rois, dy])[0]
    monkeypatch.setattr(detection, "_ROI_CHUNK_ELEMENTS", 1)  # one RoI per chunk
    np.testing.assert_allclose(run_op(op, [x, rois])[0], whole[0], rtol=1e-6)
    np.testing.assert_allclose(run_op(grad, [x, rois, dy])[0], whole[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(whole[0], roi_align_ref(x, rois, ph=2, pw=2), rtol=1e-4,
                               atol=1e-5)


def shape_fn(op_type: str):
    fn = OPERATORS.lookup(op_type).shape_fn
    assert fn is not None
    return fn


def test_shape_functions() -> None:
    roi = shape_fn("RoIAlign")
    op = make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=7, pooled_w=5)
    assert roi(op, [(2, 8, 20, 30), (11, 5)], [1, 1]) == [((11, 8, 7, 5), 1)]
    resize = shape_fn("ResizeNearest")
    op = make_op("ResizeNearest", ["X"], ["Y"], width_scale=2.0, height_scale=0.5)
    x = np.zeros((1, 2, 5, 3), F32)
    assert resize(op, [x.shape], [1]) == [(run_op(op, [x])[0].shape, 1)]
    narrow = shape_fn("SpatialNarrowAs")
    op = make_op("SpatialNarrowAs", ["A", "B"], ["C"])
    assert narrow(op, [(2, 3, 9, 9), (2, 3, 4, 5)], [1, 1]) == [((2, 3, 4, 5), 1)]
    assert narrow(op, [(2, 3, 9, 9), (2, 4, 5)], [1, 1]) == [((2, 3, 4, 5), 1)]
    assert shape_fn("SmoothL1Loss")(op, [None] * 4, [None] * 4) == [((), 1)]


# --- Focal losses ----------------------------------------------------------------------------
def sigmoid_focal_ref(x, labels, normalizer, k, alpha=0.25, gamma=1.0, scale=1.0):
    n, d, h, w = x.shape
    p = 1 / (1 + np.exp(-x.astype(np.float64).reshape(n, d // k, k, h, w)))
    t = labels[:, :, None]
    cls = np.arange(1, k + 1).reshape(1, 1, -1, 1, 1)
    pos, neg = t == cls, (t != -1) & (t != cls)
    np_ = max(normalizer, 1.0)
    loss = (-(alpha / np_) * pos * (1 - p) ** gamma * np.log(p)
            - ((1 - alpha) / np_) * neg * p ** gamma * np.log(1 - p))
    return scale * loss.sum()


def softmax_focal_ref(x, labels, normalizer, k, alpha=0.25, gamma=1.0, scale=1.0):
    n, d, h, w = x.shape
    g = x.astype(np.float64).reshape(n, d // k, k, h, w)
    prob = np.exp(g) / np.exp(g).sum(axis=2, keepdims=True)
    total = 0.0
    for i, a, y, xx in np.ndindex(*labels.shape):
        lab = labels[i, a, y, xx]
        if lab >= 0:
            pt = prob[i, a, lab, y, xx]
            z = (alpha if lab >= 1 else 1 - alpha) / max(normalizer, 1.0)
            total += -z * (1 - pt) ** gamma * np.log(pt)
    return scale * total, prob.reshape(x.shape)


def test_sigmoid_focal_loss() -> None:
    k = 3
    x = RNG.standard_normal((2, 2 * k, 3, 2)).astype(F32)
    labels = RNG.integers(-1, k + 1, (2, 2, 3, 2)).astype(np.int32)
    norm = np.array([4.0], F32)
    for kw in ({"num_classes": k}, {"num_classes": k, "gamma": 2.0, "alpha": 0.4, "scale": 3.0}):
        op = make_op("SigmoidFocalLoss", ["X", "L", "N"], ["loss"], **kw)
        (loss,) = run_op(op, [x, labels, norm])
        assert loss.shape == () and loss.dtype == F32
        ref = sigmoid_focal_ref(x, labels, 4.0, k, kw.get("alpha", 0.25), kw.get("gamma", 1.0),
                                kw.get("scale", 1.0))
        assert float(loss) == pytest.approx(ref, rel=1e-5)
        check_gradient(op, [x, labels, norm], inputs_to_check=[0])
    # hand case: one anchor, one class, logit 0, positive label: -0.25 * 0.5 * log(0.5)
    op = make_op("SigmoidFocalLoss", ["X", "L", "N"], ["loss"], num_classes=1)
    (loss,) = run_op(op, [np.zeros((1, 1, 1, 1), F32), np.ones((1, 1, 1, 1), np.int32),
                          np.array([0.0], F32)])
    assert float(loss) == pytest.approx(0.125 * math.log(2), rel=1e-6)
    assert grad_structure("SigmoidFocalLoss", ["X", "L", "N"], ["loss"], num_classes=1)[0] == (
        "SigmoidFocalLossGradient", ["X", "L", "N", "loss_grad"], ["X_grad"])
    empty = np.zeros((0, 2, 3, 3), F32), np.zeros((0, 2, 3, 3), np.int32), norm
    assert float(run_op(op, list(empty))[0]) == 0.0


def test_softmax_focal_loss() -> None:
    k = 4
    x = RNG.standard_normal((2, 2 * k, 2, 3)).astype(F32)
    labels = RNG.integers(-1, k, (2, 2, 2, 3)).astype(np.int32)
    norm = np.array([5.0], F32)
    for kw in ({"num_classes": k}, {"num_classes": k, "gamma": 2.0, "alpha": 0.6, "scale": 0.5}):
        op = make_op("SoftmaxFocalLoss", ["X", "L", "N"], ["loss", "P"], **kw)
        loss, prob = run_op(op, [x, labels, norm])
        ref, ref_prob = softmax_focal_ref(x, labels, 5.0, k, kw.get("alpha", 0.25),
                                          kw.get("gamma", 1.0), kw.get("scale", 1.0))
        assert loss.shape == () and prob.shape == x.shape and prob.dtype == F32
        assert float(loss) == pytest.approx(ref, rel=1e-5)
        np.testing.assert_allclose(prob, ref_prob, rtol=1e-5)
        check_gradient(op, [x, labels, norm], inputs_to_check=[0])
    # hand case: two equal scores, label 1: p = 0.5, loss = 0.25 * 0.5 * log 2
    op = make_op("SoftmaxFocalLoss", ["X", "L", "N"], ["loss", "P"], num_classes=2)
    loss, _ = run_op(op, [np.zeros((1, 2, 1, 1), F32), np.ones((1, 1, 1, 1), np.int32),
                          np.array([1.0], F32)])
    assert float(loss) == pytest.approx(0.125 * math.log(2), rel=1e-6)
    ops, _ = build_gradient(op, ["loss_grad", None])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("SoftmaxFocalLossGradient", ["X", "L", "N", "P", "loss_grad"], ["X_grad"])]
    with pytest.raises(ShapeError, match="labels must lie"):
        run_op(op, [np.zeros((1, 2, 1, 1), F32), np.full((1, 1, 1, 1), 2, np.int32),
                    np.array([1.0], F32)])


# --- GenerateProposals / FPN proposals -------------------------------------------------------
def test_generate_proposals_hand_computed() -> None:
    anchors = np.array([[0, 0, 15, 15]], F32)
    scores = np.array([[[[0.2, 0.9]]]], F32)  # (N=1, A=1, H=1, W=2)
    deltas = np.zeros((1, 4, 1, 2), F32)
    im_info = np.array([[32, 32, 1]], F32)
    op = make_op("GenerateProposals", ["s", "d", "im", "a"], ["rois", "probs"])
    rois, probs = run_op(op, [scores, deltas, im_info, anchors])
    np.testing.assert_allclose(rois, [[0, 16, 0, 31, 15], [0, 0, 0, 15, 15]])
    np.testing.assert_allclose(probs, [0.9, 0.2])
    assert rois.dtype == F32 and probs.dtype == F32
    # dx = 0.25 and dw = log 2 on the first anchor: centre 8 + 4, width 32 -> [-4, 27] clipped
    deltas[0, 0, 0, 0], deltas[0, 2, 0, 0] = 0.25, math.log(2)
    rois, _ = run_op(op, [scores, deltas, im_info, anchors])
    np.testing.assert_allclose(rois[1], [0, 0, 0, 27, 15], rtol=1e-5)
    # min_size scaled by im_scale 2 removes both 16-pixel boxes
    rois, probs = run_op(op, [scores, np.zeros_like(deltas), np.array([[32, 32, 2]], F32),
                              anchors])
    assert rois.shape == (0, 5) and probs.shape == (0,)


def proposals_ref(scores, deltas, im_info, anchors, scale=1 / 16, pre=6000, post=300,
                  thresh=0.7, min_size=16.0):
    """Loop-based RPN proposals, following Caffe2's GenerateProposals step by step."""
    out_rois, out_probs = [], []
    for n in range(scores.shape[0]):
        _, num_a, height, width = scores.shape
        cands = []
        for y in range(height):
            for x in range(width):
                for a in range(num_a):
                    box = anchors[a] + np.float32(1 / scale) * np.array([x, y, x, y], F32)
                    cands.append((-scores[n, a, y, x], len(cands), box,
                                  deltas[n, 4 * a:4 * a + 4, y, x]))
        cands.sort(key=lambda c: (c[0], c[1]))
        cands = cands[:pre] if pre > 0 else cands
        kept = []
        for neg, _, box, d in cands:
            w, h = box[2] - box[0] + 1, box[3] - box[1] + 1
            cx, cy = box[0] + w / 2, box[1] + h / 2
            dw, dh = min(d[2], math.log(1000 / 16)), min(d[3], math.log(1000 / 16))
            px, py, pw, ph = d[0] * w + cx, d[1] * h + cy, math.exp(dw) * w, math.exp(dh) * h
            b = [px - pw / 2, py - ph / 2, px + pw / 2 - 1, py + ph / 2 - 1]
            im_h, im_w, im_s = im_info[n]
            b = [min(max(b[0], 0), im_w - 1), min(max(b[1], 0), im_h - 1),
                 min(max(b[2], 0), im_w - 1), min(max(b[3], 0), im_h - 1)]
            bw, bh = b[2] - b[0] + 1, b[3] - b[1] + 1
            if (bw >= min_size * im_s and bh >= min_size * im_s and b[0] + bw / 2 < im_w
                    and b[1] + bh / 2 < im_h):
                kept.append((b, -neg))
        chosen: list = []
        for b, s in kept:
            if post > 0 and len(chosen) >= post:
                break
            if all(iou(b, c) <= thresh for c, _ in chosen):
                chosen.append((b, s))
        out_rois += [[n, *b] for b, _ in chosen]
        out_probs += [s for _, s in chosen]
    return np.array(out_rois, F32).reshape(-1, 5), np.array(out_probs, F32)


def iou(a, b) -> float:
    iw = max(min(a[2], b[2]) - max(a[0], b[0]) + 1, 0)
    ih = max(min(a[3], b[3]) - max(a[1], b[1]) + 1, 0)
    inter = iw * ih
    area = (a[2] - a[0] + 1) * (a[3] - a[1] + 1) + (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / (area - inter)


def test_generate_proposals_matches_loop_reference() -> None:
    rng = np.random.default_rng(3)
    anchors = np.array([[-8, -8, 23, 23], [-24, -8, 39, 23], [0, 0, 15, 15]], F32)
    scores = rng.uniform(0, 1, (2, 3, 4, 5)).astype(F32)
    deltas = (rng.standard_normal((2, 12, 4, 5)) * 0.3).astype(F32)
    im_info = np.array([[60, 75, 1.0], [64, 50, 0.8]], F32)
    for kw in ({}, {"pre_nms_topN": 20, "post_nms_topN": 7, "nms_thresh": 0.5,
                    "min_size": 4.0}):
        op = make_op("GenerateProposals", ["s", "d", "im", "a"], ["rois", "probs"], **kw)
        rois, probs = run_op(op, [scores, deltas, im_info, anchors])
        ref_rois, ref_probs = proposals_ref(
            scores, deltas, im_info, anchors, pre=kw.get("pre_nms_topN", 6000),
            post=kw.get("post_nms_topN", 300), thresh=kw.get("nms_thresh", 0.7),
            min_size=kw.get("min_size", 16.0))
        assert len(rois) > 3
        np.testing.assert_allclose(rois, ref_rois, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(probs, ref_probs)
    with pytest.raises(ShapeError, match="bbox_deltas"):
        run_op(op, [scores, deltas[:, :8], im_info, anchors])


def test_collect_and_distribute_fpn_rpn_proposals() -> None:
    # levels 2..3 of RPN; RoIs 224x224 -> level 4, 112 -> 3, 56 -> 2, 1000 -> clamped 5
    rois2 = np.array([[0, 0, 0, 223, 223], [0, 0, 0, 55, 55]], F32)
    rois3 = np.array([[1, 10, 10, 121, 121], [0, 0, 0, 999, 999], [1, 0, 0, 55, 55]], F32)
    probs2, probs3 = np.array([0.9, 0.1], F32), np.array([0.5, 0.7, 0.3], F32)
    outputs = ["rois", "f2", "f3", "f4", "f5", "restore"]
    op = make_op("CollectAndDistributeFpnRpnProposals", ["r2", "r3", "p2", "p3"], outputs,
                 rpn_min_level=2, rpn_max_level=3, rpn_post_nms_topN=4)
    rois, f2, f3, f4, f5, restore = run_op(op, [rois2, rois3, probs2, probs3])
    # top 4 by score: 0.9 (224), 0.7 (1000), 0.5 (112), 0.3 (56)
    np.testing.assert_array_equal(rois, [rois2[0], rois3[1], rois3[0], rois3[2]])
    np.testing.assert_array_equal(f2, rois3[2:3])
    np.testing.assert_array_equal(f3, rois3[0:1])
    np.testing.assert_array_equal(f4, rois2[0:1])
    np.testing.assert_array_equal(f5, rois3[1:2])
    assert restore.dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([f2, f3, f4, f5])[restore], rois)
    (collected,) = run_op(make_op("CollectRpnProposals", ["r2", "r3", "p2", "p3"], ["rois"],
                                  rpn_min_level=2, rpn_max_level=3, rpn_post_nms_topN=4),
                          [rois2, rois3, probs2, probs3])
    np.testing.assert_array_equal(collected, rois)
    dist = run_op(make_op("DistributeFpnProposals", ["rois"], outputs[1:]), [rois])
    for got, want in zip(dist, (f2, f3, f4, f5, restore)):
        np.testing.assert_array_equal(got, want)
    empty = run_op(make_op("DistributeFpnProposals", ["rois"], outputs[1:]),
                   [np.zeros((0, 5), F32)])
    assert [e.shape for e in empty] == [(0, 5)] * 4 + [(0,)]
    with pytest.raises(ShapeError, match="distribution outputs"):
        run_op(make_op("DistributeFpnProposals", ["rois"], outputs[1:4]), [rois])


# --- a Detectron-style head through autodiff -------------------------------------------------
def test_detection_head_backward_matches_finite_differences() -> None:
    from dpgraph import core
    from dpgraph.ops.testing import run_ops

    net = core.Net("det_head")
    net.ResizeNearest(["X"], ["up"], width_scale=2.0, height_scale=2.0)
    net.SpatialNarrowAs(["up", "B"], ["narrow"])
    net.RoIAlign(["narrow", "rois"], ["pooled"], pooled_h=2, pooled_w=2, spatial_scale=0.5)
    net.BatchPermutation(["pooled", "perm"], ["permuted"])
    losses = [net.SmoothL1Loss(["permuted", "target", "ain", "aout"], ["loss_bbox"]),
              net.SigmoidCrossEntropyLoss(["permuted", "labels"], ["loss_cls"])]
    forward = list(net.Proto().op)
    net.AddGradientOperators(losses)
    grad_types = [o.type for o in net.Proto().op[len(forward):]]
    for expected in ("SmoothL1LossGradient", "SigmoidCrossEntropyLossGradient",
                     "BatchPermutationGradient", "RoIAlignGradient", "SpatialNarrowAsGradient",
                     "ResizeNearestGradient"):
        assert expected in grad_types
    rng = np.random.default_rng(5)
    feeds = {
        "X": rng.standard_normal((2, 2, 4, 5)).astype(F32),
        "B": np.zeros((2, 7, 9), F32),
        "rois": np.array([[0, 1, 1, 12, 10], [1, 0, 2, 7, 13], [1, 4, 3, 17, 9]], F32),
        "perm": np.array([2, 0, 1], np.int32),
        "target": rng.standard_normal((3, 2, 2, 2)).astype(F32) * 3,
        "ain": np.ones((3, 2, 2, 2), F32), "aout": np.full((3, 2, 2, 2), 0.5, F32),
        "labels": rng.integers(-1, 2, (3, 2, 2, 2)).astype(np.int32),
    }
    state = run_ops(net.Proto().op, feeds)
    grad = np.asarray(state["X_grad"], np.float64)
    assert grad.shape == feeds["X"].shape and np.abs(grad).sum() > 0

    def total(x: np.ndarray) -> float:
        out = run_ops(forward, {**feeds, "X": x.astype(F32)})
        return float(out["loss_bbox"]) + float(out["loss_cls"])

    eps, x = 1e-2, feeds["X"].astype(np.float64)
    numeric = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        plus, minus = x.copy(), x.copy()
        plus[i] += eps
        minus[i] -= eps
        numeric[i] = (total(plus) - total(minus)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=2e-2, atol=2e-3)
