"""LpPool, Im2Col/Col2Im, RMSNorm, RMACRegions, RoIAlignRotated and rotated BBoxTransform:
numpy references written from the op descriptions and numeric gradient checks."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(11)


def _lp_pool_reference(x: np.ndarray, k: int, s: int, pad: int, p: float) -> np.ndarray:
    n, c, h, w = x.shape
    xpad = np.zeros((n, c, h + 2 * pad, w + 2 * pad))
    xpad[:, :, pad:pad + h, pad:pad + w] = x
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xpad[:, :, i * s:i * s + k, j * s:j * s + k]
            y[:, :, i, j] = (np.abs(window) ** p).sum(axis=(2, 3)) ** (1.0 / p)
    return y


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("p", [2.0, 3.0])
def test_lp_pool_matches_reference_and_gradient(order: str, p: float) -> None:
    x = RNG.uniform(0.2, 1.0, (2, 3, 5, 6)).astype(np.float32)
    ref = _lp_pool_reference(x.astype(np.float64), 3, 2, 1, p)
    feed = x if order == "NCHW" else x.transpose(0, 2, 3, 1).copy()
    op = CreateOperator("LpPool", ["X"], ["Y"], kernel=3, stride=2, pad=1, p=p, order=order)
    (y,) = run_op(op, [feed])
    got = y if order == "NCHW" else y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    check_gradient(op, [feed])


def test_lp_pool_global_and_empty_batch() -> None:
    x = RNG.uniform(-1, 1, (2, 2, 4, 4)).astype(np.float32)
    (y,) = run_op(CreateOperator("LpPool", ["X"], ["Y"], global_pooling=True), [x])
    np.testing.assert_allclose(y[:, :, 0, 0], np.sqrt((x ** 2).sum(axis=(2, 3))), rtol=1e-5)
    (y,) = run_op(CreateOperator("LpPool", ["X"], ["Y"], kernel=2), [x[:0]])
    assert y.shape == (0, 2, 3, 3)


def _im2col_reference(x: np.ndarray, k: int, s: int, d: int, pad: int) -> np.ndarray:
    n, c, h, w = x.shape
    xpad = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ext = d * (k - 1) + 1
    oh, ow = (h + 2 * pad - ext) // s + 1, (w + 2 * pad - ext) // s + 1
    cols = np.zeros((n, c, k, k, oh, ow), x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xpad[:, :, i * d:i * d + s * (oh - 1) + 1:s,
                                    j * d:j * d + s * (ow - 1) + 1:s]
    return cols.reshape(n, c * k * k, oh, ow)


def test_im2col_layouts_col2im_and_gradients() -> None:
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    args = dict(kernel=3, stride=2, dilation=2, pad=1)
    (cols,) = run_op(CreateOperator("Im2Col", ["X"], ["Y"], **args), [x])
    ref = _im2col_reference(x, 3, 2, 2, 1)
    np.testing.assert_array_equal(cols, ref)
    nhwc = x.transpose(0, 2, 3, 1).copy()
    (cols_nhwc,) = run_op(CreateOperator("Im2Col", ["X"], ["Y"], order="NHWC", **args), [nhwc])
    n, _, oh, ow = ref.shape
    np.testing.assert_array_equal(
        cols_nhwc.reshape(n, oh, ow, 3, 3, 3).transpose(0, 5, 3, 4, 1, 2).reshape(ref.shape), ref)
    # Col2Im is Im2Col's adjoint: <Im2Col(x), c> == <x, Col2Im(c)>
    c = RNG.standard_normal(cols.shape).astype(np.float32)
    (back,) = run_op(CreateOperator("Col2Im", ["C", "Z"], ["X"], **args), [c, x])
    assert back.shape == x.shape
    np.testing.assert_allclose((cols * c).sum(), (x * back).sum(), rtol=1e-4)
    (back_nhwc,) = run_op(CreateOperator("Col2Im", ["C", "Z"], ["X"], order="NHWC", **args),
                          [c.reshape(n, 3, 3, 3, oh, ow).transpose(0, 4, 5, 2, 3, 1).copy(),
                           nhwc])
    np.testing.assert_allclose(back_nhwc.transpose(0, 3, 1, 2), back, rtol=1e-5, atol=1e-6)
    check_gradient(CreateOperator("Im2Col", ["X"], ["Y"], **args), [x])
    check_gradient(CreateOperator("Col2Im", ["C", "Z"], ["X"], **args), [c, x],
                   inputs_to_check=[0])


def test_im2col_rejects_kernel_larger_than_image() -> None:
    with pytest.raises(Exception, match="smaller than the dilated kernel"):
        run_op(CreateOperator("Im2Col", ["X"], ["Y"], kernel=5, dilation=2),
               [np.zeros((1, 1, 6, 6), np.float32)])


@pytest.mark.parametrize("axis", [1, 2])
def test_rms_norm_reference_and_gradients(axis: int) -> None:
    x = RNG.standard_normal((3, 2, 4)) * 2.0 + 1.0
    n = int(np.prod(x.shape[axis:]))
    gamma, beta = RNG.standard_normal(n), RNG.standard_normal(n)
    op = CreateOperator("RMSNorm", ["X", "gamma", "beta"], ["Y", "rrms"], eps=1e-3, axis=axis)
    y, rrms = run_op(op, [x, gamma, beta])
    xm = x.reshape(-1, n)
    ref_r = 1.0 / np.sqrt((xm ** 2).mean(axis=1) + 1e-3)
    np.testing.assert_allclose(rrms, ref_r.reshape(x.shape[:axis]), rtol=1e-7)
    np.testing.assert_allclose(y, (xm * ref_r[:, None] * gamma + beta).reshape(x.shape),
                               rtol=1e-7)
    check_gradient(op, [x, gamma, beta], rtol=1e-3, atol=1e-5)
    y, rrms = run_op(op, [x[:0], gamma, beta])
    assert y.shape == (0, 2, 4) and rrms.shape == (0, 2, 4)[:axis]


def test_rmac_regions_hand_computed_grid() -> None:
    # H=2, W=4: step 2 (overlap gap 0.1) -> 3 regions of side 2 at scale 1, 4x2 of side 1
    x = np.zeros((2, 1, 2, 4), np.float32)
    (rois,) = run_op(CreateOperator("RMACRegions", ["X"], ["R"], scales=2, overlap=0.4), [x])
    grid = [[0, 0, 1, 1], [1, 0, 2, 1], [2, 0, 3, 1]]
    grid += [[i, j, i, j] for i in range(4) for j in range(2)]
    expected = [[b] + g for b in (0, 1) for g in grid]
    assert rois.dtype == np.float32 and rois.tolist() == expected
    (empty,) = run_op(CreateOperator("RMACRegions", ["X"], ["R"]), [x[:0]])
    assert empty.shape == (0, 5)
    (square,) = run_op(CreateOperator("RMACRegions", ["X"], ["R"], scales=1),
                       [np.zeros((1, 1, 3, 3), np.float32)])
    assert square.tolist() == [[0, 0, 0, 2, 2]]


def _roi_align(x: np.ndarray, rois_xyxy: np.ndarray, pooled: int) -> np.ndarray:
    op = CreateOperator("RoIAlign", ["X", "R"], ["Y"], pooled_h=pooled, pooled_w=pooled,
                        sampling_ratio=0)
    return run_op(op, [x, rois_xyxy])[0]


def test_roi_align_rotated_matches_roi_align_at_zero_and_right_angles() -> None:
    x = RNG.standard_normal((2, 2, 12, 10)).astype(np.float32)
    rois = np.array([[0, 5.0, 6.0, 4.0, 3.0, 0.0], [1, 4.5, 5.5, 3.0, 5.0, 0.0]], np.float32)
    op = CreateOperator("RoIAlignRotated", ["X", "R"], ["Y"], pooled_h=3, pooled_w=3,
                        sampling_ratio=0)
    (y,) = run_op(op, [x, rois])
    xyxy = rois[:, :5].copy()
    xyxy[:, 1:3] -= rois[:, 3:5] / 2
    xyxy[:, 3:5] = xyxy[:, 1:3] + rois[:, 3:5]
    np.testing.assert_allclose(y, _roi_align(x, xyxy, 3), rtol=1e-5, atol=1e-5)
    # 180 degrees: the box turned half way samples the point-mirrored map, bins reversed
    h, w = x.shape[2:]
    turned = rois.copy()
    turned[:, 5] = 180.0
    (y180,) = run_op(op, [x, turned])
    mirrored = x[:, :, ::-1, ::-1].copy()
    moved = xyxy.copy()
    moved[:, 1], moved[:, 3] = w - 1 - xyxy[:, 3], w - 1 - xyxy[:, 1]
    moved[:, 2], moved[:, 4] = h - 1 - xyxy[:, 4], h - 1 - xyxy[:, 2]
    np.testing.assert_allclose(y180, _roi_align(mirrored, moved, 3), rtol=1e-4, atol=1e-4)


def test_roi_align_rotated_nhwc_empty_and_gradient() -> None:
    x = RNG.standard_normal((1, 2, 6, 7)).astype(np.float32)
    rois = np.array([[0, 3.0, 2.5, 3.0, 2.0, 30.0], [0, 2.0, 3.0, 2.5, 2.5, -60.0]], np.float32)
    args = dict(pooled_h=2, pooled_w=2, sampling_ratio=2, spatial_scale=1.0)
    op = CreateOperator("RoIAlignRotated", ["X", "R"], ["Y"], **args)
    (y,) = run_op(op, [x, rois])
    (y_nhwc,) = run_op(CreateOperator("RoIAlignRotated", ["X", "R"], ["Y"], order="NHWC",
                                      **args), [x.transpose(0, 2, 3, 1).copy(), rois])
    np.testing.assert_allclose(y_nhwc.transpose(0, 3, 1, 2), y, rtol=1e-6)
    (empty,) = run_op(op, [x, np.zeros((0, 6), np.float32)])
    assert empty.shape == (0, 2, 2, 2)
    check_gradient(op, [x, rois], inputs_to_check=[0])


def _bbox(rois: np.ndarray, deltas: np.ndarray, im_info: np.ndarray, **args) -> np.ndarray:
    op = CreateOperator("BBoxTransform", ["R", "D", "I"], ["B"], **args)
    return run_op(op, [rois, deltas, im_info])[0]


def test_bbox_transform_rotated_deltas_angle_bound_and_clip() -> None:
    rois = np.array([[0, 50.0, 40.0, 20.0, 10.0, 80.0], [0, 5.0, 5.0, 30.0, 20.0, 0.5]],
                    np.float32)
    deltas = np.array([[0.1, -0.2, np.log(2.0), 0.0, np.pi / 9],
                       [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    im_info = np.array([[100, 120, 1.0]], np.float32)
    out = _bbox(rois, deltas, im_info, rotated=1, apply_scale=0, legacy_plus_one=1)
    # box 0: centre moves by (0.1*20, -0.2*10), width doubles, 80 + 20 = 100 -> -80
    np.testing.assert_allclose(out[0], [52.0, 38.0, 40.0, 10.0, -80.0], rtol=1e-5)
    # box 1 is nearly upright (|0.5| <= 1): corners (-9.5, -4.5, 19.5, 14.5) clip at 0
    np.testing.assert_allclose(out[1], [9.75, 7.25, 20.5, 15.5, 0.5], rtol=1e-5)
    unbounded = _bbox(rois, deltas, im_info, rotated=1, angle_bound_on=0,
                      clip_angle_thresh=0.1)
    np.testing.assert_allclose(unbounded[:, 4], [100.0, 0.5], rtol=1e-5)
    np.testing.assert_allclose(unbounded[1], rois[1, 1:], rtol=1e-6)  # not clipped
    with pytest.raises(Exception, match="multiple of"):
        _bbox(rois, deltas, im_info, rotated=1, angle_bound_lo=-90, angle_bound_hi=0)


def test_bbox_transform_divides_by_scale_even_without_apply_scale() -> None:
    rois = np.array([[0, 10, 20, 30, 40]], np.float32)
    im_info = np.array([[100, 100, 2.0]], np.float32)
    zero = np.zeros((1, 4), np.float32)
    kept = _bbox(rois, zero, im_info, legacy_plus_one=1)
    np.testing.assert_allclose(kept, [[10, 20, 30, 40]], atol=1e-4)
    unscaled = _bbox(rois, zero, im_info, legacy_plus_one=1, apply_scale=0)
    np.testing.assert_allclose(unscaled, [[5, 10, 15, 20]], atol=1e-4)


def _nms_op(outputs: int = 3, **args):
    names = ["scores", "boxes", "classes", "splits", "keeps", "keeps_size"][:outputs]
    return CreateOperator("BoxWithNMSLimit", ["S", "B", "BS"][:2 + ("splits" in args)],
                          names, **{k: v for k, v in args.items() if k != "splits"})


def test_box_with_nms_limit_background_layouts() -> None:
    box = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60]], np.float32)
    fg = np.array([[0.9, 0.2], [0.8, 0.7], [0.3, 0.6]], np.float32)  # 2 foreground classes
    bg = np.full((3, 1), 0.5, np.float32)
    # boxes without the background block, scores with background last
    scores = np.concatenate([fg, bg], axis=1)
    boxes = np.tile(box, (1, 2))
    op = _nms_op(6, nms=0.5, score_thresh=0.25, input_boxes_include_bg_cls=0,
                 output_classes_include_bg_cls=0)
    out_s, out_b, out_c, splits, keeps, sizes = run_op(op, [scores, boxes])
    assert out_s.tolist() == pytest.approx([0.9, 0.3, 0.7, 0.6])
    assert out_c.tolist() == [0, 0, 1, 1] and splits.tolist() == [4.0]
    np.testing.assert_array_equal(out_b, box[[0, 2, 1, 2]])
    assert keeps.tolist() == [0, 2, 1, 2] and sizes.tolist() == [[0, 2, 2]]
    # class-agnostic boxes with the background score column first, per-class top-N limit
    scores_bg_first = np.concatenate([bg, fg], axis=1)
    op = _nms_op(3, nms=0.5, score_thresh=0.25, cls_agnostic_bbox_reg=1, detections_per_im=1)
    out_s, out_b, out_c = run_op(op, [scores_bg_first, box])
    assert out_s.tolist() == pytest.approx([0.9]) and out_c.tolist() == [1.0]
    with pytest.raises(Exception, match="columns"):
        run_op(_nms_op(3), [scores_bg_first, np.tile(box, (1, 2))])
