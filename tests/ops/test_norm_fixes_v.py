"""SpatialBNGradient with an empty multi-batch input and LpNorm's average over an empty
tensor (Caffe2's behaviour on empty inputs)."""

from __future__ import annotations

import numpy as np

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import run_op


def test_spatial_bn_multi_batch_gradient_empty_batch_gives_zero_dscale_dbias() -> None:
    c = 3
    rng = np.random.default_rng(0)
    x = np.zeros((0, c, 2, 2), np.float32)
    vecs = [rng.standard_normal(c).astype(np.float32) for _ in range(5)]
    op = CreateOperator("SpatialBNGradient",
                        ["X", "scale", "dY", "mean", "rstd", "dscale_sum", "dbias_sum"],
                        ["dX", "dscale", "dbias"], num_batches=2)
    dx, dscale, dbias = run_op(op, [x, vecs[0], x.copy(), vecs[1], vecs[2], vecs[3], vecs[4]])
    assert dx.shape == x.shape
    assert dscale.tolist() == [0.0] * c and dbias.tolist() == [0.0] * c
    x1 = rng.standard_normal((1, c, 2, 2)).astype(np.float32)
    _, dscale, dbias = run_op(op, [x1, vecs[0], x1, vecs[1], vecs[2], vecs[3], vecs[4]])
    np.testing.assert_allclose(dscale, vecs[3] / 2, rtol=1e-6)
    np.testing.assert_allclose(dbias, vecs[4] / 2, rtol=1e-6)


def test_lp_norm_average_of_empty_tensor_is_nan() -> None:
    empty = np.array([], np.float32)
    (l1,) = run_op(CreateOperator("LpNorm", ["X"], ["Y"], p=1), [empty])
    (avg,) = run_op(CreateOperator("LpNorm", ["X"], ["Y"], p=2, average=1), [empty])
    assert l1.tolist() == [0.0] and np.isnan(avg[0]) and avg.dtype == np.float32
    x = np.array([1.0, -2.0, 3.0], np.float32)
    (avg,) = run_op(CreateOperator("LpNorm", ["X"], ["Y"], p=2, average=1), [x])
    np.testing.assert_allclose(avg, [14.0 / 3], rtol=1e-6)
