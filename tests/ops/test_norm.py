"""Normalisation ops: numpy references, finite-difference gradient checks, the
multi-batch SpatialBN path and gradient-op structure."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph.errors import ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(99)


def randn(*shape: int, dtype: type = np.float64) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def channel_axes(ndim: int, order: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reduce axes, per-channel broadcast shape template)."""
    if order == "NCHW":
        return (0, *range(2, ndim)), (1, -1, *(1,) * (ndim - 2))
    return tuple(range(ndim - 1)), (-1,)


SHAPES = [(4, 3, 5), (3, 2, 4, 3), (2, 3, 2, 3, 2)]  # 1-D, 2-D, 3-D spatial (NCHW)


def nchw_to(order: str, x: np.ndarray) -> np.ndarray:
    return x if order == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))


# --- SpatialBN ----------------------------------------------------------------------------
def bn_inputs(shape, order):
    x = nchw_to(order, randn(*shape) * 2 + 0.5)
    c = shape[1]
    return [x, randn(c), randn(c), randn(c), np.abs(randn(c)) + 0.5]


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES)
def test_spatial_bn_training_matches_numpy(shape, order: str) -> None:
    x, scale, bias, rm, rv = bn_inputs(shape, order)
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "siv"],
                 order=order, epsilon=1e-3, momentum=0.8)
    y, new_rm, new_rv, sm, siv = run_op(op, [x, scale, bias, rm, rv])
    axes, bshape = channel_axes(x.ndim, order)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    inv = 1 / np.sqrt(var + 1e-3)
    expected = (x - mean.reshape(bshape)) * (inv * scale).reshape(bshape) + bias.reshape(bshape)
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(new_rm, 0.8 * rm + 0.2 * mean)
    n = x.size // shape[1]
    np.testing.assert_allclose(new_rv, 0.8 * rv + 0.2 * var * n / (n - 1))  # unbiased
    np.testing.assert_allclose(sm, mean)
    np.testing.assert_allclose(siv, inv)
    check_gradient(op, [x, scale, bias, rm, rv], inputs_to_check=[0, 1, 2], atol=1e-4)


@pytest.mark.parametrize("num_batches", [1, 3])
def test_spatial_bn_empty_batch_keeps_running_stats(num_batches: int) -> None:
    x, scale, bias, rm, rv = bn_inputs((2, 3, 4), "NCHW")
    inputs = [x[:0], scale, bias, rm, rv] + [np.zeros(3), np.zeros(3)] * (num_batches > 1)
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv", "sums", "sumsq"][:len(inputs)],
                 ["Y", "rm", "rv", "sm", "siv"], num_batches=num_batches)
    y, new_rm, new_rv, sm, siv = run_op(op, inputs)
    assert y.shape == (0, 3, 4)
    np.testing.assert_array_equal(new_rm, rm)
    np.testing.assert_array_equal(new_rv, rv)
    np.testing.assert_array_equal(sm, np.zeros(3))
    np.testing.assert_array_equal(siv, np.zeros(3))


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_test_mode_and_its_gradient(order: str) -> None:
    x, scale, bias, rm, rv = bn_inputs((3, 2, 4, 3), order)
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y"], order=order, is_test=1)
    (y,) = run_op(op, [x, scale, bias, rm, rv])
    _, bshape = channel_axes(x.ndim, order)
    expected = ((x - rm.reshape(bshape)) / np.sqrt(rv.reshape(bshape) + 1e-5)
                * scale.reshape(bshape) + bias.reshape(bshape))
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-12)
    check_gradient(op, [x, scale, bias, rm, rv], inputs_to_check=[0, 1, 2], atol=1e-5)


def test_spatial_bn_float32_and_empty_test_batch() -> None:
    x, scale, bias, rm, rv = (a.astype(np.float32) for a in bn_inputs((2, 3, 4, 4), "NCHW"))
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "siv"])
    assert all(o.dtype == np.float32 for o in run_op(op, [x, scale, bias, rm, rv]))
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y"], is_test=1)
    (y,) = run_op(op, [x[:0], scale, bias, rm, rv])
    assert y.shape == (0, 3, 4, 4)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_num_batches_equals_full_batch(order: str) -> None:
    """Two half batches with combined sums give the full-batch forward and gradient."""
    x, scale, bias, rm, rv = bn_inputs((6, 3, 4, 2), order)
    dy = randn(*x.shape)
    names = ["X", "s", "b", "rm", "rv"]
    full_op = make_op("SpatialBN", names, ["Y", "rm2", "rv2", "sm", "siv"], order=order)
    full_grad, _ = build_gradient(full_op, ["dY"])
    full = run_ops([full_op, *full_grad], dict(zip(names, [x, scale, bias, rm, rv]), dY=dy))
    halves = [x[:3], x[3:]]
    stats = [run_op(make_op("ChannelStats", ["X"], ["a", "b"], order=order), [h])
             for h in halves]
    sums, sumsq = stats[0][0] + stats[1][0], stats[0][1] + stats[1][1]
    outs = []
    for k, (h, dyh) in enumerate(zip(halves, [dy[:3], dy[3:]])):
        op = make_op("SpatialBN", [*names, "sums", "sumsq"], ["Y", "rm2", "rv2", "sm", "siv"],
                     order=order, num_batches=2)
        grad_ops, grads = build_gradient(op, ["dY"])
        assert list(grad_ops[0].input) == ["X", "s", "dY", "sm", "siv", "s_grad", "b_grad"]
        state = run_ops([op], dict(zip(names, [h, scale, bias, rm, rv]), sums=sums,
                                   sumsq=sumsq))
        np.testing.assert_allclose(state["Y"], full["Y"][3 * k:3 * k + 3], rtol=1e-9)
        np.testing.assert_allclose(state["rm2"], full["rm2"], rtol=1e-9)
        np.testing.assert_allclose(state["rv2"], full["rv2"], rtol=1e-9)
        ds, db = run_op(make_op("ChannelBackpropStats", ["X", "m", "i", "dY"], ["ds", "db"],
                                order=order), [h, state["sm"], state["siv"], dyh])
        outs.append((state, dyh, ds, db, grad_ops[0]))
    ds_total = outs[0][2] + outs[1][2]
    db_total = outs[0][3] + outs[1][3]
    for k, (state, dyh, _, _, grad_op) in enumerate(outs):
        state = run_ops([grad_op], {**state, "dY": dyh, "s_grad": ds_total, "b_grad": db_total})
        np.testing.assert_allclose(state["X_grad"], full["X_grad"][3 * k:3 * k + 3], rtol=1e-8)
        np.testing.assert_allclose(2 * state["s_grad"], full["s_grad"], rtol=1e-8)
        np.testing.assert_allclose(2 * state["b_grad"], full["b_grad"], rtol=1e-8)


def test_spatial_bn_gradient_op_structure() -> None:
    op = make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "siv"],
                 momentum=0.9)
    ops, grads = build_gradient(op, ["Y_grad", None, None, None, None])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [(
        "SpatialBNGradient", ["X", "s", "Y_grad", "sm", "siv"], ["X_grad", "s_grad", "b_grad"])]
    assert grads[:3] == ["X_grad", "s_grad", "b_grad"]
    with pytest.raises(ShapeError, match="5 outputs"):
        run_op(make_op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y"]), bn_inputs((2, 3, 2),
                                                                                  "NCHW"))


# --- ChannelStats / ChannelBackpropStats --------------------------------------------------
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES)
def test_channel_stats_and_backprop_stats(shape, order: str) -> None:
    x = nchw_to(order, randn(*shape))
    dy = randn(*x.shape)
    axes, bshape = channel_axes(x.ndim, order)
    s, ss = run_op(make_op("ChannelStats", ["X"], ["s", "ss"], order=order), [x])
    np.testing.assert_allclose(s, x.sum(axis=axes))
    np.testing.assert_allclose(ss, (x * x).sum(axis=axes))
    mean, inv = randn(shape[1]), np.abs(randn(shape[1])) + 0.1
    ds, db = run_op(make_op("ChannelBackpropStats", ["X", "m", "i", "dY"], ["ds", "db"],
                            order=order), [x, mean, inv, dy])
    np.testing.assert_allclose(
        ds, (dy * (x - mean.reshape(bshape)) * inv.reshape(bshape)).sum(axis=axes))
    np.testing.assert_allclose(db, dy.sum(axis=axes))


# --- AffineChannel ------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("learnable", [0, 1])
def test_affine_channel(order: str, learnable: int) -> None:
    x = nchw_to(order, randn(2, 3, 4, 2))
    scale, bias = randn(3), randn(3)
    _, bshape = channel_axes(4, order)
    op = make_op("AffineChannel", ["X", "s", "b"], ["Y"], order=order, is_learnable=learnable)
    np.testing.assert_allclose(run_op(op, [x, scale, bias])[0],
                               x * scale.reshape(bshape) + bias.reshape(bshape))
    check_gradient(op, [x, scale, bias], inputs_to_check=[0, 1, 2] if learnable else [0])
    ops, grads = build_gradient(op, ["Y_grad"])
    expected_in = ["Y_grad", "X", "s"] if learnable else ["Y_grad", "s"]
    assert list(ops[0].input) == expected_in
    assert grads == (["X_grad", "s_grad", "b_grad"] if learnable else ["X_grad", None, None])


# --- GroupNorm / InstanceNorm -------------------------------------------------------------
def ref_group_norm(x, gamma, beta, groups, eps):
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean, var = xg.mean(axis=2), xg.var(axis=2)
    inv = 1 / np.sqrt(var + eps)
    y = ((xg - mean[..., None]) * inv[..., None]).reshape(x.shape)
    bshape = (1, c, *(1,) * (x.ndim - 2))
    return y * gamma.reshape(bshape) + beta.reshape(bshape), mean, inv


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape,groups", [((2, 4, 3, 2), 2), ((3, 6, 5), 3), ((2, 4, 2, 2, 2), 4)])
def test_group_norm(shape, groups: int, order: str) -> None:
    x, gamma, beta = randn(*shape), randn(shape[1]), randn(shape[1])
    y_ref, mean, inv = ref_group_norm(x, gamma, beta, groups, 1e-5)
    op = make_op("GroupNorm", ["X", "g", "b"], ["Y", "mean", "inv"], group=groups, order=order)
    y, m, i = run_op(op, [nchw_to(order, x), gamma, beta])
    np.testing.assert_allclose(y, nchw_to(order, y_ref), rtol=1e-10)
    np.testing.assert_allclose(m, mean)
    np.testing.assert_allclose(i, inv)
    check_gradient(op, [nchw_to(order, x), gamma, beta], atol=1e-5)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("outputs", [1, 3])
def test_instance_norm(order: str, outputs: int) -> None:
    x, scale, bias = randn(2, 3, 4, 3), randn(3), randn(3)
    y_ref, mean, inv = ref_group_norm(x, scale, bias, 3, 1e-5)
    op = make_op("InstanceNorm", ["X", "s", "b"], ["Y", "sm", "siv"][:outputs], order=order)
    result = run_op(op, [nchw_to(order, x), scale, bias])
    np.testing.assert_allclose(result[0], nchw_to(order, y_ref), rtol=1e-10)
    if outputs == 3:
        np.testing.assert_allclose(result[1], mean)
        np.testing.assert_allclose(result[2], inv)
    check_gradient(op, [nchw_to(order, x), scale, bias], atol=1e-5)
    ops, _ = build_gradient(op, ["Y_grad"] + [None] * (outputs - 1))
    assert len(ops[0].input) == 4 + (outputs - 1)


# --- LayerNorm ----------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [1, 2, -1])
@pytest.mark.parametrize("affine", [0, 1])
def test_layer_norm(axis: int, affine: int) -> None:
    x = randn(2, 3, 4)
    canonical = axis % 3
    inner = x.shape[canonical:]
    gamma, beta = randn(*inner), randn(*inner)
    inputs = [x, gamma, beta] if affine else [x]
    op = make_op("LayerNorm", ["X", "g", "b"][:len(inputs)], ["Y", "mean", "std"], axis=axis,
                 epsilon=1e-4, elementwise_affine=affine)
    y, mean, std = run_op(op, inputs)
    flat = x.reshape(int(np.prod(x.shape[:canonical])), -1)
    m, s = flat.mean(axis=1), np.sqrt(flat.var(axis=1) + float(np.float32(1e-4)))
    expected = ((flat - m[:, None]) / s[:, None]).reshape(x.shape)
    if affine:
        expected = expected * gamma + beta
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-12)
    assert mean.shape == std.shape == (*x.shape[:canonical], 1)
    np.testing.assert_allclose(std.ravel(), s)
    check_gradient(op, inputs, atol=1e-5)
    ops, _ = build_gradient(op, ["Y_grad", None, None])
    assert list(ops[0].input)[:5] == ["Y_grad", "Y", "mean", "std", "X"]


# --- ElementwiseLinear, Moments, BatchMoments ---------------------------------------------
@pytest.mark.parametrize("axis", [1, 2])
def test_elementwise_linear(axis: int) -> None:
    x = randn(2, 3, 4)
    d = int(np.prod(x.shape[axis:]))
    a, b = randn(d), randn(d)
    op = make_op("ElementwiseLinear", ["X", "a", "b"], ["Y"], axis=axis)
    flat = x.reshape(-1, d)
    np.testing.assert_allclose(run_op(op, [x, a, b])[0], (flat * a + b).reshape(x.shape))
    check_gradient(op, [x, a, b])


@pytest.mark.parametrize("axes,keepdims", [(None, 1), ([0, 2], 0), ([1], 1), ([-1], 0)])
def test_moments(axes, keepdims: int) -> None:
    x = randn(3, 4, 2)
    kwargs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    op = make_op("Moments", ["X"], ["mean", "var"], **kwargs)
    mean, var = run_op(op, [x])
    ax = None if axes is None else tuple(axes)
    np.testing.assert_allclose(mean, x.mean(axis=ax, keepdims=bool(keepdims)))
    np.testing.assert_allclose(var, x.var(axis=ax, keepdims=bool(keepdims)))
    check_gradient(op, [x], outputs_with_grads=[0, 1])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_batch_moments(order: str) -> None:
    x = nchw_to(order, randn(3, 2, 4, 2))
    axes, _ = channel_axes(4, order)
    op = make_op("BatchMoments", ["X"], ["mu", "var"], order=order)
    mu, second = run_op(op, [x])
    np.testing.assert_allclose(mu, x.mean(axis=axes))
    np.testing.assert_allclose(second, (x * x).mean(axis=axes))
    check_gradient(op, [x], outputs_with_grads=[0, 1])
