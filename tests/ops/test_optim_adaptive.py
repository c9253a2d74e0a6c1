"""Storm, SparseStorm, GFtrl and DecayAdagrad kernels against numpy references of Caffe2's
formulas (caffe2-jobs-facts §5.3), dense and sparse, on CPU and a virtual GPU."""

from __future__ import annotations

import numpy as np
import pytest
from _optim_util import DEVICES, run_op, two_virtual_gpus  # noqa: F401  (autouse fixture)

from dpgraph import core, workspace
from dpgraph.errors import ShapeError
from dpgraph.proto import caffe2_pb2


def _rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.RandomState(seed).uniform(low, high, shape).astype(np.float32)


def _storm_ref(w, m, gsq, g, lr, momentum, beta):
    new_g = gsq + np.sum(g.astype(np.float64) ** 2)
    nlr = lr * (beta + new_g) ** (-1.0 / 3.0)
    a = momentum * nlr ** 2
    new_m = g + (1 - a) * (m - g)
    return w + nlr * new_m, new_m, new_g


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_storm_dense(device):
    w, m, g = _rand(3, 4, seed=1), _rand(3, 4, seed=2), _rand(3, 4, seed=3)
    gsq, lr = np.array([0.5], np.float32), np.array([-0.1], np.float32)
    out = run_op("Storm", [w, m, gsq, g, lr], [0, 1, 2], device, momentum=5.0, beta=0.2)
    ref = _storm_ref(w, m, 0.5, g, -0.1, 5.0, 0.2)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], ref[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], [ref[2]], rtol=1e-5)
    assert out[0].dtype == np.float32 and out[2].shape == (1,)


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_sparse_storm_updates_indexed_rows_only(device):
    w, m = _rand(5, 2, seed=4), _rand(5, 2, seed=5)
    values, indices = _rand(2, 2, seed=6), np.array([3, 1], np.int64)
    gsq, lr = np.array([0.01], np.float32), np.array([-0.3], np.float32)
    out = run_op("SparseStorm", [w, m, gsq, values, indices, lr], [0, 1, 2], device)
    new_g = 0.01 + np.sum(values.astype(np.float64) ** 2)
    nlr = -0.3 * (0.1 + new_g) ** (-1 / 3)
    a = 10.0 * nlr ** 2
    exp_w, exp_m = w.copy(), m.copy()
    for k, r in enumerate(indices):
        exp_m[r] = values[k] + (1 - a) * (m[r] - values[k])
        exp_w[r] = w[r] + nlr * exp_m[r]
    np.testing.assert_allclose(out[0], exp_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], exp_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], [new_g], rtol=1e-5)
    untouched = [0, 2, 4]
    np.testing.assert_array_equal(out[0][untouched], w[untouched])


def _gftrl_ref(w, nz, g, alpha, beta, l1, l2):
    rows = w.shape[0]
    w2, g2 = w.reshape(rows, -1), g.reshape(rows, -1)
    n, z = nz.reshape(rows, -1, 2)[..., 0], nz.reshape(rows, -1, 2)[..., 1]
    out_w = np.zeros_like(w2, dtype=np.float64)
    new_n, new_z = np.zeros_like(out_w), np.zeros_like(out_w)
    for j in range(w2.shape[1]):
        for i in range(rows):
            new_n[i, j] = n[i, j] + g2[i, j] ** 2
            sigma = (np.sqrt(new_n[i, j]) - np.sqrt(n[i, j])) / alpha
            new_z[i, j] = z[i, j] + g2[i, j] - sigma * w2[i, j]
        norm = np.sqrt(np.sum(new_z[:, j] ** 2))
        for i in range(rows):
            if norm > l1 * np.sqrt(rows):
                out_w[i, j] = new_z[i, j] * (l1 * np.sqrt(rows) / norm - 1) / (
                    (beta + np.sqrt(new_n[i, j])) / alpha + l2)
    return out_w.reshape(w.shape), np.stack([new_n, new_z], -1).reshape(nz.shape)


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_gftrl_matches_group_lasso_reference(device):
    w, g = _rand(4, 3, seed=7), _rand(4, 3, seed=8, low=-3, high=3)
    nz = np.abs(_rand(4, 3, 2, seed=9))
    out = run_op("GFtrl", [w, nz, g], [0, 1], device, alpha=0.5, beta=1.0, lambda1=0.4,
               lambda2=0.01)
    ref_w, ref_nz = _gftrl_ref(w, nz, g, 0.5, 1.0, 0.4, 0.01)
    np.testing.assert_allclose(out[0], ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], ref_nz, rtol=1e-5, atol=1e-6)


def test_gftrl_zeroes_a_column_below_the_group_threshold():
    w = np.full((2, 2), 0.1, np.float32)
    g = np.array([[0.01, 5.0], [0.01, 5.0]], np.float32)
    nz = np.zeros((2, 2, 2), np.float32)
    out = run_op("GFtrl", [w, nz, g], [0, 1], DEVICES[0], alpha=1.0, beta=1.0, lambda1=1.0,
               lambda2=0.0)
    # column 0: z' = 0.01 - 0.01·0.1 per row, |z'| << λ1·√2; column 1: z' = 4.5 per row
    np.testing.assert_array_equal(out[0][:, 0], [0.0, 0.0])
    assert np.all(out[0][:, 1] != 0)


@pytest.mark.parametrize("bias_correction_first", [1, 0])
@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_decay_adagrad(device, bias_correction_first):
    w, m, g = _rand(2, 3, seed=10), _rand(2, 3, seed=11), _rand(2, 3, seed=12)
    v = np.abs(_rand(2, 3, seed=13))
    lr, it = np.array([-0.05], np.float32), np.array([4], np.int64)
    cpu = core.DeviceOption(caffe2_pb2.PROTO_CPU)
    workspace.FeedBlob("iter", it, cpu)
    names = ["w", "m", "v", "g", "lr"]
    for name, value in zip(names, [w, m, v, g, lr]):
        workspace.FeedBlob(name, value, device)
    workspace.RunOperatorOnce(core.CreateOperator(
        "DecayAdagrad", names + ["iter"], ["w", "m", "v"], device_option=device, beta1=0.8,
        beta2=0.5, epsilon=0.1, weight_decay=0.01,
        bias_correction_first=bias_correction_first))
    t = 5
    c = 1 - 0.8 ** t if bias_correction_first else 1.0
    exp_m = 0.8 * m + 0.2 * g
    exp_v = v + g * g
    exp_w = w + (-0.05) * (exp_m / c / (np.sqrt(exp_v) + 0.1) + 0.01 * w)
    np.testing.assert_allclose(workspace.FetchBlob("w"), exp_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("m"), exp_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("v"), exp_v, rtol=1e-5, atol=1e-6)


def test_shape_mismatch_names_the_op_and_blobs():
    with pytest.raises(ShapeError, match="Storm") as info:
        run_op("Storm", [_rand(2, 2), _rand(3), np.ones(1, np.float32), _rand(2, 2),
                       np.ones(1, np.float32)], [0, 1, 2], DEVICES[0])
    assert "in1" in str(info.value)


def test_ops_have_no_gradient_and_declare_inplace():
    from dpgraph.ir.registry import OPERATORS

    for op_type in ("Storm", "SparseStorm", "GFtrl", "DecayAdagrad"):
        schema = OPERATORS.get(op_type)
        assert schema is not None and schema.gradient is None
        assert (0, 0) in set(map(tuple, schema.inplace))


def test_row_wise_counter_decays_by_half_life():
    cpu = DEVICES[0]
    prev = np.array([0, 2, 0], np.int64)
    counter = np.array([0.0, 3.0, 1.0], np.float64)
    out = run_op("RowWiseCounter", [prev, counter, np.array([1, 0, 1], np.int64),
                                  np.array([6], np.int64)], [0, 1], cpu, counter_halflife=2)
    np.testing.assert_array_equal(out[0], [6, 6, 0])
    c1 = 1 + 2 ** (-4 / 2) * 3.0            # first touch of row 1: Δ = 4
    np.testing.assert_allclose(out[1], [1 + 2 ** (-6 / 2) * 0.0, 1 + 1.0 * c1, 1.0])


# --- Wngrad / Adadelta (kernels in ops/optim.py, used by the final builders) -------------------
@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_wngrad_dense(device):
    w, g = _rand(3, 2, seed=20), _rand(3, 2, seed=21)
    b, lr = np.array([2.0], np.float32), np.array([-0.5], np.float32)
    out = run_op("Wngrad", [w, b, g, lr], [0, 1, "eff", "upd"], device, epsilon=0.1)
    np.testing.assert_allclose(out[0], w + (-0.5) * g / 2.1, rtol=1e-5)
    np.testing.assert_allclose(out[1], [2.0 + np.sum(g.astype(np.float64) ** 2) / 2.1],
                               rtol=1e-5)
    np.testing.assert_allclose(out[2], [-0.5 / 2.1], rtol=1e-5)
    np.testing.assert_allclose(out[3], (-0.5 / 2.1) * g, rtol=1e-5)


def test_sparse_wngrad_updates_indexed_rows():
    w, values = _rand(4, 2, seed=22), _rand(2, 2, seed=23)
    b, lr = np.array([3.0], np.float32), np.array([-0.5], np.float32)
    out = run_op("SparseWngrad", [w, b, np.array([2, 0], np.int64), values, lr], [0, 1],
               DEVICES[0], epsilon=1e-9)
    expected = w.copy()
    expected[[2, 0]] += (-0.5) * values / 3.0
    np.testing.assert_allclose(out[0], expected, rtol=1e-5)
    np.testing.assert_allclose(out[1], [3.0 + np.sum(values.astype(np.float64) ** 2) / 3.0],
                               rtol=1e-5)


def _adadelta_ref(w, h, d, g, lr, eps, decay):
    new_h = decay * h + (1 - decay) * g * g
    ng = np.sqrt(d + eps) / np.sqrt(new_h + eps) * g
    return w + lr * ng, new_h, decay * d + (1 - decay) * ng * ng


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_adadelta_dense_and_sparse(device):
    w, g = _rand(3, 2, seed=24), _rand(3, 2, seed=25)
    h, d = np.abs(_rand(3, 2, seed=26)), np.abs(_rand(3, 2, seed=27))
    lr = np.array([-0.3], np.float32)
    out = run_op("Adadelta", [w, h, d, g, lr], [0, 1, 2], device, epsilon=1e-3, decay=0.9)
    for got, want in zip(out, _adadelta_ref(w, h, d, g, -0.3, 1e-3, 0.9)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    idx = np.array([1], np.int64)
    out = run_op("SparseAdadelta", [w, h, d, idx, g[1:2], lr], [0, 1, 2], device, epsilon=1e-3,
               decay=0.9)
    ref = _adadelta_ref(w[1], h[1], d[1], g[1], -0.3, 1e-3, 0.9)
    for got, want, orig in zip(out, ref, (w, h, d)):
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.delete(got, 1, axis=0), np.delete(orig, 1, axis=0))
