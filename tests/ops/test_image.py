"""Image and detection ops (ops/image.py): loop references, gradient ops, finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(9)


def summary(ops: list) -> list[tuple]:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


# --- UpsampleBilinear ------------------------------------------------------------------------
def upsample_reference(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    n, c, h, w = x.shape
    rh = (h - 1) / (out_h - 1) if out_h > 1 else 0.0
    rw = (w - 1) / (out_w - 1) if out_w > 1 else 0.0
    y = np.zeros((n, c, out_h, out_w))
    for i in range(out_h):
        h1 = int(rh * i)
        hp, hl = (1 if h1 < h - 1 else 0), rh * i - h1
        for j in range(out_w):
            w1 = int(rw * j)
            wp, wl = (1 if w1 < w - 1 else 0), rw * j - w1
            y[:, :, i, j] = ((1 - hl) * ((1 - wl) * x[:, :, h1, w1] + wl * x[:, :, h1, w1 + wp])
                             + hl * ((1 - wl) * x[:, :, h1 + hp, w1]
                                     + wl * x[:, :, h1 + hp, w1 + wp]))
    return y


def test_upsample_bilinear_reference_and_gradient() -> None:
    x = RNG.standard_normal((2, 3, 3, 4)).astype(np.float32)
    op = make_op("UpsampleBilinear", ["X"], ["Y"], height_scale=2.0, width_scale=1.5)
    (y,) = run_op(op, [x])
    assert y.shape == (2, 3, 6, 6) and y.dtype == np.float32
    np.testing.assert_allclose(y, upsample_reference(x, 6, 6), rtol=1e-5, atol=1e-5)
    (y2,) = run_op(make_op("UpsampleBilinear", ["X", "S"], ["Y"]),
                   [x, np.array([2.0, 1.5], np.float32)])
    np.testing.assert_array_equal(y2, y)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("UpsampleBilinearGradient", ["Y_grad", "X"], ["X_grad"])]
    check_gradient(op, [x.astype(np.float64)])


# --- PadImage --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_image_modes_match_numpy(mode: str) -> None:
    x = RNG.standard_normal((1, 2, 4, 5))
    op = make_op("PadImage", ["X"], ["Y"], pad_t=1, pad_l=2, pad_b=3, pad_r=0, mode=mode)
    (y,) = run_op(op, [x])
    np.testing.assert_allclose(y, np.pad(x, ((0, 0), (0, 0), (1, 3), (2, 0)), mode=mode))
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("PadImageGradient", ["Y_grad"], ["X_grad"])]
    check_gradient(op, [x])


def test_pad_image_value_nhwc_and_crop() -> None:
    x = RNG.standard_normal((2, 3, 3, 2)).astype(np.float32)
    (y,) = run_op(make_op("PadImage", ["X"], ["Y"], pad=1, value=5.0, order="NHWC"), [x])
    np.testing.assert_allclose(y, np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)),
                                         constant_values=5.0))
    (crop,) = run_op(make_op("PadImage", ["X"], ["Y"], pads=[-1, 0, 0, -1]), [x])
    np.testing.assert_array_equal(crop, x[:, :, 1:, :-1])
    with pytest.raises(ShapeError, match="reflect"):
        run_op(make_op("PadImage", ["X"], ["Y"], pad=3, mode="reflect"), [x])


# --- IntegralImage ---------------------------------------------------------------------------
def test_integral_image_and_caffe2_gradient_kernel() -> None:
    x = RNG.standard_normal((2, 1, 3, 4))
    op = make_op("IntegralImage", ["X"], ["Y"])
    (y,) = run_op(op, [x])
    assert y.shape == (2, 1, 4, 5)
    for i in range(4):
        for j in range(5):
            np.testing.assert_allclose(y[:, :, i, j], x[:, :, :i, :j].sum(axis=(2, 3)))
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("IntegralImageGradient", ["X", "Y_grad"], ["X_grad"])]
    dy = RNG.standard_normal(y.shape)
    (dx,) = run_op(ops[0], [x, dy])
    # Caffe2's kernel: running sum of dY's top-left H×W block (what its golden case records)
    np.testing.assert_allclose(dx, dy[:, :, :3, :4].cumsum(2).cumsum(3))


# --- BBoxTransform / BoxWithNMSLimit ---------------------------------------------------------
def test_bbox_transform_identity_and_clipping() -> None:
    rois = np.array([[0, 10, 20, 30, 40], [1, 0, 0, 99, 99]], np.float32)
    zero = np.zeros((2, 8), np.float32)
    im_info = np.array([[100, 100, 1.0], [50, 60, 2.0]], np.float32)
    op = make_op("BBoxTransform", ["R", "D", "I"], ["B", "S"], correct_transform_coords=1)
    boxes, splits = run_op(op, [rois, zero, im_info])
    np.testing.assert_allclose(boxes[0], [10, 20, 30, 40] * 2, atol=1e-4)
    # boxes / 2 clipped to the 30×25 image, then scaled back by 2
    np.testing.assert_allclose(boxes[1], [0, 0, 58, 48] * 2, atol=1e-4)
    assert splits.tolist() == [1.0, 1.0]
    deltas = np.array([[0.1, -0.2, math.log(2.0), 0.0]], np.float32)
    (moved,) = run_op(make_op("BBoxTransform", ["R", "D", "I"], ["B"], apply_scale=0),
                      [rois[:1, 1:], deltas, im_info[:1]])
    ctr_x, ctr_y = 10 + 10.5 + 0.1 * 21, 20 + 10.5 - 0.2 * 21  # widths/heights are 21 (+1)
    half_w, half_h = 21.0, 10.5  # exp(log 2) doubles the width
    np.testing.assert_allclose(moved[0], [ctr_x - half_w, ctr_y - half_h, ctr_x + half_w,
                                          ctr_y + half_h], atol=1e-4)
    with pytest.raises(ShapeError):  # rotated boxes need R x 5K deltas
        run_op(make_op("BBoxTransform", ["R", "D", "I"], ["B"], rotated=1),
               [rois, zero, im_info])


def test_box_with_nms_limit_suppresses_and_limits() -> None:
    scores = np.array([[0.1, 0.9, 0.2], [0.1, 0.8, 0.7], [0.1, 0.3, 0.6],
                       [0.1, 0.04, 0.95]], np.float32)
    box = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60], [0, 0, 9, 9]],
                   np.float32)
    boxes = np.tile(box, (1, 3))
    op = make_op("BoxWithNMSLimit", ["S", "B"], ["OS", "OB", "OC", "BS", "K", "KS"], nms=0.5,
                 score_thresh=0.25)
    out_s, out_b, out_c, splits, keeps, sizes = run_op(op, [scores, boxes])
    # class 1: rows 0 (0.9), 1 overlaps 0 -> dropped, 2 (0.3); class 2: rows 3, 1 dropped, 2
    assert out_c.tolist() == [1, 1, 2, 2] and keeps.tolist() == [0, 2, 3, 2]
    np.testing.assert_allclose(out_s, [0.9, 0.3, 0.95, 0.6])
    np.testing.assert_array_equal(out_b, box[[0, 2, 3, 2]])
    assert splits.tolist() == [4.0] and sizes.tolist() == [[0, 2, 2]]
    limited = make_op("BoxWithNMSLimit", ["S", "B"], ["OS", "OB", "OC"], nms=0.5,
                      score_thresh=0.25, detections_per_im=2)
    out_s, _, out_c = run_op(limited, [scores, boxes])
    assert out_c.tolist() == [1, 2] and out_s.tolist() == pytest.approx([0.9, 0.95])


# --- BatchBoxCox / BatchBucketize / SinusoidPositionEncoding ---------------------------------
def test_batch_box_cox() -> None:
    data = RNG.uniform(0.5, 2.0, (4, 3)).astype(np.float32)
    lambda1 = np.array([0.0, 0.5, -1.0], np.float32)
    lambda2 = np.array([0.1, 0.0, 0.3], np.float32)
    (y,) = run_op(make_op("BatchBoxCox", ["D", "L1", "L2"], ["Y"]), [data, lambda1, lambda2])
    expected = np.stack([np.log(data[:, 0] + 0.1), (np.sqrt(data[:, 1]) - 1) / 0.5,
                         (1 / (data[:, 2] + 0.3) - 1) / -1.0], axis=1)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-5)


def test_batch_bucketize() -> None:
    feature = np.array([[1.0, 5.0, 0.2], [0.5, 2.0, 3.0]], np.float32)
    op = make_op("BatchBucketize", ["F", "I", "B", "L"], ["O"])
    (out,) = run_op(op, [feature, np.array([2, 0, 1], np.int32),
                         np.array([0.1, 1.0, 0.5, 2.0, 4.0], np.float32),
                         np.array([2, 0, 3], np.int32)])
    assert out.dtype == np.int32 and out.tolist() == [[1, 0, 3], [2, 0, 1]]
    (tail,) = run_op(op, [feature, np.array([0, 1], np.int32), np.array([2.0], np.float32),
                          np.array([1, 0], np.int32)])
    assert tail.tolist() == [[0, 0], [0, 0]]


def test_sinusoid_position_encoding() -> None:
    positions = np.array([[0, 0], [3, 3], [7, 7]], np.int64)
    op = make_op("SinusoidPositionEncoding", ["P"], ["Y"], embedding_size=4, alpha=100.0,
                 amplitude=2.0)
    (y,) = run_op(op, [positions])
    assert y.shape == (3, 2, 4) and y.dtype == np.float32
    k = np.arange(4)
    angles = positions[:, :1] / 100.0 ** (k / 4)
    expected = 2 * np.where(k % 2 == 1, np.cos(angles), np.sin(angles))
    np.testing.assert_allclose(y[:, 0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y[:, 1], y[:, 0])


# --- LC --------------------------------------------------------------------------------------
def lc_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow, m, _, kh, kw = w.shape
    y = np.zeros((x.shape[0], m, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i:i + kh, j:j + kw]
            y[:, :, i, j] = np.einsum("nckl,mckl->nm", patch, w[i, j]) + b[i, j]
    return y


def test_lc_with_padding_matches_reference() -> None:
    x = RNG.standard_normal((2, 2, 4, 3))
    w = RNG.standard_normal((5, 4, 3, 2, 2, 2))  # output 5×4 with kernel 2, pad 1
    b = RNG.standard_normal((5, 4, 3))
    op = make_op("LC", ["X", "W", "b"], ["Y"], kernel=2, pad=1)
    (y,) = run_op(op, [x, w, b])
    np.testing.assert_allclose(y, lc_reference(x, w, b, 1))
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("LCGradient", ["X", "W", "Y_grad"], ["W_grad", "b_grad", "X_grad"])]
    check_gradient(op, [x, w, b])
    with pytest.raises(ShapeError, match="filter"):
        run_op(op, [x, w[:4], b])


def test_lc_no_bias_nhwc_and_gradient_check() -> None:
    x = RNG.standard_normal((2, 2, 3, 3))
    w = RNG.standard_normal((2, 2, 3, 2, 2, 2))
    b = RNG.standard_normal((2, 2, 3))
    op = make_op("LC", ["X", "W", "b"], ["Y"], kernel=2)
    (y,) = run_op(op, [x, w, b])
    np.testing.assert_allclose(y, lc_reference(x, w, b, 0))
    check_gradient(op, [x, w, b])
    nhwc = make_op("LC", ["X", "W"], ["Y"], kernel=2, order="NHWC")
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    w_nhwc = np.ascontiguousarray(w.transpose(0, 1, 2, 4, 5, 3))
    (y2,) = run_op(nhwc, [x_nhwc, w_nhwc])
    np.testing.assert_allclose(y2, lc_reference(x, w, np.zeros_like(b), 0).transpose(0, 2, 3, 1))
    ops, _ = build_gradient(nhwc, ["Y_grad"])
    assert summary(ops) == [("LCGradient", ["X", "W", "Y_grad"], ["W_grad", "X_grad"])]
    check_gradient(nhwc, [x_nhwc, w_nhwc])


def test_shape_functions() -> None:
    from dpgraph.ir.registry import OPERATORS

    integral = make_op("IntegralImage", ["X"], ["Y"])
    assert OPERATORS.lookup("IntegralImage").shape_fn(integral, [(2, 3, 4, 5)], [1]) == [
        ((2, 3, 5, 6), 1)]
    sinusoid = make_op("SinusoidPositionEncoding", ["P"], ["Y"], embedding_size=8)
    assert OPERATORS.lookup("SinusoidPositionEncoding").shape_fn(sinusoid, [(4, 2)], [10]) == [
        ((4, 2, 8), 1)]


def test_lc1d_matches_reference() -> None:
    x = RNG.standard_normal((2, 2, 5))
    w = RNG.standard_normal((2, 3, 2, 2))  # output 2 positions with kernel 2, stride 2
    op = make_op("LC1D", ["X", "W"], ["Y"], kernels=[2], strides=[2])
    (y,) = run_op(op, [x, w])
    expected = np.stack([np.einsum("nck,mck->nm", x[:, :, 2 * p:2 * p + 2], w[p])
                         for p in range(2)], axis=-1)
    np.testing.assert_allclose(y, expected)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert summary(ops) == [("LC1DGradient", ["X", "W", "Y_grad"], ["W_grad", "X_grad"])]
    check_gradient(op, [x, w])
