"""Soft-NMS and rotated boxes in BoxWithNMSLimit, and the shared NMS helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgraph import core, workspace
from dpgraph.errors import OperatorError
from dpgraph.ops.nms import hard_nms, overlaps, soft_nms


def _run(scores: np.ndarray, boxes: np.ndarray, **args: object) -> list[np.ndarray]:
    workspace.FeedBlob("scores", scores.astype(np.float32))
    workspace.FeedBlob("boxes", boxes.astype(np.float32))
    outputs = ["out_scores", "out_boxes", "out_classes"]
    workspace.RunOperatorOnce(core.CreateOperator("BoxWithNMSLimit", ["scores", "boxes"],
                                                  outputs, **args))
    return [workspace.FetchBlob(name) for name in outputs]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float(overlaps(np.stack([a, b]).astype(np.float32), 0, np.array([1]), 0.0)[0])


# boxes of one class (column 1; column 0 is the background): B overlaps A by IoU 1/3
BOX_A, BOX_B, BOX_C = [0, 0, 10, 10], [5, 0, 15, 10], [40, 40, 50, 50]


def _one_class(scores: list[float], boxes: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([[0.0, v] for v in scores], np.float32)
    b = np.array([[0, 0, 0, 0] + box for box in boxes], np.float32)
    return s, b


def test_hard_nms_suppresses_the_overlapping_box() -> None:
    scores, boxes = _one_class([0.9, 0.8, 0.7], [BOX_A, BOX_B, BOX_C])
    out_scores, out_boxes, classes = _run(scores, boxes, nms=0.3, legacy_plus_one=0)
    np.testing.assert_allclose(out_scores, [0.9, 0.7])
    np.testing.assert_array_equal(out_boxes, [BOX_A, BOX_C])
    np.testing.assert_array_equal(classes, [1, 1])


def test_linear_soft_nms_rescales_instead_of_dropping() -> None:
    scores, boxes = _one_class([0.9, 0.8, 0.7], [BOX_A, BOX_B, BOX_C])
    out_scores, out_boxes, _ = _run(scores, boxes, nms=0.3, legacy_plus_one=0,
                                    soft_nms_enabled=1)
    # B is scaled by 1 - IoU(A, B) = 2/3 and now ranks after C
    np.testing.assert_allclose(out_scores, [0.9, 0.7, 0.8 * (1 - 1 / 3)], rtol=1e-6)
    np.testing.assert_array_equal(out_boxes, [BOX_A, BOX_C, BOX_B])


def test_gaussian_soft_nms_and_its_score_floor() -> None:
    scores, boxes = _one_class([0.9, 0.8], [BOX_A, BOX_B])
    out_scores, _, _ = _run(scores, boxes, legacy_plus_one=0, soft_nms_enabled=1,
                            soft_nms_method="gaussian", soft_nms_sigma=0.5)
    np.testing.assert_allclose(out_scores, [0.9, 0.8 * math.exp(-(1 / 9) / 0.5)], rtol=1e-6)
    out_scores, _, _ = _run(scores, boxes, legacy_plus_one=0, soft_nms_enabled=1,
                            soft_nms_method="gaussian", soft_nms_min_score_thres=0.7)
    np.testing.assert_allclose(out_scores, [0.9])  # B fell below the floor


def test_soft_nms_rescored_scores_decide_the_detection_limit() -> None:
    scores, boxes = _one_class([0.9, 0.8, 0.7], [BOX_A, BOX_B, BOX_C])
    out_scores, out_boxes, _ = _run(scores, boxes, nms=0.3, legacy_plus_one=0,
                                    soft_nms_enabled=1, detections_per_im=2)
    np.testing.assert_allclose(out_scores, [0.9, 0.7])
    np.testing.assert_array_equal(out_boxes, [BOX_A, BOX_C])


def test_an_unknown_soft_nms_method_is_refused() -> None:
    scores, boxes = _one_class([0.9], [BOX_A])
    with pytest.raises(OperatorError, match="soft_nms_method must be 'linear' or 'gaussian'"):
        _run(scores, boxes, soft_nms_enabled=1, soft_nms_method="hard")


def test_rotated_iou_of_known_shapes() -> None:
    box = np.array([0, 0, 4, 2, 0], np.float32)
    assert _iou(box, box) == pytest.approx(1.0)
    assert _iou(box, np.array([0, 0, 4, 2, 90], np.float32)) == pytest.approx(1 / 3)
    square = np.array([0, 0, 1, 1, 0], np.float32)
    octagon = 2 * (math.sqrt(2) - 1)  # a unit square and itself turned by 45 degrees
    assert _iou(square, np.array([0, 0, 1, 1, 45], np.float32)) == pytest.approx(
        octagon / (2 - octagon), rel=1e-5)
    assert _iou(square, np.array([5, 5, 1, 1, 30], np.float32)) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=8, max_size=8))
def test_rotated_boxes_at_angle_zero_overlap_as_upright_ones(values: list[int]) -> None:
    x1, y1, x2, y2 = sorted(values[0:2]) + sorted(values[2:4])
    u1, v1, u2, v2 = sorted(values[4:6]) + sorted(values[6:8])
    x1, x2, y1, y2 = min(x1, y1), max(x1, y1) + 1, min(x2, y2), max(x2, y2) + 1
    u1, u2, v1, v2 = min(u1, v1), max(u1, v1) + 1, min(u2, v2), max(u2, v2) + 1
    upright = _iou(np.array([x1, y1, x2, y2], np.float32), np.array([u1, v1, u2, v2],
                                                                     np.float32))
    rotated = _iou(np.array([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, 0], np.float32),
                   np.array([(u1 + u2) / 2, (v1 + v2) / 2, u2 - u1, v2 - v1, 0], np.float32))
    assert rotated == pytest.approx(upright, abs=1e-6)


def test_box_with_nms_limit_on_rotated_boxes() -> None:
    scores = np.array([[0.0, 0.9], [0.0, 0.8], [0.0, 0.7]], np.float32)
    boxes = np.array([[0] * 5 + [10, 10, 8, 4, 0],
                      [0] * 5 + [10, 10, 8, 4, 10],  # the first turned by 10 degrees
                      [0] * 5 + [10, 10, 8, 4, 90]], np.float32)
    out_scores, out_boxes, classes = _run(scores, boxes, rotated=1, nms=0.5)
    assert out_boxes.shape == (2, 5)
    np.testing.assert_allclose(out_scores, [0.9, 0.7])
    np.testing.assert_array_equal(out_boxes[:, 4], [0, 90])
    np.testing.assert_array_equal(classes, [1, 1])
    with pytest.raises(OperatorError, match="expected 10"):
        _run(scores, boxes[:, :8], rotated=1)


def test_soft_nms_helper_keeps_ties_in_caffe2s_order() -> None:
    boxes = np.array([BOX_C, BOX_A, BOX_B], np.float32)
    keep, rescored = soft_nms(boxes, np.array([0.5, 0.5, 0.5], np.float32),
                              np.array([0, 1, 2]), 0.5, 0.3, 0.001, 1, 0.0)
    assert keep == [0, 1, 2]
    np.testing.assert_allclose(rescored, [0.5, 0.5, 0.5 * 2 / 3], rtol=1e-6)
    order = np.array([1, 2, 0])
    np.testing.assert_array_equal(hard_nms(boxes, order, 0.3, 0, 0.0), [1, 0])
    np.testing.assert_array_equal(hard_nms(boxes, order, 0.3, 1, 0.0), [1])
