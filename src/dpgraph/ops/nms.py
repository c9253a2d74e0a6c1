"""Non-maximum suppression as Caffe2's detection ops run it: greedy (hard) NMS and Soft-NMS,
over upright boxes ``(x1, y1, x2, y2)`` or rotated boxes ``(ctr_x, ctr_y, w, h, angle°)``.

Upright overlaps follow ``legacy_plus_one`` (widths ``x2 - x1 + 1``); rotated boxes have
area ``w * h`` and their intersection is the area of the two rectangles' clipped polygon.
"""

from __future__ import annotations

import math

import numpy as np

SOFT_NMS_METHODS = {"linear": 1, "gaussian": 2}


def overlaps(boxes: np.ndarray, i: int, others: np.ndarray, plus_one: float) -> np.ndarray:
    """IoU of box ``i`` with the boxes ``others`` (indices into ``boxes``)."""
    if boxes.shape[1] == 5:
        return np.array([_rotated_iou(boxes[i], boxes[j]) for j in others.tolist()],
                        np.float64)
    b = boxes  # in the boxes' own precision, as Caffe2's float kernels
    area = (b[:, 2] - b[:, 0] + plus_one) * (b[:, 3] - b[:, 1] + plus_one)
    w = np.maximum(0.0, np.minimum(b[i, 2], b[others, 2])
                   - np.maximum(b[i, 0], b[others, 0]) + plus_one)
    h = np.maximum(0.0, np.minimum(b[i, 3], b[others, 3])
                   - np.maximum(b[i, 1], b[others, 1]) + plus_one)
    inter = w * h
    return inter / (area[i] + area[others] - inter)


def soft_nms(boxes: np.ndarray, scores: np.ndarray, indices: np.ndarray, sigma: float,
             overlap_thresh: float, score_thresh: float, method: int,
             plus_one: float = 1.0) -> tuple[list[int], np.ndarray]:
    """Soft-NMS over ``indices``: repeatedly keep the best remaining box and scale the
    others' scores by ``1 - IoU`` where IoU > ``overlap_thresh`` (method 1, linear) or
    ``exp(-IoU² / sigma)`` (method 2, gaussian), dropping those that fall below
    ``score_thresh``.  Returns the kept indices in order and the rescored ``scores``."""
    rescored = scores.astype(np.float32).copy()
    pending = np.asarray(indices, np.int64).copy()
    keep: list[int] = []
    while pending.size:
        best = int(np.argmax(rescored[pending]))  # the first of equal scores
        i = int(pending[best])
        keep.append(i)
        pending[0], pending[best] = pending[best], pending[0]
        rest = pending[1:]
        iou = overlaps(boxes, i, rest, plus_one)
        if method == 2:
            weight = np.exp(-(iou * iou) / sigma)
        else:
            weight = np.where(iou > overlap_thresh, 1.0 - iou, 1.0)
        rescored[rest] = (rescored[rest] * weight).astype(np.float32)
        pending = rest[rescored[rest] >= score_thresh]
    return keep, rescored


def hard_nms(boxes: np.ndarray, order: np.ndarray, threshold: float, top_n: int = 0,
             plus_one: float = 1.0) -> np.ndarray:
    """Greedy NMS visiting boxes in ``order`` (best first): a box overlapping a kept one
    by IoU > ``threshold`` is suppressed; at most ``top_n`` kept when it is > 0."""
    order = np.asarray(order, np.int64)
    keep: list[int] = []
    while order.size and (top_n <= 0 or len(keep) < top_n):
        i, rest = int(order[0]), order[1:]
        keep.append(i)
        order = rest[overlaps(boxes, i, rest, plus_one) <= threshold]
    return np.array(keep, np.int64)


# --- rotated rectangles --------------------------------------------------------------------
def _corners(box: np.ndarray) -> list[tuple[float, float]]:
    """The four corners, counter-clockwise, of ``(ctr_x, ctr_y, w, h, angle°)``."""
    cx, cy, w, h, angle = (float(v) for v in box)
    theta = math.radians(angle)
    cos, sin = math.cos(theta), math.sin(theta)
    half = [(-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)]
    # image coordinates (y down): a positive angle turns the box counter-clockwise
    return [(cx + x * cos + y * sin, cy - x * sin + y * cos) for x, y in half]


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _clip(polygon: list[tuple[float, float]], a: tuple[float, float],
          b: tuple[float, float], sign: float) -> list[tuple[float, float]]:
    """The part of ``polygon`` on the inner side of edge ``a -> b`` (Sutherland-Hodgman)."""
    out: list[tuple[float, float]] = []
    for k, p in enumerate(polygon):
        q = polygon[(k + 1) % len(polygon)]
        side_p, side_q = sign * _cross(a, b, p), sign * _cross(a, b, q)
        if side_p >= 0:
            out.append(p)
        if (side_p >= 0) != (side_q >= 0) and side_p != side_q:
            t = side_p / (side_p - side_q)
            out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out


def _area(polygon: list[tuple[float, float]]) -> float:
    return abs(sum(p[0] * q[1] - q[0] * p[1]
                   for p, q in zip(polygon, polygon[1:] + polygon[:1]))) / 2


def _rotated_iou(first: np.ndarray, second: np.ndarray) -> float:
    area_a, area_b = float(first[2] * first[3]), float(second[2] * second[3])
    if area_a <= 0 or area_b <= 0:
        return 0.0
    clip = _corners(second)
    sign = 1.0 if _cross(clip[0], clip[1], clip[2]) > 0 else -1.0
    polygon = _corners(first)
    for k in range(4):
        polygon = _clip(polygon, clip[k], clip[(k + 1) % 4], sign)
        if not polygon:
            return 0.0
    inter = _area(polygon)
    return inter / (area_a + area_b - inter)
