"""The final Caffe2 arguments of the Adagrad family, SparseAdam, SparseWngrad and Adadelta
(caffe2-jobs-facts §5.3): weight_decay (with the row counter), RAdam, the
epsilon-free SparseWngrad moment and Adadelta's argument checks, against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from _optim_util import DEVICES, run_op, two_virtual_gpus  # noqa: F401  (autouse fixture)

from dpgraph.errors import OperatorError


def _rand(*shape, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_adagrad_weight_decay(device):
    w, g = _rand(3, 2, seed=1), _rand(3, 2, seed=2)
    h = np.abs(_rand(3, 2, seed=3))
    lr, eps, wd = 0.3, 0.1, 0.2
    out = run_op("Adagrad", [w, h, g, np.array([lr], np.float32)], [0, 1, "eff", "upd"],
               device, epsilon=eps, weight_decay=wd)
    g2 = g + wd * w
    new_h = h + g2 * g2
    eff = lr / (np.sqrt(new_h) + eps)
    for got, ref in zip(out, (w + eff * g2, new_h, eff, eff * g2)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row_wise", [False, True])
@pytest.mark.parametrize("halflife", [-1, 4])
def test_sparse_adagrad_weight_decay_and_counter(row_wise, halflife):
    w, g = _rand(5, 3, seed=4), _rand(3, 3, seed=5)
    h = np.abs(_rand(5, seed=6)) if row_wise else np.abs(_rand(5, 3, seed=6))
    idx = np.array([4, 0, 2], np.int64)
    count = np.array([2.0, 0.0, 0.5, 1.0, 8.0])
    lr, eps, wd = 0.3, 0.1, 0.2
    inputs = [w, h, idx, g, np.array([lr], np.float32)]
    if halflife > 0:
        inputs.append(count)
    op = "RowWiseSparseAdagrad" if row_wise else "SparseAdagrad"
    new_w, new_h = run_op(op, inputs, [0, 1], epsilon=eps, weight_decay=wd,
                        counter_halflife=halflife)
    ref_w, ref_h = w.astype(np.float64), h.astype(np.float64)
    for i, r in enumerate(idx):
        scale = halflife / count[r] if halflife > 0 and count[r] > 0 else 1.0
        g2 = g[i] + wd * scale * w[r]
        ref_h[r] = h[r] + (np.mean(g2 * g2) if row_wise else g2 * g2)
        ref_w[r] = w[r] + lr * g2 / (np.sqrt(ref_h[r]) + eps)
    np.testing.assert_allclose(new_w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_h, ref_h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("iteration", [1, 400])  # rho_t < 5, then rho_t >= 5
def test_sparse_adam_radam(iteration):
    w, m, g = _rand(4, 2, seed=7), _rand(4, 2, seed=8), _rand(2, 2, seed=9)
    v = np.abs(_rand(4, 2, seed=10))
    idx = np.array([3, 1], np.int64)
    b1, b2, eps, lr = 0.9, 0.999, 1e-3, 0.05
    new_w, new_m, new_v = run_op(
        "SparseAdam", [w, m, v, idx, g, np.array([lr], np.float32),
                       np.array([iteration], np.int64)], [0, 1, 2], cpu=(6,),
        beta1=b1, beta2=b2, epsilon=eps, enableRAdam=1)
    t = iteration + 1
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    ref_w = w.astype(np.float64)
    for i, r in enumerate(idx):
        m2 = b1 * m[r] + (1 - b1) * g[i]
        v2 = b2 * v[r] + (1 - b2) * g[i] ** 2
        np.testing.assert_allclose(new_m[r], m2, rtol=1e-5)
        np.testing.assert_allclose(new_v[r], v2, rtol=1e-5)
        if rho_t >= 5:
            rect = np.sqrt((rho_t - 4) * (rho_t - 2) / rho_t) * np.sqrt(
                rho_inf / ((rho_inf - 4) * (rho_inf - 2)))
            c = np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            ref_w[r] = w[r] + lr * rect * c * m2 / (np.sqrt(v2) + eps)
        else:
            ref_w[r] = w[r] + lr * m2 / (1 - b1 ** t)
    assert (rho_t >= 5) == (iteration == 400)
    np.testing.assert_allclose(new_w, ref_w, rtol=1e-5, atol=1e-6)


def test_sparse_wngrad_moment_has_no_epsilon():
    w, g = np.zeros((5, 1), np.float32), np.ones((4, 1), np.float32)
    idx = np.array([0, 1, 2, 3], np.int64)
    new_w, new_b = run_op("SparseWngrad", [w, np.array([0.5], np.float32), idx, g,
                                         np.array([0.5], np.float32)], [0, 1], epsilon=0.5)
    np.testing.assert_allclose(new_b, [0.5 + 4 / 0.5])  # Caffe2's 8.5, not 0.5 + 4 / 1
    np.testing.assert_allclose(new_w[:4], 0.5 / (0.5 + 0.5))


@pytest.mark.parametrize("op_type", ["Adadelta", "SparseAdadelta"])
@pytest.mark.parametrize("args,match", [({"decay": 1.0}, "decay"), ({"decay": 0.0}, "decay"),
                                        ({"epsilon": -1e-3}, "epsilon")])
def test_adadelta_checks_decay_and_epsilon(op_type, args, match):
    w = _rand(3, 2)
    inputs = [w, np.abs(w), np.abs(w)]
    if op_type == "SparseAdadelta":
        inputs += [np.array([0], np.int64), _rand(1, 2)]
    else:
        inputs += [_rand(3, 2)]
    inputs.append(np.array([0.1], np.float32))
    with pytest.raises(OperatorError, match=match):
        run_op(op_type, inputs, [0, 1, 2], **args)
