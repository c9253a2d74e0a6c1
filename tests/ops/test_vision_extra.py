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
