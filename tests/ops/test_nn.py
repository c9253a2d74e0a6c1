"""FC, MatMul, BatchMatMul, Conv, ConvTranspose and pooling: numpy references, finite
difference gradient checks, gradient-op structure and shape inference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpgraph.errors import GradientError, ShapeError
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(1234)


def randn(*shape: int, dtype: type = np.float64) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# --- references ---------------------------------------------------------------------------
def ref_conv(x, w, b, stride, head, tail, dil, group):
    """Direct N-d convolution, channel-first, one output position at a time."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0), *zip(head, tail)])
    out = [(xp.shape[2 + i] - (dil[i] * (k[i] - 1) + 1)) // stride[i] + 1 for i in range(len(k))]
    y = np.zeros((n, m, *out), dtype=np.float64)
    mg = m // group
    for pos in itertools.product(*(range(o) for o in out)):
        window = tuple(slice(p * s, p * s + d * (kk - 1) + 1, d)
                       for p, s, d, kk in zip(pos, stride, dil, k))
        patch = xp[(slice(None), slice(None), *window)]
        for g in range(group):
            y[(slice(None), slice(g * mg, (g + 1) * mg), *pos)] = np.tensordot(
                patch[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg],
                axes=(list(range(1, w.ndim)), list(range(1, w.ndim))))
    if b is not None:
        y += b.reshape(-1, *(1,) * len(k))
    return y


def ref_conv_transpose(x, w, b, stride, head, tail, adj, group):
    n, c = x.shape[:2]
    mg = w.shape[1]
    k = w.shape[2:]
    cg = c // group
    full = [(x.shape[2 + i] - 1) * stride[i] + k[i] + adj[i] for i in range(len(k))]
    y = np.zeros((n, mg * group, *full))
    for pos in itertools.product(*(range(s) for s in x.shape[2:])):
        window = tuple(slice(p * s, p * s + kk) for p, s, kk in zip(pos, stride, k))
        for g in range(group):
            contrib = np.einsum("nc,cm...->nm...", x[(slice(None), slice(g * cg, (g + 1) * cg),
                                                      *pos)], w[g * cg:(g + 1) * cg])
            y[(slice(None), slice(g * mg, (g + 1) * mg), *window)] += contrib
    crop = tuple(slice(h, f - t) for h, t, f in zip(head, tail, full))
    y = y[(slice(None), slice(None), *crop)]
    return y if b is None else y + b.reshape(-1, *(1,) * len(k))


def ref_pool(x, kind, k, stride, head, tail, include_pad=False):
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, [(0, 0), (0, 0), *zip(head, tail)], constant_values=fill)
    ones = np.pad(np.ones(x.shape[2:]), list(zip(head, tail)))
    out = [(xp.shape[2 + i] - k[i]) // stride[i] + 1 for i in range(len(k))]
    y = np.zeros((*x.shape[:2], *out))
    for pos in itertools.product(*(range(o) for o in out)):
        window = tuple(slice(p * s, p * s + kk) for p, s, kk in zip(pos, stride, k))
        patch = xp[(slice(None), slice(None), *window)].reshape(*x.shape[:2], -1)
        if kind == "max":
            y[(slice(None), slice(None), *pos)] = patch.max(axis=-1)
        else:
            count = math.prod(k) if include_pad else ones[window].sum()
            y[(slice(None), slice(None), *pos)] = patch.sum(axis=-1) / count
    return y


def to_nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


# --- FC -----------------------------------------------------------------------------------
@pytest.mark.parametrize("axis,axis_w", [(1, 1), (2, 1), (1, 2)])
def test_fc_matches_numpy_and_gradient(axis: int, axis_w: int) -> None:
    x = randn(2, 3, 4)
    k = math.prod(x.shape[axis:])
    w = randn(5, k) if axis_w == 1 else randn(5, 1, k)
    b = randn(math.prod(w.shape[:axis_w]))
    op = make_op("FC", ["X", "W", "b"], ["Y"], axis=axis, axis_w=axis_w)
    (y,) = run_op(op, [x, w, b])
    expected = x.reshape(math.prod(x.shape[:axis]), k) @ w.reshape(-1, k).T + b
    np.testing.assert_allclose(y.reshape(expected.shape), expected, rtol=1e-10)
    assert y.shape == (*x.shape[:axis], b.size)
    check_gradient(op, [x, w, b])


def test_fc_keeps_float32_and_handles_empty_batch() -> None:
    op = make_op("FC", ["X", "W", "b"], ["Y"])
    x, w, b = np.zeros((0, 3), np.float32), randn(4, 3, dtype=np.float32), np.ones(4, np.float32)
    (y,) = run_op(op, [x, w, b])
    assert y.shape == (0, 4) and y.dtype == np.float32
    dw, db, dx = run_op(make_op("FCGradient", ["X", "W", "dY"], ["dW", "db", "dX"]),
                        [x, w, np.zeros((0, 4), np.float32)])
    assert dw.shape == w.shape and not dw.any() and db.shape == (4,) and dx.shape == (0, 3)
    assert dw.dtype == db.dtype == dx.dtype == np.float32


def test_fc_rejects_mismatched_weight() -> None:
    with pytest.raises(ShapeError, match="axis"):
        run_op(make_op("FC", ["X", "W", "b"], ["Y"]), [randn(2, 3), randn(4, 5), randn(4)])


def test_fc_transposed_and_gradient_ops() -> None:
    x, w, b = randn(3, 4), randn(4, 2), randn(2)
    op = make_op("FCTransposed", ["X", "W", "b"], ["Y"])
    np.testing.assert_allclose(run_op(op, [x, w, b])[0], x @ w + b)
    check_gradient(op, [x, w, b])
    ops, grads = build_gradient(make_op("FC", ["X", "W", "b"], ["Y"]), ["Y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("FCGradient", ["X", "W", "Y_grad"], ["W_grad", "b_grad", "X_grad"])]
    assert grads == ["X_grad", "W_grad", "b_grad"]


def test_fc_shape_inference() -> None:
    op = make_op("FC", ["X", "W", "b"], ["Y"], axis=2)
    fn = OPERATORS.lookup("FC").shape_fn
    assert fn(op, [(2, 3, 4, 5), (7, 20), (7,)], [1, 1, 1]) == [((2, 3, 7), 1)]


# --- MatMul / BatchMatMul -----------------------------------------------------------------
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], repeat=2)))
def test_matmul_all_transposes(trans_a: int, trans_b: int) -> None:
    a = randn(4, 3) if trans_a else randn(3, 4)
    b = randn(5, 4) if trans_b else randn(4, 5)
    op = make_op("MatMul", ["A", "B"], ["Y"], trans_a=trans_a, trans_b=trans_b)
    (y,) = run_op(op, [a, b])
    np.testing.assert_allclose(y, (a.T if trans_a else a) @ (b.T if trans_b else b))
    check_gradient(op, [a, b])
    ops, _ = build_gradient(op, ["Y_grad"])
    assert [o.type for o in ops] == ["MatMul", "MatMul"]
    assert all(not any(arg.name == "trans_a" and arg.i == 0 for arg in o.arg) for o in ops)


def test_matmul_flattens_at_axes_and_reshapes_to_third_input() -> None:
    a, b = randn(2, 3, 4), randn(12, 5)
    op = make_op("MatMul", ["A", "B"], ["Y"], axis_a=1, trans_a=1)
    np.testing.assert_allclose(run_op(op, [randn(12, 3), b])[0].shape, (3, 5))
    op = make_op("MatMul", ["A", "B"], ["Y"], axis_a=2)
    (y,) = run_op(op, [a, randn(4, 5)])
    assert y.shape == (6, 5)
    op = make_op("MatMul", ["A", "B", "S"], ["Y"], axis_a=1)
    (y,) = run_op(op, [a, b, np.zeros((2, 5))])
    np.testing.assert_allclose(y, a.reshape(2, 12) @ b)
    check_gradient(make_op("MatMul", ["A", "B"], ["Y"], axis_a=1, axis_b=1, trans_b=1),
                   [a, randn(5, 6, 2)])


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], repeat=2)))
def test_batch_matmul(trans_a: int, trans_b: int) -> None:
    a = randn(2, 4, 3) if trans_a else randn(2, 3, 4)
    b = randn(2, 5, 4) if trans_b else randn(2, 4, 5)
    op = make_op("BatchMatMul", ["A", "B"], ["Y"], trans_a=trans_a, trans_b=trans_b)
    expected = np.matmul(a.swapaxes(1, 2) if trans_a else a, b.swapaxes(1, 2) if trans_b else b)
    np.testing.assert_allclose(run_op(op, [a, b])[0], expected)
    check_gradient(op, [a, b])


def test_batch_matmul_broadcast_forward_only() -> None:
    a, b = randn(3, 2, 4), randn(4, 5)
    op = make_op("BatchMatMul", ["A", "B"], ["Y"], broadcast=1)
    np.testing.assert_allclose(run_op(op, [a, b])[0], a @ b)
    with pytest.raises(ShapeError):
        run_op(make_op("BatchMatMul", ["A", "B"], ["Y"]), [a, b])
    with pytest.raises(GradientError, match="broadcast"):
        build_gradient(op, ["Y_grad"])


# --- Conv ---------------------------------------------------------------------------------
CONV_CASES = [
    # (spatial, kernel, stride, head, tail, dilation, group, bias)
    ((5, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), 1, True),
    ((7, 6), (3, 2), (2, 1), (1, 0), (0, 2), (1, 1), 2, False),
    ((7, 7), (3, 3), (1, 2), (2, 1), (1, 2), (2, 1), 2, True),
    ((6, 5), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), 1, False),
    ((4, 4), (2, 2), (1, 1), (3, 0), (0, 0), (1, 1), 1, True),
]


def conv_args(kernel, stride, head, tail, dil, group, order):
    return dict(kernels=list(kernel), strides=list(stride), pads=[*head, *tail],
                dilations=list(dil), group=group, order=order)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_and_gradient(case, order: str) -> None:
    spatial, kernel, stride, head, tail, dil, group, bias = case
    x, w = randn(2, 4, *spatial), randn(4, 4 // group, *kernel)
    b = randn(4) if bias else None
    expected = ref_conv(x, w, b, stride, head, tail, dil, group)
    if order == "NHWC":
        x, w, expected = to_nhwc(x), to_nhwc(w), to_nhwc(expected)
    inputs = [x, w] + ([b] if bias else [])
    op = make_op("Conv", ["X", "W", "b"][:len(inputs)], ["Y"],
                 **conv_args(kernel, stride, head, tail, dil, group, order))
    (y,) = run_op(op, inputs)
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)
    check_gradient(op, inputs, atol=1e-4, rtol=1e-4)


@settings(max_examples=15, deadline=None)
@given(size=st.tuples(st.integers(3, 7), st.integers(3, 7)), k=st.integers(1, 3),
       stride=st.integers(1, 3), pad=st.integers(0, 2), dil=st.integers(1, 2),
       group=st.sampled_from([1, 2]), order=st.sampled_from(["NCHW", "NHWC"]))
def test_conv_random_geometry(size, k, stride, pad, dil, group, order) -> None:
    assume(min(size) + 2 * pad >= dil * (k - 1) + 1)
    x, w, b = randn(2, 4, *size), randn(6, 4 // group, k, k), randn(6)
    expected = ref_conv(x, w, b, (stride,) * 2, (pad,) * 2, (pad,) * 2, (dil,) * 2, group)
    if order == "NHWC":
        x, w, expected = to_nhwc(x), to_nhwc(w), to_nhwc(expected)
    op = make_op("Conv", ["X", "W", "b"], ["Y"], kernel=k, stride=stride, pad=pad,
                 dilation=dil, group=group, order=order)
    np.testing.assert_allclose(run_op(op, [x, w, b])[0], expected, rtol=1e-10, atol=1e-10)
    dy = randn(*expected.shape)
    dw, db, dx = run_op(make_op("ConvGradient", ["X", "W", "dY"], ["dW", "db", "dX"],
                                kernel=k, stride=stride, pad=pad,
                                dilation=dil, group=group, order=order), [x, w, dy])
    # adjoint identities: <conv(x, w), dy> is linear in x and in w
    y = run_op(op, [x, w, np.zeros(6)])[0]
    np.testing.assert_allclose(np.sum(y * dy), np.sum(dx * x), rtol=1e-9)
    np.testing.assert_allclose(np.sum(y * dy), np.sum(dw * w), rtol=1e-9)
    np.testing.assert_allclose(db, dy.sum(axis=tuple(i for i in range(4) if i != (
        1 if order == "NCHW" else 3))), rtol=1e-10)


def test_conv_legacy_2d_arguments_and_float32() -> None:
    x, w, b = randn(2, 3, 6, 6, dtype=np.float32), randn(5, 3, 3, 3, dtype=np.float32), randn(5)
    op = make_op("Conv", ["X", "W", "b"], ["Y"], kernel_h=3, kernel_w=3, stride_h=2, stride_w=1,
                 pad_t=1, pad_l=0, pad_b=1, pad_r=2)
    (y,) = run_op(op, [x, w, b.astype(np.float32)])
    expected = ref_conv(x.astype(np.float64), w.astype(np.float64), b, (2, 1), (1, 0), (1, 2),
                        (1, 1), 1)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    op = make_op("Conv", ["X", "W"], ["Y"], kernel=3, pad=1, stride=1)
    assert run_op(op, [x, w])[0].shape == (2, 5, 6, 6)


@pytest.mark.parametrize("nd", [1, 3])
def test_conv_other_ranks(nd: int) -> None:
    spatial = (7,) if nd == 1 else (4, 5, 3)
    kernel = (3,) * nd
    x, w, b = randn(2, 2, *spatial), randn(3, 2, *kernel), randn(3)
    args = conv_args(kernel, (2,) * nd, (1,) * nd, (0,) * nd, (1,) * nd, 1, "NCHW")
    op = make_op("Conv", ["X", "W", "b"], ["Y"], **args)
    expected = ref_conv(x, w, b, (2,) * nd, (1,) * nd, (0,) * nd, (1,) * nd, 1)
    np.testing.assert_allclose(run_op(op, [x, w, b])[0], expected, rtol=1e-10)
    if nd == 1:
        check_gradient(op, [x, w, b], atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_empty_batch(stride: int) -> None:
    x, w = np.zeros((0, 3, 5, 5), np.float32), randn(4, 3, 3, 3, dtype=np.float32)
    args = dict(kernel=3, pad=1, stride=stride)
    (y,) = run_op(make_op("Conv", ["X", "W"], ["Y"], **args), [x, w])
    out = 5 if stride == 1 else 3
    assert y.shape == (0, 4, out, out) and y.dtype == np.float32
    dw, dx = run_op(make_op("ConvGradient", ["X", "W", "dY"], ["dW", "dX"], no_bias=1, **args),
                    [x, w, y])
    assert dw.shape == w.shape and not dw.any() and dx.shape == x.shape


def test_conv_gradient_ops_match_caffe2() -> None:
    op = make_op("Conv", ["X", "W", "b"], ["Y"], kernel=3)
    ops, grads = build_gradient(op, ["Y_grad"])
    assert (ops[0].type, list(ops[0].output)) == ("ConvGradient", ["W_grad", "b_grad", "X_grad"])
    assert grads == ["X_grad", "W_grad", "b_grad"]
    op = make_op("Conv", ["X", "W"], ["Y"], kernel=3, no_gradient_to_input=1)
    ops, grads = build_gradient(op, ["Y_grad"])
    assert list(ops[0].output) == ["W_grad"] and grads[0] is None
    assert ops[0].arg[0].name == "no_bias" and ops[0].arg[0].i == 1
    x, w, dy = randn(1, 2, 4, 4), randn(3, 2, 3, 3), randn(1, 3, 2, 2)
    (dw,) = run_op(ops[0], [x, w, dy])
    full = run_op(make_op("ConvGradient", ["X", "W", "dY"], ["dW", "dX"], kernel=3, no_bias=1),
                  [x, w, dy])
    np.testing.assert_allclose(dw, full[0])


@pytest.mark.parametrize("op_type", ["Conv2D", "MaxPool2D", "AveragePool1D"])
def test_fixed_rank_aliases(op_type: str) -> None:
    x = distinct(1, 2, 5) if op_type.endswith("1D") else distinct(1, 2, 4, 4)
    inputs = [x, randn(3, 2, 3, 3)] if op_type.startswith("Conv") else [x]
    op = make_op(op_type, ["X", "W"][:len(inputs)], ["Y"], kernel=3 if len(inputs) == 2 else 2)
    base = make_op(op_type[:-2], list(op.input), ["Y"], kernel=op.arg[0].i)
    np.testing.assert_allclose(run_op(op, inputs)[0], run_op(base, inputs)[0])
    ops, _ = build_gradient(op, ["Y_grad"])
    assert ops[0].type == op_type + "Gradient"
    check_gradient(op, inputs, atol=1e-5)


def test_conv_shape_inference_and_errors() -> None:
    fn = OPERATORS.lookup("Conv").shape_fn
    op = make_op("Conv", ["X", "W"], ["Y"], kernel=3, stride=2, pad=1, order="NHWC")
    assert fn(op, [(8, 9, 9, 3), (16, 3, 3, 3)], [1, 1]) == [((8, 5, 5, 16), 1)]
    with pytest.raises(ShapeError, match="group"):
        run_op(make_op("Conv", ["X", "W"], ["Y"], kernel=1), [randn(1, 3, 2, 2),
                                                            randn(2, 2, 1, 1)])


# --- ConvTranspose ------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride,head,tail,adj,group", [
    ((1, 1), (0, 0), (0, 0), (0, 0), 1),
    ((2, 2), (1, 0), (0, 1), (1, 0), 1),
    ((2, 1), (0, 1), (1, 1), (0, 0), 2),
])
def test_conv_transpose(order: str, stride, head, tail, adj, group) -> None:
    x, w, b = randn(2, 4, 3, 4), randn(4, 3, 3, 2), randn(3 * group)
    expected = ref_conv_transpose(x, w, b, stride, head, tail, adj, group)
    if order == "NHWC":
        x, w, expected = to_nhwc(x), to_nhwc(w), to_nhwc(expected)
    op = make_op("ConvTranspose", ["X", "W", "b"], ["Y"], kernels=[3, 2], strides=list(stride),
                 pads=[*head, *tail], adjs=list(adj), group=group, order=order)
    (y,) = run_op(op, [x, w, b])
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)
    check_gradient(op, [x, w, b], atol=1e-4, rtol=1e-4)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert ops[0].type == "ConvTransposeGradient"
    shape_fn = OPERATORS.lookup("ConvTranspose").shape_fn
    assert shape_fn(op, [x.shape, w.shape, b.shape], [1, 1, 1]) == [(y.shape, 1)]


# --- Pooling ------------------------------------------------------------------------------
POOL_CASES = [
    ((5, 6), (2, 2), (2, 2), (0, 0), (0, 0)),
    ((5, 5), (3, 3), (1, 2), (1, 1), (1, 0)),
    ((6, 4), (3, 2), (2, 1), (0, 1), (2, 0)),
]


def distinct(*shape: int) -> np.ndarray:
    """Values spaced 0.1 apart, so max pooling has no ties within a finite difference step."""
    return (RNG.permutation(math.prod(shape)) * 0.1 - 1.0).reshape(shape)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(case, kind: str, order: str) -> None:
    spatial, kernel, stride, head, tail = case
    x = distinct(2, 3, *spatial)
    expected = ref_pool(x, "max" if kind == "MaxPool" else "avg", kernel, stride, head, tail)
    if order == "NHWC":
        x, expected = to_nhwc(x), to_nhwc(expected)
    op = make_op(kind, ["X"], ["Y"], kernels=list(kernel), strides=list(stride),
                 pads=[*head, *tail], order=order)
    np.testing.assert_allclose(run_op(op, [x])[0], expected, rtol=1e-12)
    check_gradient(op, [x], atol=1e-6, rtol=1e-6)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert [(o.type, list(o.input)) for o in ops] == [(kind + "Gradient", ["X", "Y", "Y_grad"])]


def test_average_pool_count_include_pad_and_global() -> None:
    x = randn(2, 3, 4, 5)
    op = make_op("AveragePool", ["X"], ["Y"], kernel=3, stride=1, pad=1, count_include_pad=1)
    expected = ref_pool(x, "avg", (3, 3), (1, 1), (1, 1), (1, 1), include_pad=True)
    np.testing.assert_allclose(run_op(op, [x])[0], expected)
    check_gradient(op, [x], atol=1e-6)
    for kind, reduce in (("AveragePool", np.mean), ("MaxPool", np.max)):
        op = make_op(kind, ["X"], ["Y"], global_pooling=1)
        np.testing.assert_allclose(run_op(op, [x])[0], reduce(x, axis=(2, 3), keepdims=True))
    op = make_op("MaxPool", ["X"], ["Y"], global_pooling=1, order="NHWC")
    assert run_op(op, [to_nhwc(x)])[0].shape == (2, 1, 1, 3)


def test_max_pool_gradient_goes_to_every_tied_maximum() -> None:
    x = np.ones((1, 1, 2, 2), np.float32)
    op = make_op("MaxPoolGradient", ["X", "Y", "dY"], ["dX"], kernel=2)
    (dx,) = run_op(op, [x, np.ones((1, 1, 1, 1), np.float32), np.full((1, 1, 1, 1), 3.0,
                                                                      np.float32)])
    np.testing.assert_array_equal(dx, np.full((1, 1, 2, 2), 3.0))
    assert dx.dtype == np.float32


def test_pool_shape_inference_and_empty_batch() -> None:
    fn = OPERATORS.lookup("MaxPool").shape_fn
    op = make_op("MaxPool", ["X"], ["Y"], kernel=3, stride=2)
    assert fn(op, [(4, 8, 7, 7)], [1]) == [((4, 8, 3, 3), 1)]
    (y,) = run_op(op, [np.zeros((0, 8, 7, 7), np.float32)])
    assert y.shape == (0, 8, 3, 3)


@pytest.mark.parametrize("batch", [0, 1, 5])
def test_conv_weight_gradient_sum_is_bitwise_the_batched_sum(batch: int) -> None:
    """The weight gradient accumulates per-sample products in batch order into one buffer:
    the same additions as summing the batched product over the batch."""
    from dpgraph.ops._conv_util import summed_matmul

    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 2, 3, 7)).astype(np.float32)
    b = rng.standard_normal((batch, 2, 7, 4)).astype(np.float32)
    np.testing.assert_array_equal(summed_matmul(np, a, b), np.matmul(a, b).sum(axis=0))


def test_conv_kernel_larger_than_input_fails_even_for_an_empty_batch() -> None:
    op = make_op("Conv", ["X", "W"], ["Y"], kernel=3)
    with pytest.raises(ShapeError, match="larger than the padded input"):
        run_op(op, [np.zeros((0, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32)])
