"""Optimizer ops: counters, learning rates, weighted sums and parameter updates."""

from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import NoGradientError, ShapeError
from dpgraph.ops._sparse_rows import occurrence_layers
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.optim import Mutex
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(3)
F32 = np.float32


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F32)


# --- counters --------------------------------------------------------------------------------
def test_iter_increments_input_previous_value_or_starts_at_zero() -> None:
    op = make_op("Iter", ["it"], ["it"])
    (out,) = run_op(op, [np.array([41], np.int64)])
    assert out.dtype == np.int64 and out.tolist() == [42]
    legacy = make_op("Iter", [], ["it"])
    assert run_ops([legacy], {"it": np.array([5], np.int64)})["it"].tolist() == [6]
    assert run_ops([legacy, legacy], {})["it"].tolist() == [2]


def test_atomic_iter_is_atomic_under_threads() -> None:
    (mutex,) = run_op(make_op("CreateMutex", [], ["m"]), [])
    assert isinstance(mutex, Mutex)
    counter = np.zeros(1, np.int64)
    op = make_op("AtomicIter", ["m", "it"], ["it"])

    def work() -> None:
        for _ in range(200):
            run_op(op, [mutex, counter])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.tolist() == [800]
    from dpgraph.ops.stats import GLOBAL_REGISTRY

    stat = b"atomic_iter/stats/it/num_iter"  # Caffe2's exported run counter
    before = {k: v for k, v, _ in GLOBAL_REGISTRY.publish(reset=False)}.get(stat, 0)
    (bumped,) = run_op(make_op("AtomicIter", ["m", "it"], ["other"]), [mutex, counter])
    assert {k: v for k, v, _ in GLOBAL_REGISTRY.publish(reset=False)}[stat] == before + 1
    assert bumped.tolist() == [801] and counter.tolist() == [800]
    with pytest.raises(ShapeError, match="mutex"):
        run_op(op, [counter, counter])
    clone = pickle.loads(pickle.dumps(mutex))
    assert isinstance(clone, Mutex) and clone.lock is not mutex.lock
    assert isinstance(copy.deepcopy(mutex), Mutex)


def test_optimizer_ops_have_no_gradient() -> None:
    op = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"])
    with pytest.raises(NoGradientError):
        build_gradient(op, ["g_grad", None, None])


# --- learning rates --------------------------------------------------------------------------
POLICIES = [
    ({"policy": "fixed"}, lambda it: 1.0),
    ({"policy": "step", "stepsize": 10, "gamma": 0.5}, lambda it: 0.5 ** (it // 10)),
    ({"policy": "multistep", "stepsizes": [5, 20], "gamma": 0.1},
     lambda it: 0.1 ** ((it >= 5) + (it >= 20))),
    ({"policy": "exp", "gamma": 0.9}, lambda it: 0.9 ** it),
    ({"policy": "inv", "gamma": 0.1, "power": 0.75}, lambda it: (1 + 0.1 * it) ** -0.75),
    ({"policy": "poly", "power": 2.0, "max_iter": 50}, lambda it: (1 - it / 50) ** 2),
    ({"policy": "linearWarmup", "start_multiplier": 0.2, "num_iter": 10},
     lambda it: 1.0 if it >= 10 else 0.2 + 0.8 * it / 10),
    ({"policy": "constantWarmup", "multiplier": 0.3, "num_iter": 8},
     lambda it: 1.0 if it >= 8 else 0.3),
    ({"policy": "alter", "active_first": 1, "active_period": 3, "inactive_period": 2},
     lambda it: float(it % 5 < 3)),
    ({"policy": "alter", "active_first": 0, "active_period": 3, "inactive_period": 2},
     lambda it: float(it % 5 >= 2)),
]


@pytest.mark.parametrize("args,multiplier", POLICIES,
                         ids=[f"{a['policy']}{i}" for i, (a, _) in enumerate(POLICIES)])
def test_learning_rate_policies(args: dict, multiplier) -> None:
    op = make_op("LearningRate", ["it"], ["lr"], base_lr=-0.1, **args)
    for it in (0, 1, 4, 5, 9, 12, 20, 33):
        (lr,) = run_op(op, [np.array([it], np.int64)])
        assert lr.shape == () and lr.dtype == F32
        assert float(lr) == pytest.approx(-0.1 * multiplier(it), rel=1e-5), it


def test_learning_rate_composite_and_errors() -> None:
    op = make_op("LearningRate", ["it"], ["lr"], base_lr=1.0, policy="composite",
                 sub_policy_num_iters=[3, 4], sub_policy_0_policy="constantWarmup",
                 sub_policy_0_multiplier=0.5, sub_policy_0_num_iter=100,
                 sub_policy_1_policy="step", sub_policy_1_stepsize=2,
                 sub_policy_1_gamma=0.5, sub_policy_1_lr_scale=2.0)
    got = [float(run_op(op, [np.array([i], np.int64)])[0]) for i in range(1, 8)]
    assert got == pytest.approx([0.5, 0.5, 0.5, 2 * 0.25, 2 * 0.25, 2 * 0.125, 2 * 0.125])
    with pytest.raises(ShapeError, match="unknown learning rate policy"):
        run_op(make_op("LearningRate", ["it"], ["lr"], base_lr=1.0, policy="nope"),
               [np.zeros(1, np.int64)])
    with pytest.raises(ShapeError, match="base_lr"):
        run_op(make_op("LearningRate", ["it"], ["lr"]), [np.zeros(1, np.int64)])


def test_learning_rate_hill_and_cyclical() -> None:
    hill = make_op("LearningRate", ["it"], ["lr"], base_lr=1.0, policy="hill", num_iter=4,
                   start_multiplier=0.0, gamma=1.0, power=1.0, end_multiplier=0.1)
    got = [float(run_op(hill, [np.array([i], np.int64)])[0]) for i in (0, 2, 4, 5, 100)]
    assert got == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.1])
    cyc = make_op("LearningRate", ["it"], ["lr"], base_lr=0.1, policy="cyclical", max_lr=0.3,
                  stepsize=4, decay=1.0)
    got = [float(run_op(cyc, [np.array([i], np.int64)])[0]) for i in (0, 2, 4, 6, 8)]
    assert got == pytest.approx([0.1, 0.2, 0.3, 0.2, 0.1])


# --- weighted sums ---------------------------------------------------------------------------
def test_weighted_sum_and_gradients() -> None:
    x0, x1 = f32(3, 2), f32(3, 2)
    w0, w1 = np.array([0.5], F32), np.array([-2.0], F32)
    op = make_op("WeightedSum", ["X0", "w0", "X1", "w1"], ["X0"])
    buffer = x0.copy()
    (y,) = run_op(op, [buffer, w0, x1, w1])
    assert y.dtype == F32 and y is buffer  # SGD's param update runs in place, as in Caffe2
    np.testing.assert_array_equal(y, x0 * F32(0.5) + x1 * F32(-2.0))
    (fresh,) = run_op(make_op("WeightedSum", ["X0", "w0", "X1", "w1"], ["Y"]), [x0, w0, x1, w1])
    np.testing.assert_array_equal(fresh, y)
    same = x0.copy()  # X1 is X0: read before X0 is overwritten
    (both,) = run_op(op, [same, w0, same, w1])
    np.testing.assert_array_equal(both, x0 * F32(0.5) + x0 * F32(-2.0))
    fwd = make_op("WeightedSum", ["X0", "w0", "X1", "w1"], ["Y"])
    ops, g_in = build_gradient(fwd, ["Y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("WeightedSumGradient", ["Y_grad", "X0", "w0", "X1", "w1"], ["X0_grad", "X1_grad"])]
    assert g_in == ["X0_grad", None, "X1_grad", None]
    inputs = [x0.astype(float), w0.astype(float), x1.astype(float), w1.astype(float)]
    check_gradient(fwd, inputs, inputs_to_check=[0, 2])
    with_w = make_op("WeightedSum", ["X0", "w0", "X1", "w1"], ["Y"], grad_on_w=1)
    ops, g_in = build_gradient(with_w, ["Y_grad"])
    assert list(ops[0].output) == ["X0_grad", "X1_grad", "w0_grad", "w1_grad"]
    check_gradient(with_w, inputs)
    with pytest.raises(ShapeError, match="one element"):
        run_op(op, [x0, np.ones(2, F32), x1, w1])


def sequential_scatter(x0, w0, idx, slices, w1):
    """Caffe2's loops: scale each listed row by w0 (once per listing), then add the slices."""
    out = x0.copy()
    for r in idx:
        out[r] = w0 * out[r]
    for i, r in enumerate(idx):
        out[r] += w1 * slices[i]
    return out


@pytest.mark.parametrize("w0", [1.0, 0.5])
def test_scatter_weighted_sum_with_repeated_indices(w0: float) -> None:
    x0, slices = f32(6, 3), f32(5, 3)
    idx = np.array([4, 1, 4, 0, 4], np.int32)
    w0a, w1a = np.array([w0], F32), np.array([0.25], F32)
    op = make_op("ScatterWeightedSum", ["X", "w0", "I", "S", "w1"], ["X"])
    data = x0.copy()
    (out,) = run_op(op, [data, w0a, idx, slices, w1a])
    np.testing.assert_allclose(out, sequential_scatter(x0, w0, idx, slices, 0.25), rtol=1e-5)
    assert out is data  # in place
    copy_op = make_op("ScatterWeightedSum", ["X", "w0", "I", "S", "w1"], ["Y"])
    data = x0.copy()
    (out,) = run_op(copy_op, [data, w0a, idx, slices, w1a])
    np.testing.assert_array_equal(data, x0)
    with pytest.raises(ShapeError, match="indices"):
        run_op(op, [x0.copy(), w0a, np.array([6], np.int32), slices[:1], w1a])


# --- momentum SGD ----------------------------------------------------------------------------
@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_update(nesterov: int) -> None:
    g, m, p, lr = f32(4, 3), f32(4, 3), f32(4, 3), np.array([0.1], F32)
    op = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9,
                 nesterov=nesterov)
    g2, m2, p2 = run_op(op, [g.copy(), m.copy(), lr, p.copy()])  # updated in place
    new_m = 0.9 * m + 0.1 * g
    adj = (1.9 * new_m - 0.9 * m) if nesterov else new_m
    np.testing.assert_allclose(m2, new_m, rtol=1e-5)
    np.testing.assert_allclose(g2, adj, rtol=1e-5)
    np.testing.assert_allclose(p2, p - adj, rtol=1e-5, atol=1e-6)
    assert p2.dtype == F32
    g3, m3 = run_op(make_op("MomentumSGD", ["g", "m", "lr"], ["g", "m"], momentum=0.9,
                            nesterov=nesterov), [g.copy(), m.copy(), lr])
    np.testing.assert_allclose(g3, g2, rtol=1e-6)


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_update_in_place_as_caffe2(nesterov: int) -> None:
    """Named in place, grad, moment and param are updated in their arrays (Caffe2's kernel
    writes them in place); named out of place, the inputs are left alone.  Both give the
    values of the plain formula bit for bit."""
    g, m, p, lr = f32(6, 5), f32(6, 5), f32(6, 5), np.array([0.05], F32)
    kwargs = {"momentum": 0.8, "nesterov": nesterov}
    inplace = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], **kwargs)
    buffers = [g.copy(), m.copy(), lr, p.copy()]
    outs = run_op(inplace, buffers)
    assert all(out is buf for out, buf in zip(outs, [buffers[0], buffers[1], buffers[3]]))
    fresh = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g2", "m2", "p2"], **kwargs)
    originals = [g.copy(), m.copy(), lr, p.copy()]
    outs2 = run_op(fresh, originals)
    for before, after in zip([g, m, p], [originals[0], originals[1], originals[3]]):
        np.testing.assert_array_equal(before, after)
    new_m = F32(0.8) * m + F32(0.05) * g
    adjusted = (F32(1.8) * new_m - F32(0.8) * m) if nesterov else new_m
    for got in (outs, outs2):
        np.testing.assert_array_equal(got[1], new_m)
        np.testing.assert_array_equal(got[0], adjusted)
        np.testing.assert_array_equal(got[2], p - adjusted)
    assert outs2[0] is not outs2[1]  # two blobs never share one array


def test_momentum_sgd_update_view_input_is_not_written() -> None:
    """A view (possibly another blob's memory) is never updated in place."""
    base = f32(2, 6)
    g, m, p = base.reshape(3, 4), f32(3, 4), f32(3, 4)
    op = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9)
    before = base.copy()
    g2, _, _ = run_op(op, [g, m, np.array([0.1], F32), p])
    np.testing.assert_array_equal(base, before)
    assert g2 is not g


@pytest.mark.parametrize("nesterov", [0, 1])
def test_sparse_momentum_sgd_update_sequential(nesterov: int) -> None:
    g, m, p = f32(4, 2), f32(5, 2), f32(5, 2)
    idx = np.array([3, 0, 3, 2], np.int64)
    op = make_op("SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["g", "m", "p"],
                 momentum=0.5, nesterov=nesterov)
    g2, m2, p2 = run_op(op, [g.copy(), m.copy(), np.array([0.2], F32), p.copy(), idx])
    rm, rp, rg = m.copy(), p.copy(), g.copy()
    for i, r in enumerate(idx):
        new = 0.5 * rm[r] + 0.2 * g[i]
        rg[i] = 1.5 * new - 0.5 * rm[r] if nesterov else new
        rm[r] = new
        rp[r] -= rg[i]
    for got, want in ((g2, rg), (m2, rm), (p2, rp)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- adaptive optimizers ---------------------------------------------------------------------
def test_adagrad_dense_with_decay_and_extra_outputs() -> None:
    w, h, g, lr = f32(3, 2), np.abs(f32(3, 2)), f32(3, 2), np.array([-0.1], F32)
    op = make_op("Adagrad", ["w", "h", "g", "lr"], ["w", "h", "elr", "upd"], epsilon=1e-4,
                 decay=0.9)
    w2, h2, elr, upd = run_op(op, [w, h, g, lr])
    nh = 0.9 * h + g * g
    np.testing.assert_allclose(h2, nh, rtol=1e-5)
    np.testing.assert_allclose(w2, w - 0.1 * g / (np.sqrt(nh) + 1e-4), rtol=1e-5)
    np.testing.assert_allclose(upd, w2 - w, rtol=1e-4, atol=1e-6)
    assert all(v.dtype == F32 for v in (w2, h2, elr, upd))


def sequential_adagrad(w, h, idx, g, lr, eps, row_wise=False):
    w, h = w.copy(), h.copy()
    for i, r in enumerate(idx):
        if row_wise:
            h[r] += (g[i] ** 2).mean()
        else:
            h[r] += g[i] ** 2
        w[r] += lr * g[i] / (np.sqrt(h[r]) + eps)
    return w, h


@pytest.mark.parametrize("row_wise", [False, True])
def test_sparse_adagrad_sequential_and_empty(row_wise: bool) -> None:
    op_type = "RowWiseSparseAdagrad" if row_wise else "SparseAdagrad"
    op = make_op(op_type, ["w", "h", "i", "g", "lr"], ["w", "h"], epsilon=1e-3)
    w, g = f32(6, 3), f32(4, 3)
    h = np.abs(f32(6)) if row_wise else np.abs(f32(6, 3))
    idx = np.array([5, 1, 5, 5], np.int32)
    w2, h2 = run_op(op, [w.copy(), h.copy(), idx, g, np.array([-0.5], F32)])
    rw, rh = sequential_adagrad(w, h, idx, g, -0.5, 1e-3, row_wise)
    np.testing.assert_allclose(w2, rw, rtol=1e-5)
    np.testing.assert_allclose(h2, rh, rtol=1e-5)
    w3, h3 = run_op(op, [w.copy(), h.copy(), np.zeros(0, np.int64), np.zeros((0, 3), F32),
                         np.array([-0.5], F32)])
    np.testing.assert_array_equal(w3, w)
    np.testing.assert_array_equal(h3, h)
    with pytest.raises(ShapeError, match="grad"):
        run_op(op, [w.copy(), h.copy(), idx, g[:2], np.array([-0.5], F32)])


def adam_reference(w, m1, m2, g, lr, t, b1=0.9, b2=0.999, eps=1e-8):
    m1 = b1 * m1 + (1 - b1) * g
    m2 = b2 * m2 + (1 - b2) * g * g
    corr = np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
    return w + lr * corr * m1 / (np.sqrt(m2) + eps), m1, m2


def test_adam_dense_bias_correction() -> None:
    w, m1, m2, g = f32(3, 2), f32(3, 2), np.abs(f32(3, 2)), f32(3, 2)
    op = make_op("Adam", ["w", "m1", "m2", "g", "lr", "it"], ["w", "m1", "m2"], epsilon=1e-8)
    got = run_op(op, [w, m1, m2, g, np.array([-0.01], F32), np.array([4], np.int64)])
    for a, b in zip(got, adam_reference(w, m1, m2, g, -0.01, 4)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("row_wise", [False, True])
def test_sparse_adam(row_wise: bool) -> None:
    op_type = "RowWiseSparseAdam" if row_wise else "SparseAdam"
    op = make_op(op_type, ["w", "m1", "m2", "i", "g", "lr", "it"], ["w", "m1", "m2"],
                 epsilon=1e-8)
    w, m1, g = f32(5, 2), f32(5, 2), f32(2, 2)
    m2 = np.abs(f32(5)) if row_wise else np.abs(f32(5, 2))
    idx = np.array([3, 0], np.int64)
    w2, m1b, m2b = run_op(op, [w.copy(), m1.copy(), m2.copy(), idx, g,
                               np.array([-0.01], F32), np.array([2], np.int64)])
    rw, r1, r2 = w.copy(), m1.copy(), m2.copy()
    for i, r in enumerate(idx):
        gsq = (g[i] ** 2).mean() if row_wise else g[i] ** 2
        r1[r] = 0.9 * r1[r] + 0.1 * g[i]
        r2[r] = 0.999 * r2[r] + 0.001 * gsq
        corr = np.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3)
        rw[r] += -0.01 * corr * r1[r] / (np.sqrt(r2[r]) + 1e-8)
    for a, b in ((w2, rw), (m1b, r1), (m2b, r2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_adadelta_dense_and_sparse_agree() -> None:
    w, h, d, g = f32(4, 2), np.abs(f32(4, 2)), np.abs(f32(4, 2)), f32(4, 2)
    lr = np.array([-0.5], F32)
    dense = run_op(make_op("Adadelta", ["w", "h", "d", "g", "lr"], ["w", "h", "d"],
                           epsilon=1e-3, decay=0.9), [w, h, d, g, lr])
    nh = 0.9 * h + 0.1 * g * g
    ng = np.sqrt(d + 1e-3) / np.sqrt(nh + 1e-3) * g
    np.testing.assert_allclose(dense[0], w - 0.5 * ng, rtol=1e-5)
    np.testing.assert_allclose(dense[2], 0.9 * d + 0.1 * ng * ng, rtol=1e-5)
    sparse = run_op(make_op("SparseAdadelta", ["w", "h", "d", "i", "g", "lr"], ["w", "h", "d"],
                            epsilon=1e-3, decay=0.9),
                    [w.copy(), h.copy(), d.copy(), np.arange(4), g, lr])
    for a, b in zip(sparse, dense):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_wngrad_dense_and_sparse() -> None:
    w, g = f32(3, 2), f32(3, 2)
    b, lr = np.array([2.0], F32), np.array([-0.1], F32)
    w2, b2 = run_op(make_op("Wngrad", ["w", "b", "g", "lr"], ["w", "b"], epsilon=1e-3),
                    [w, b, g, lr])
    np.testing.assert_allclose(w2, w - 0.1 * g / 2.001, rtol=1e-5)
    np.testing.assert_allclose(b2, 2.0 + (g * g).sum() / 2.001, rtol=1e-5)
    sparse = run_op(make_op("SparseWngrad", ["w", "b", "i", "g", "lr"], ["w", "b"],
                            epsilon=1e-3), [w.copy(), b, np.array([2, 0]), g[:2], lr])
    want = w.copy()
    want[[2, 0]] -= 0.1 * g[:2] / 2.001
    np.testing.assert_allclose(sparse[0], want, rtol=1e-5)
    # the sparse moment divides by b without epsilon (final Caffe2, caffe2-jobs-facts §5.3)
    np.testing.assert_allclose(sparse[1], 2.0 + (g[:2] ** 2).sum() / 2.0, rtol=1e-5)


def test_rms_prop_and_ftrl() -> None:
    g, ms, mom = f32(3), np.abs(f32(3)), f32(3)
    g2, ms2, mom2 = run_op(make_op("RmsProp", ["g", "ms", "mom", "lr"], ["g", "ms", "mom"],
                                   decay=0.9, momentum=0.5, epsilon=1e-5),
                           [g, ms, mom, np.array([0.1], F32)])
    nms = ms + 0.1 * (g * g - ms)
    np.testing.assert_allclose(ms2, nms, rtol=1e-5)
    np.testing.assert_allclose(mom2, 0.5 * mom + 0.1 * g / np.sqrt(1e-5 + nms), rtol=1e-5)
    np.testing.assert_array_equal(g2, mom2)
    w, g = np.array([0.5, -0.2], F32), np.array([1.0, 0.0001], F32)
    nz = np.zeros((2, 2), F32)
    w2, nz2 = run_op(make_op("Ftrl", ["w", "nz", "g"], ["w", "nz"], alpha=0.1, beta=1.0,
                             lambda1=0.01, lambda2=0.0), [w, nz, g])
    n = g * g
    z = g - (np.sqrt(n) / 0.1) * w
    want = np.where(np.abs(z) > 0.01, (0.01 * np.sign(z) - z) / ((1 + np.sqrt(n)) / 0.1), 0)
    np.testing.assert_allclose(w2, want, rtol=1e-5)
    np.testing.assert_allclose(nz2, np.stack([n, z], axis=-1), rtol=1e-5)


def test_sparse_ftrl_matches_dense_on_touched_rows() -> None:
    w, g = f32(4, 3), f32(2, 3)
    nz = np.abs(f32(4, 3, 2))
    idx = np.array([3, 1])
    args = dict(alpha=0.1, beta=1.0, lambda1=0.01, lambda2=0.001)
    dense_w, dense_nz = run_op(make_op("Ftrl", ["w", "nz", "g"], ["w", "nz"], **args),
                               [w[idx], nz[idx], g])
    sw, snz = run_op(make_op("SparseFtrl", ["w", "nz", "i", "g"], ["w", "nz"], **args),
                     [w.copy(), nz.copy(), idx, g])
    np.testing.assert_allclose(sw[idx], dense_w, rtol=1e-5)
    np.testing.assert_allclose(snz[idx], dense_nz, rtol=1e-5)
    np.testing.assert_array_equal(sw[[0, 2]], w[[0, 2]])


def test_float_half_conversions_and_gradients() -> None:
    x = f32(3)
    (h,) = run_op(make_op("FloatToHalf", ["x"], ["h"]), [x])
    assert h.dtype == np.float16
    (back,) = run_op(make_op("HalfToFloat", ["h"], ["x"]), [h])
    assert back.dtype == F32
    np.testing.assert_allclose(back, x, rtol=1e-3)
    ops, _ = build_gradient(make_op("FloatToHalf", ["x"], ["h"]), ["h_grad"])
    assert (ops[0].type, list(ops[0].input), list(ops[0].output)) == (
        "HalfToFloat", ["h_grad"], ["x_grad"])
    ops, _ = build_gradient(make_op("HalfToFloat", ["h"], ["x"]), ["x_grad"])
    assert ops[0].type == "FloatToHalf"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=12))
def test_occurrence_layers_partition_without_repeats(indices: list[int]) -> None:
    layers = occurrence_layers(np.array(indices, np.int64))
    flat = np.concatenate(layers) if layers else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(len(indices)))
    for layer in layers:
        values = [indices[i] for i in layer]
        assert len(values) == len(set(values))
    for pos, value in enumerate(indices):
        earlier = sum(1 for j in range(pos) if indices[j] == value)
        assert pos in layers[earlier]


def test_sparse_update_checks_run_before_writing() -> None:
    w = f32(3, 2)
    before = w.copy()
    op = make_op("SparseAdagrad", ["w", "h", "i", "g", "lr"], ["w", "h"])
    with pytest.raises(ShapeError):
        run_op(op, [w, np.zeros((3, 2), F32), np.array([0, 7]), f32(2, 2),
                    np.array([0.1], F32)])
    np.testing.assert_array_equal(w, before)



def test_learning_rate_lr_scale_applies_to_plain_policies() -> None:
    op = make_op("LearningRate", ["it"], ["lr"], base_lr=0.5, policy="fixed", lr_scale=0.1)
    assert float(run_op(op, [np.zeros(1, np.int64)])[0]) == pytest.approx(0.05)


@pytest.mark.parametrize("op_type,dtype", [("FP16MomentumSGDUpdate", np.float16),
                                           ("FP32MomentumSGDUpdate", F32)])
def test_momentum_updates_with_weight_decay(op_type: str, dtype: type) -> None:
    g, m, p = (f32(6).astype(dtype) for _ in range(3))
    op = make_op(op_type, ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9, nesterov=1,
                 weight_decay=0.01)
    g2, m2, p2 = run_op(op, [g, m, np.array([0.1], F32), p])
    assert g2.dtype == m2.dtype == p2.dtype == dtype
    g32, m32, p32 = (v.astype(F32) for v in (g, m, p))
    new_m = 0.9 * m32 + 0.1 * (g32 + 0.01 * p32)
    adj = 1.9 * new_m - 0.9 * m32
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(m2.astype(F32), new_m, rtol=tol, atol=tol)
    np.testing.assert_allclose(p2.astype(F32), p32 - adj, rtol=tol, atol=tol)
