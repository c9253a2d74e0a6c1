"""Ops the brew/optimizer helpers emit: LRN, MaxPoolWithIndex, FC_Decomp/FC_Prune/FC_Sparse,
Lars, YellowFin, LengthsMax and the later LearningRate policies.  No golden cases exist for
these: each kernel is checked against a direct numpy reference written from Caffe2's
documented behaviour, gradient kernels against finite differences, and the helpers end to end
in a workspace."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, optimizer, workspace
from dpgraph.errors import ModelConfigError, NotSupportedError, ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.model_helper import ModelHelper
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(77)


def randn(*shape: int, dtype: Any = np.float64) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _grad_ops(op: Any, outputs_with_grads: tuple[int, ...] = (0,)) -> list[Any]:
    g_out = [op.output[i] + "_grad" if i in outputs_with_grads else None
             for i in range(len(op.output))]
    return build_gradient(op, g_out)[0]


# --- LRN -------------------------------------------------------------------------------------
def ref_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float,
            order: str) -> tuple[np.ndarray, np.ndarray]:
    xc = x if order == "NCHW" else np.moveaxis(x, -1, 1)
    c = xc.shape[1]
    pre = (size - 1) // 2
    scale = np.full(xc.shape, bias, dtype=np.float64)
    for ch in range(c):
        for j in range(ch - pre, ch - pre + size):
            if 0 <= j < c:
                scale[:, ch] += alpha / size * xc[:, j].astype(np.float64) ** 2
    y = xc * scale ** -beta
    if order == "NHWC":
        scale, y = np.moveaxis(scale, 1, -1), np.moveaxis(y, 1, -1)
    return y, scale


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("size", [3, 4, 5])
def test_lrn_matches_reference(order: str, size: int) -> None:
    x = randn(2, 6, 3, 4, dtype=np.float32)
    if order == "NHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    op = make_op("LRN", ["X"], ["Y", "scale"], size=size, alpha=0.3, beta=0.75, bias=2.0,
                 order=order)
    y, scale = run_op(op, [x])
    ref_y, ref_scale = ref_lrn(x, size, 0.3, 0.75, 2.0, order)
    assert y.dtype == np.float32 and scale.dtype == np.float32
    np.testing.assert_allclose(scale, ref_scale, rtol=1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    (only_y,) = run_op(make_op("LRN", ["X"], ["Y"], size=size, alpha=0.3, beta=0.75,
                               bias=2.0, order=order), [x])
    np.testing.assert_array_equal(only_y, y)


def test_lrn_default_bias_and_bad_size() -> None:
    x = randn(1, 3, 2, 2, dtype=np.float32)
    _, scale = run_op(make_op("LRN", ["X"], ["Y", "s"], size=3, alpha=0.0, beta=0.5), [x])
    np.testing.assert_array_equal(scale, np.ones_like(x))  # bias defaults to 1
    with pytest.raises(ShapeError, match="size"):
        run_op(make_op("LRN", ["X"], ["Y"], alpha=0.1, beta=0.5), [x])


@pytest.mark.parametrize("order,size", [("NCHW", 3), ("NHWC", 5), ("NCHW", 4), ("NHWC", 2)])
def test_lrn_gradient(order: str, size: int) -> None:
    x = randn(2, 5, 2, 3) if order == "NCHW" else randn(2, 2, 3, 5)
    op = make_op("LRN", ["X"], ["Y", "scale"], size=size, alpha=0.4, beta=0.75, bias=1.5,
                 order=order)
    check_gradient(op, [x], rtol=1e-3, atol=1e-4, eps=1e-4)
    (grad,) = _grad_ops(op)
    assert grad.type == "LRNGradient"
    assert list(grad.input) == ["X", "Y", "Y_grad"] and list(grad.output) == ["X_grad"]
    assert arguments_dict(grad.arg)["size"] == size


def test_lrn_gradient_accepts_the_scale_input() -> None:
    x, dy = randn(2, 4, 3, 3, dtype=np.float32), randn(2, 4, 3, 3, dtype=np.float32)
    args = {"size": 3, "alpha": 0.2, "beta": 0.6}
    y, scale = run_op(make_op("LRN", ["X"], ["Y", "S"], **args), [x])
    (dx3,) = run_op(make_op("LRNGradient", ["X", "Y", "dY"], ["dX"], **args), [x, y, dy])
    (dx4,) = run_op(make_op("LRNGradient", ["X", "Y", "S", "dY"], ["dX"], **args),
                    [x, y, scale, dy])
    np.testing.assert_allclose(dx3, dx4, rtol=1e-6, atol=1e-7)


# --- MaxPoolWithIndex --------------------------------------------------------------------------
def ref_max_pool_with_index(x: np.ndarray, k: tuple[int, int], s: tuple[int, int],
                            pads: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    pt, pl, pb, pr = pads
    oh, ow = (h + pt + pb - k[0]) // s[0] + 1, (w + pl + pr - k[1]) // s[1] + 1
    y = np.zeros((n, c, oh, ow), dtype=x.dtype)
    idx = np.zeros((n, c, oh, ow), dtype=np.int32)
    for a in range(n):
        for b in range(c):
            for i in range(oh):
                for j in range(ow):
                    best, arg = -np.inf, -1
                    for hh in range(max(i * s[0] - pt, 0), min(i * s[0] - pt + k[0], h)):
                        for ww in range(max(j * s[1] - pl, 0), min(j * s[1] - pl + k[1], w)):
                            if x[a, b, hh, ww] > best:
                                best, arg = x[a, b, hh, ww], hh * w + ww
                    y[a, b, i, j], idx[a, b, i, j] = best, arg
    return y, idx.reshape(-1)


@pytest.mark.parametrize("k,s,pads", [((2, 2), (2, 2), (0, 0, 0, 0)),
                                      ((3, 3), (2, 1), (1, 1, 1, 0)),
                                      ((3, 2), (1, 2), (0, 1, 1, 1))])
def test_max_pool_with_index_matches_reference(k: tuple, s: tuple, pads: tuple) -> None:
    x = randn(2, 3, 5, 6, dtype=np.float32)
    op = make_op("MaxPoolWithIndex", ["X"], ["Y", "I"], kernel_h=k[0], kernel_w=k[1],
                 stride_h=s[0], stride_w=s[1], pad_t=pads[0], pad_l=pads[1], pad_b=pads[2],
                 pad_r=pads[3])
    y, idx = run_op(op, [x])
    ref_y, ref_idx = ref_max_pool_with_index(x, k, s, pads)
    assert idx.dtype == np.int32 and idx.ndim == 1
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_array_equal(idx, ref_idx)
    (plain,) = run_op(make_op("MaxPool", ["X"], ["Y"], kernel_h=k[0], kernel_w=k[1],
                              stride_h=s[0], stride_w=s[1], pad_t=pads[0], pad_l=pads[1],
                              pad_b=pads[2], pad_r=pads[3]), [x])
    np.testing.assert_array_equal(y, plain)


def test_max_pool_with_index_ties_pick_the_first() -> None:
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    y, idx = run_op(make_op("MaxPoolWithIndex", ["X"], ["Y", "I"], kernel=2), [x])
    assert idx.tolist() == [0] and y.reshape(-1).tolist() == [1.0]
    dy = np.array([[[[3.0]]]], dtype=np.float32)
    (dx,) = run_op(make_op("MaxPoolWithIndexGradient", ["X", "dY", "I"], ["dX"], kernel=2),
                   [x, dy, idx])
    assert dx.reshape(-1).tolist() == [3.0, 0.0, 0.0, 0.0]


def test_max_pool_with_index_gradient() -> None:
    x = RNG.permutation(2 * 2 * 5 * 5).reshape(2, 2, 5, 5).astype(np.float64) / 10
    op = make_op("MaxPoolWithIndex", ["X"], ["Y", "Y_index"], kernel=3, stride=2, pad=1)
    check_gradient(op, [x], rtol=1e-4, atol=1e-5)
    (grad,) = _grad_ops(op)
    assert grad.type == "MaxPoolWithIndexGradient"
    assert list(grad.input) == ["X", "Y_grad", "Y_index"] and list(grad.output) == ["X_grad"]


def test_empty_batches() -> None:
    x = np.zeros((0, 3, 4, 4), np.float32)
    y, idx = run_op(make_op("MaxPoolWithIndex", ["X"], ["Y", "I"], kernel=2, stride=2), [x])
    assert y.shape == (0, 3, 2, 2) and idx.shape == (0,)
    (dx,) = run_op(make_op("MaxPoolWithIndexGradient", ["X", "dY", "I"], ["dX"], kernel=2,
                           stride=2), [x, y, idx])
    assert dx.shape == x.shape
    y, scale = run_op(make_op("LRN", ["X"], ["Y", "S"], size=3, alpha=0.1, beta=0.5), [x])
    assert y.shape == scale.shape == x.shape
    (y,) = run_op(make_op("FC_Decomp", ["X", "U", "V", "b"], ["Y"]),
                  [np.zeros((0, 4), np.float32), randn(2, 3), randn(4, 3), randn(2)])
    assert y.shape == (0, 2)
    (y,) = run_op(make_op("LengthsMax", ["D", "L"], ["Y"]),
                  [np.zeros((0, 2), np.float32), np.zeros(3, np.int32)])
    np.testing.assert_array_equal(y, np.zeros((3, 2), np.float32))


def test_shape_inference() -> None:
    net = core.Net("shapes")
    net.MaxPoolWithIndex("X", ["Y", "I"], kernel=2, stride=2)
    net.FC_Decomp(["X2", "U", "V", "b"], "Z")
    net.LRN("X", ["L", "S"], size=3)
    net.LengthsMax(["D", "len"], "M")
    shapes, types = workspace.InferShapesAndTypes(
        [net], {"X": [2, 3, 4, 6], "X2": [5, 7], "U": [4, 2], "V": [7, 2], "b": [4],
                "D": [9, 3], "len": [4]})
    assert shapes["Y"] == [2, 3, 2, 3] and shapes["I"] == [36]
    assert shapes["Z"] == [5, 4] and shapes["L"] == shapes["S"] == [2, 3, 4, 6]
    assert shapes["M"] == [4, 3]


def test_max_pool_with_index_rejects_nhwc() -> None:
    op = make_op("MaxPoolWithIndex", ["X"], ["Y", "I"], kernel=2, order="NHWC")
    with pytest.raises(NotSupportedError, match="NCHW"):
        run_op(op, [randn(1, 4, 4, 2, dtype=np.float32)])


# --- FC_Decomp, FC_Prune, FC_Sparse ------------------------------------------------------------
def test_fc_decomp_forward_and_gradient() -> None:
    x, u, v, b = randn(4, 6), randn(3, 2), randn(6, 2), randn(3)
    op = make_op("FC_Decomp", ["X", "U", "V", "b"], ["Y"])
    (y,) = run_op(op, [x, u, v, b])
    np.testing.assert_allclose(y, x @ (u @ v.T).T + b, rtol=1e-10)
    check_gradient(op, [x, u, v, b], rtol=1e-4, atol=1e-6)
    (grad,) = _grad_ops(op)
    assert grad.type == "FCGradient_Decomp"
    assert list(grad.input) == ["X", "U", "V", "Y_grad"]
    assert list(grad.output) == ["U_grad", "V_grad", "b_grad", "X_grad"]
    (y1,) = run_op(op, [x[0], u, v, b])  # a 1-D X gives a 1-D Y
    np.testing.assert_allclose(y1, y[0], rtol=1e-10)
    with pytest.raises(ShapeError):
        run_op(op, [x, u, randn(5, 2), b])


def test_fc_prune_forward_and_compress_rate() -> None:
    x, w, b = randn(3, 4, dtype=np.float32), randn(2, 4, dtype=np.float32), randn(2)
    mask = np.array([[1, 0, 1, 1], [0, 0, 1, 1]], dtype=np.float32)
    extra = [np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32),
             np.array([0.1], np.float32), np.array([0.05], np.float32)]
    names = ["X", "W", "M", "b", "ag", "seq", "thres", "lb"]
    y, rate = run_op(make_op("FC_Prune", names, ["Y", "rate"]),
                     [x, w, mask, b.astype(np.float32), *extra])
    np.testing.assert_allclose(y, x @ w.T + b.astype(np.float32), rtol=1e-5)
    assert rate.shape == () and float(rate) == pytest.approx(5 / 8)


def test_fc_sparse_matches_dense() -> None:
    dense = np.array([[0, 2, 0], [1, 0, 3], [0, 0, 0], [4, 0, 0]], dtype=np.float32)
    rows, cols = np.nonzero(dense)
    iw = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=4))]).astype(np.int32)
    xt, b = randn(3, 5, dtype=np.float32), randn(4, dtype=np.float32)
    op = make_op("FC_Sparse", ["Xt", "W", "iw", "jw", "b"], ["Yt"])
    (yt,) = run_op(op, [xt, dense[rows, cols], iw, cols.astype(np.int32), b])
    np.testing.assert_allclose(yt, dense @ xt + b[:, None], rtol=1e-5, atol=1e-6)


# --- Lars --------------------------------------------------------------------------------------
def _lars(x: np.ndarray, dx: np.ndarray, wd: float, trust: float, lr_max: float,
          **args: Any) -> float:
    op = make_op("Lars", ["X", "dX", "wd", "trust", "lr_max"], ["lr"], **args)
    (out,) = run_op(op, [x, dx, *(np.array([v], np.float32) for v in (wd, trust, lr_max))])
    assert out.shape == (1,) and out.dtype == np.float32
    return float(out[0])


def test_lars_local_learning_rate() -> None:
    x, dx = randn(3, 4, dtype=np.float32), randn(3, 4, dtype=np.float32)
    ratio = np.linalg.norm(dx) / np.linalg.norm(x)
    expected = 0.7 / (ratio + 0.01 + 0.5)  # offset defaults to 0.5
    assert _lars(x, dx, 0.01, 0.7, 10.0) == pytest.approx(expected, rel=1e-5)
    assert _lars(x, dx, 0.01, 0.7, 10.0, offset=0.1) == pytest.approx(
        0.7 / (ratio + 0.11), rel=1e-5)
    assert _lars(x, dx, 0.0, 0.7, 0.05, lr_min=0.0) == pytest.approx(0.05)  # lr_max clips
    assert _lars(x, dx, 0.0, 1e-6, 1.0) == pytest.approx(0.02)  # lr_min defaults to 0.02
    assert _lars(np.zeros_like(x), dx, 0.0, 0.7, 10.0) == pytest.approx(1.0)  # |X| = 0


# --- YellowFin ----------------------------------------------------------------------------------
def ref_yellowfin_step(st: dict[str, Any], grad: np.ndarray, it: int, beta: float = 0.999,
                       eps: float = 1e-6, width: int = 20) -> None:
    """One YellowFin step on float64 state, following Caffe2's YellowFinOp."""
    deb = 1 / (1 - beta ** it)
    mu, lr = st["mu"], st["lr"]
    st["moment"] = mu * st["moment"] + lr * grad
    st["param"] = st["param"] - st["moment"]
    mem = st["mem"]

    def avg(old: Any, new: Any) -> Any:
        return beta * old + (1 - beta) * new

    st["g_avg"], st["g2_avg"] = avg(st["g_avg"], grad), avg(st["g2_avg"], grad ** 2)
    g_deb = st["g_avg"] * deb
    gn2 = max(eps, float(np.sum(grad ** 2)))
    mem[1] = avg(mem[1], gn2)
    mem[0] = avg(mem[0], math.sqrt(gn2))
    st["win"][(it - 1) % width] = math.log(gn2)
    valid = st["win"][:min(width, it)]
    mem[2], mem[3] = avg(mem[2], valid.min()), avg(mem[3], valid.max())
    h_min, h_max = max(eps, math.exp(mem[2] * deb)), max(eps, math.exp(mem[3] * deb))
    var = max(eps, mem[1] * deb - float(np.sum(g_deb ** 2)))
    mem[4] = avg(mem[4], mem[0] / mem[1])
    dist = mem[4] * deb
    if it > 1:
        p = (dist * h_min) ** 2 / (2 * var)
        w3 = (-math.sqrt(p * p + 4 / 27 * p ** 3) - p) / 2
        w = math.copysign(abs(w3) ** (1 / 3), w3)
        root = w - p / 3 / w + 1
        ratio = math.sqrt(h_max / h_min)
        new_mu = max(root ** 2, ((ratio - 1) / (ratio + 1)) ** 2)
        st["mu"], st["lr"] = avg(mu, new_mu), avg(lr, (1 - math.sqrt(new_mu)) ** 2 / h_min)


def test_yellowfin_matches_reference_over_steps() -> None:
    shape = (3, 4)
    names = ["p", "m", "lr", "mu", "win", "ga", "g2a", "mem"]
    blobs: dict[str, Any] = {
        "p": randn(*shape, dtype=np.float32), "m": np.zeros(shape, np.float32),
        "lr": np.array([0.1], np.float32), "mu": np.array([0.0], np.float32),
        "win": np.zeros(20, np.float32), "ga": np.zeros(shape, np.float32),
        "g2a": np.zeros(shape, np.float32), "mem": np.zeros(5, np.float32)}
    st = {"param": blobs["p"].astype(np.float64), "moment": np.zeros(shape), "lr": 0.1,
          "mu": 0.0, "win": np.zeros(20), "g_avg": np.zeros(shape), "g2_avg": np.zeros(shape),
          "mem": [0.0] * 5}
    op = make_op("YellowFin", [*names, "g", "iter"], names)
    for it in range(1, 6):
        grad = randn(*shape, dtype=np.float32) + 0.3 * blobs["p"]
        blobs.update(g=grad, iter=np.array([it], np.int64))
        blobs = run_ops([op], blobs)
        ref_yellowfin_step(st, grad.astype(np.float64), it)
        np.testing.assert_allclose(blobs["p"], st["param"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(blobs["m"], st["moment"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(blobs["mem"], st["mem"], rtol=1e-4, atol=1e-6)
        assert float(blobs["lr"][0]) == pytest.approx(st["lr"], rel=1e-4)
        assert float(blobs["mu"][0]) == pytest.approx(st["mu"], rel=1e-4, abs=1e-7)
    assert st["mu"] > 0 and st["lr"] != pytest.approx(0.1)  # the tuner moved both


def test_yellowfin_nesterov_step() -> None:
    shape = (2, 2)
    p, m, g = randn(*shape, dtype=np.float32), randn(*shape, dtype=np.float32), randn(2, 2)
    inputs = [p, m, np.array([0.2], np.float32), np.array([0.5], np.float32),
              np.zeros(4, np.float32), np.zeros(shape, np.float32), np.zeros(shape, np.float32),
              np.zeros(5, np.float32), g.astype(np.float32), np.array([1], np.int64)]
    names = [f"i{k}" for k in range(10)]
    op = make_op("YellowFin", names, names[:8], nesterov=1, curv_win_width=4)
    outs = run_op(op, inputs)
    moment = 0.5 * m + 0.2 * g.astype(np.float32)
    np.testing.assert_allclose(outs[1], moment, rtol=1e-6)
    np.testing.assert_allclose(outs[0], p - 1.5 * moment + 0.5 * m, rtol=1e-5, atol=1e-6)
    assert outs[4][0] != 0 and np.all(outs[4][1:] == 0)  # log |g|² in slot (iter-1) % 4


# --- LengthsMax -------------------------------------------------------------------------------
def test_lengths_max_forward_and_gradient() -> None:
    data = RNG.permutation(7 * 3).reshape(7, 3).astype(np.float64)
    lengths = np.array([2, 0, 4, 1], dtype=np.int32)
    op = make_op("LengthsMax", ["D", "L"], ["Y"])
    (y,) = run_op(op, [data, lengths])
    expected = np.stack([data[0:2].max(0), np.zeros(3), data[2:6].max(0), data[6]])
    np.testing.assert_array_equal(y, expected)
    check_gradient(op, [data, lengths], inputs_to_check=[0], rtol=1e-6, atol=1e-8)
    (grad,) = _grad_ops(op)
    assert grad.type == "LengthsMaxWithMainInputAndForwardOutputGradient"
    assert list(grad.input) == ["Y", "Y_grad", "L", "D"] and list(grad.output) == ["D_grad"]
    with pytest.raises(ShapeError, match="lengths"):
        run_op(op, [data, np.array([3, 3], np.int32)])


def test_lengths_max_gradient_reaches_every_tie() -> None:
    data = np.array([[1.0], [3.0], [3.0], [2.0]], dtype=np.float32)
    lengths = np.array([3, 1], dtype=np.int32)
    (y,) = run_op(make_op("LengthsMax", ["D", "L"], ["Y"]), [data, lengths])
    dy = np.array([[5.0], [7.0]], dtype=np.float32)
    op = make_op("LengthsMaxWithMainInputAndForwardOutputGradient", ["Y", "dY", "L", "D"],
                 ["dD"])
    (dd,) = run_op(op, [y, dy, lengths, data])
    assert dd.reshape(-1).tolist() == [0.0, 5.0, 5.0, 7.0]


# --- LearningRate policies -----------------------------------------------------------------------
def _lr(it: int, **args: Any) -> float:
    (out,) = run_op(make_op("LearningRate", ["it"], ["lr"], **args),
                    [np.array([it], np.int64)])
    return float(out)


def ref_cosine(it: int, lo: float, hi: float, period: int, t_mult: float,
               shrink: float) -> float:
    start, length, cycle = 0.0, float(period), 0
    while it >= start + length:  # walk the restarts explicitly
        start, length, cycle = start + length, length * t_mult, cycle + 1
    low, high = lo * shrink ** cycle, hi * shrink ** cycle
    return low + 0.5 * (high - low) * (1 + math.cos(math.pi * (it - start) / length))


@pytest.mark.parametrize("t_mult", [1.0, 2.0])
def test_cosine_policy(t_mult: float) -> None:
    args = {"base_lr": 0.5, "policy": "cosine", "max_lr": 0.8, "min_lr": 0.1, "period": 10,
            "t_mult": t_mult, "lr_shrink": 0.9}
    for it in (0, 3, 9, 10, 17, 29, 31, 64):
        expected = 0.5 * ref_cosine(it, 0.1, 0.8, 10, t_mult, 0.9)
        assert _lr(it, **args) == pytest.approx(expected, rel=1e-5), it
    assert _lr(0, base_lr=1.0, policy="cosine") == pytest.approx(0.5)  # max_lr default 0.5


def test_gate_and_piece_warmup_policies() -> None:
    gate = {"base_lr": 2.0, "policy": "gate", "multiplier_1": 0.25, "multiplier_2": 3.0,
            "num_iter": 5}
    assert [_lr(i, **gate) for i in (0, 4, 5, 9)] == pytest.approx([0.5, 0.5, 6.0, 6.0])
    assert _lr(100, base_lr=2.0, policy="gate") == pytest.approx(2.0)  # multipliers default 1
    piece = {"base_lr": 1.0, "policy": "pieceWarmup", "m1": 0.1, "n1": 2, "m2": 0.5, "n2": 4,
             "m3": 1.0}
    assert [_lr(i, **piece) for i in (0, 2, 3, 4)] == pytest.approx([0.1, 0.5, 0.5, 1.0])


def test_slope_policy() -> None:
    slope = {"base_lr": 2.0, "policy": "slope", "num_iter_1": 10, "multiplier_1": 1.0,
             "num_iter_2": 20, "multiplier_2": 0.5}
    # flat, then a line from 1.0 at iteration 10 down to 0.5 at 20, then flat at 0.5
    assert [_lr(i, **slope) for i in (0, 9, 10, 15, 20, 40)] == pytest.approx(
        [2.0, 2.0, 2.0, 1.5, 1.0, 1.0])
    with pytest.raises(Exception, match="num_iter_1 < num_iter_2"):
        _lr(0, base_lr=1.0, policy="slope", num_iter_1=5, num_iter_2=5)


def test_warmup_composite_policies() -> None:
    warm = {"start_warmup_multiplier": 0.2, "constant_warmup_num_iter": 3,
            "linear_warmup_num_iter": 4}
    plain = [_lr(i, base_lr=1.0, policy="constantThenLinearWarmup", **warm) for i in range(9)]
    assert plain == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    cyc = {"base_lr": 0.1, "policy": "compositeCyclical", "cyclical_max_lr": 0.3,
           "cyclical_step_size": 2, **warm}
    values = [_lr(i, **cyc) for i in range(13)]
    assert values[:7] == pytest.approx([0.1 * v for v in plain[:7]])
    # after warmup: a triangle from base_lr up to max_lr and back over 2 * stepsize
    assert values[7:12] == pytest.approx([0.1, 0.2, 0.3, 0.2, 0.1])
    cos = {"base_lr": 1.0, "policy": "compositeCosine", "cosine_max_lr": 0.9,
           "cosine_min_lr": 0.1, "cosine_period": 4, "cosine_lr_shrink": 1.0, **warm}
    assert _lr(5, **cos) == pytest.approx(plain[5])
    assert [_lr(i, **cos) for i in (7, 9)] == pytest.approx([0.9, 0.5])


# --- the helpers end to end ----------------------------------------------------------------------
def test_brew_helpers_run_in_a_workspace() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="extra")
    lrn = brew.lrn(model, "data", "lrn", size=3, alpha=1e-3, beta=0.75)
    pool = brew.max_pool_with_index(model, lrn, "pool", kernel=2, stride=2)
    hidden = brew.fc_decomp(model, pool, "dec", dim_in=2 * 2 * 2, dim_out=3, rank_approx=2)
    pruned = brew.fc_prune(model, hidden, "prune", 3, 2, need_compress_rate=True)
    dist = model.net.SquaredL2Distance([pruned[0], "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    workspace.FeedBlob("data", randn(4, 2, 4, 4, dtype=np.float32))
    workspace.FeedBlob("target", randn(4, 2, dtype=np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert np.isfinite(workspace.FetchBlob(str(loss)))
    assert workspace.FetchBlob("pool_index").shape == (4 * 2 * 2 * 2,)
    assert float(workspace.FetchBlob("prune_compress_rate")) == pytest.approx(1.0)
    types = [op.type for op in model.net.Proto().op]
    assert types[:4] == ["LRN", "MaxPoolWithIndex", "FC_Decomp", "FC_Prune"]


def test_brew_lrn_and_fc_decomp_train_with_sgd() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="lrn_train")
    lrn = brew.lrn(model, "data", "lrn", size=3, alpha=0.1, beta=0.75)
    pool = brew.max_pool_with_index(model, lrn, "pool", kernel=2, stride=2)
    pred = brew.fc_decomp(model, pool, "dec", dim_in=2 * 2 * 2, dim_out=1, rank_approx=2)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([pred, "target"], "d"), "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, 0.05)
    rng = np.random.default_rng(3)
    workspace.FeedBlob("data", rng.standard_normal((8, 2, 4, 4)).astype(np.float32))
    workspace.FeedBlob("target", rng.standard_normal((8, 1)).astype(np.float32))
    losses = _train_losses(model, steps=15)
    assert losses[-1] < losses[0]


def _train_losses(model: ModelHelper, steps: int) -> list[float]:
    """Run the init net once, then ``steps`` training steps; the ``loss`` after each."""
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(steps):
        workspace.RunNet(model.net.Name())
        losses.append(float(workspace.FetchBlob("loss")))
    return losses


def _sgd_model(name: str) -> ModelHelper:
    model = ModelHelper(name=name)
    pred = brew.fc(model, "data", "fc", dim_in=3, dim_out=1)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([pred, "target"], "d"), "loss")
    model.AddGradientOperators([loss])
    return model


def test_sgd_lars_graph_and_update() -> None:
    workspace.ResetWorkspace()
    model = _sgd_model("lars")
    opt = optimizer.build_sgd(model, 0.1, lars=0.2)
    ops = model.net.Proto().op
    lars_ops = [op for op in ops if op.type == "Lars"]
    assert [list(op.input) for op in lars_ops] == [
        [p, p + "_grad", "weight_decay", "trust", "lr_max"] for p in ("fc_w", "fc_b")]
    n = opt._instance_num
    assert [op.output[0] for op in lars_ops] == [f"SgdOptimizer_{n}_fc_w_lars_cpu",
                                                f"SgdOptimizer_{n}_fc_b_lars_cpu"]
    assert arguments_dict(lars_ops[0].arg) == pytest.approx({"offset": 0.2, "lr_min": 0.0})
    muls = [op for op in ops if op.type == "Mul"]
    assert [list(op.input)[1] for op in muls] == [op.output[0] for op in lars_ops]
    assert all(op.output[0] == f"SgdOptimizer_{n}_local_scaled_lr_cpu" for op in muls)
    sums = [op for op in ops if op.type == "WeightedSum"]
    assert [op.input[3] for op in sums] == [muls[0].output[0]] * 2
    data, target = randn(6, 3, dtype=np.float32), randn(6, 1, dtype=np.float32)
    workspace.FeedBlob("data", data)
    workspace.FeedBlob("target", target)
    workspace.RunNetOnce(model.param_init_net)
    w, b = workspace.FetchBlob("fc_w").copy(), workspace.FetchBlob("fc_b").copy()
    workspace.RunNetOnce(model.net)
    dpred = 2 * ((data @ w.T + b) - target) / 2 / len(data)  # d(0.5 |y - t|² mean)
    for name, value, grad in (("fc_w", w, dpred.T @ data), ("fc_b", b, dpred.sum(0))):
        norm_x, norm_g = np.linalg.norm(value), np.linalg.norm(grad)
        local = 1.0 / (norm_g / norm_x + 0.2) if norm_x > 0 else 1.0
        np.testing.assert_allclose(workspace.FetchBlob(name), value - 0.1 * local * grad,
                                   rtol=1e-4, atol=1e-6, err_msg=name)


def test_sgd_lars_rejects_negative_offset_and_skips_sparse() -> None:
    with pytest.raises(ModelConfigError, match="Lars offset"):
        optimizer.build_sgd(_sgd_model("neg"), 0.1, lars=-0.5)
    net, init = core.Net("n"), core.Net("i")
    sgd = optimizer.SgdOptimizer(0.1, lars=0.5)
    sgd(net, init, core.BlobReference("emb"),
        core.GradientSlice(core.BlobReference("idx"), core.BlobReference("vals")))
    assert not [op for op in net.Proto().op if op.type == "Lars"]


def test_adagrad_lars_scales_the_lr() -> None:
    model = _sgd_model("adagrad_lars")
    opt = optimizer.build_adagrad(model, 0.1, lars=0.3)
    ops = model.net.Proto().op
    n = opt._instance_num
    assert [op.output[0] for op in ops if op.type == "Lars"] == [
        f"AdagradOptimizer_{n}_fc_w_lars_cpu", f"AdagradOptimizer_{n}_fc_b_lars_cpu"]
    adagrads = [op for op in ops if op.type == "Adagrad"]
    assert [op.input[3] for op in adagrads] == [f"AdagradOptimizer_{n}_local_scaled_lr_cpu"] * 2


def test_yellowfin_builder_trains() -> None:
    workspace.ResetWorkspace()
    model = _sgd_model("yf")
    for op in model.param_init_net.Proto().op:  # a fixed init: 7 of 200 random ones make
        op.device_option.random_seed = 3          # YellowFin overshoot within 5 steps
    optimizer.build_yellowfin(model, base_learning_rate=0.05)
    assert [op.type for op in model.net.Proto().op].count("YellowFin") == 2
    rng = np.random.default_rng(5)
    workspace.FeedBlob("data", rng.standard_normal((16, 3)).astype(np.float32))
    workspace.FeedBlob("target", rng.standard_normal((16, 1)).astype(np.float32))
    # (YellowFin's curvature proxy is |g|², so a bias whose gradient gets small is given a
    # huge lr within a few dozen steps, in Caffe2 too: only the first steps are checked.)
    losses = _train_losses(model, steps=5)
    assert np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0), losses
    assert float(workspace.FetchBlob("fc_w_lr_avg")[0]) != pytest.approx(0.05)
