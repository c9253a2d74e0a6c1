"""Activation ops: numpy references, gradient op structure and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ArgumentError, GradientError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(11)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805


def away_from_zero(*shape: int, margin: float = 0.1) -> np.ndarray:
    x = RNG.uniform(-2, 2, size=shape)
    return np.where(np.abs(x) < margin, margin * 3, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


CASES = [
    ("Relu", {}, lambda x: np.maximum(x, 0)),
    ("ReluN", {"n": 1.0}, lambda x: np.clip(x, 0, 1.0)),
    ("LeakyRelu", {"alpha": 0.2}, lambda x: np.where(x >= 0, x, 0.2 * x)),
    ("Elu", {"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    ("Selu", {}, lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * (np.exp(x) - 1))),
    ("ThresholdedRelu", {"alpha": 0.5}, lambda x: np.where(x > 0.5, x, 0)),
    ("Sigmoid", {}, sigmoid),
    ("Tanh", {}, np.tanh),
    ("Softplus", {}, lambda x: np.log1p(np.exp(x))),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
]


@pytest.mark.parametrize("op_type,args,fn", CASES)
def test_forward_matches_numpy(op_type: str, args: dict, fn) -> None:
    x = away_from_zero(3, 5).astype(np.float32)
    (y,) = run_op(CreateOperator(op_type, ["X"], ["Y"], **args), [x])
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, fn(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_type,args,fn", CASES)
def test_gradient_structure_and_numeric(op_type: str, args: dict, fn) -> None:
    op = CreateOperator(op_type, ["X"], ["Y"], **args)
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (op_type + "Gradient", ["Y", "Y_grad"], ["X_grad"])]
    assert arguments_dict(ops[0].arg) == pytest.approx({k: float(v) for k, v in args.items()})
    x = away_from_zero(3, 4)
    if op_type == "HardSigmoid":  # keep away from the kinks at x = -4/3 and x = 2
        x = np.where(np.abs(x + 4 / 3) < 0.1, 0.0, np.where(np.abs(x - 2) < 0.1, 1.0, x))
    if op_type in ("ReluN", "ThresholdedRelu"):  # keep away from the kinks at n / alpha
        x = np.where(np.abs(np.abs(x) - 1.0) < 0.1, 0.3, x)
        x = np.where(np.abs(x - 0.5) < 0.1, 0.3, x)
    check_gradient(op, [x])


def test_relu_inplace_allowed() -> None:
    assert OPERATORS.lookup("Relu").allows_inplace(0, 0)
    x = np.array([-1.0, 2.0], np.float32)
    state = run_ops([CreateOperator("Relu", ["X"], ["X"])], {"X": x})
    np.testing.assert_array_equal(state["X"], [0.0, 2.0])


def test_relu_and_gradient_run_in_place_as_caffe2() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    buffer = x.copy()
    (y,) = run_op(CreateOperator("Relu", ["x"], ["x"]), [buffer])
    assert y is buffer
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    dy = rng.standard_normal((4, 6)).astype(np.float32)
    dy_buffer = dy.copy()
    (dx,) = run_op(CreateOperator("ReluGradient", ["y", "dy"], ["dy"]), [y, dy_buffer])
    assert dx is dy_buffer
    np.testing.assert_array_equal(dx, dy * (y > 0))
    (fresh,) = run_op(CreateOperator("ReluGradient", ["y", "dy"], ["dx"]), [y, dy])
    np.testing.assert_array_equal(fresh, dx)
    (half,) = run_op(CreateOperator("Relu", ["x"], ["x"]), [x.astype(np.float16)])
    assert half.dtype == np.float16


def test_relu_means_like_brew_test() -> None:
    (pos,) = run_op(CreateOperator("Relu", ["X"], ["Y"]), [np.full((4, 4), 0.5, np.float32)])
    (neg,) = run_op(CreateOperator("Relu", ["X"], ["Y"]), [np.full((4, 4), -0.5, np.float32)])
    assert pos.mean() == pytest.approx(0.5) and neg.mean() == 0
    (t,) = run_op(CreateOperator("Tanh", ["X"], ["Y"]), [np.full((2, 3), 0.5, np.float32)])
    assert t.mean() == pytest.approx(np.tanh(0.5), abs=1e-5)


def test_sigmoid_large_inputs_are_finite() -> None:
    (y,) = run_op(CreateOperator("Sigmoid", ["X"], ["Y"]),
                  [np.array([-1000.0, 0.0, 1000.0], np.float32)])
    np.testing.assert_allclose(y, [0.0, 0.5, 1.0])


def test_swish_and_gradient() -> None:
    x = away_from_zero(3, 4)
    op = CreateOperator("Swish", ["X"], ["Y"])
    np.testing.assert_allclose(run_op(op, [x])[0], x * sigmoid(x), rtol=1e-6)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert list(ops[0].input) == ["X", "Y", "Y_grad"]
    check_gradient(op, [x])


def test_glu() -> None:
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    (y,) = run_op(CreateOperator("Glu", ["X"], ["Y"], dim=1), [x])
    np.testing.assert_allclose(y, x[:, :2] * sigmoid(x[:, 2:]), rtol=1e-5)


@pytest.mark.parametrize("order,channels", [("NCHW", 3), ("NHWC", 3), ("NCHW", 1)])
def test_prelu(order: str, channels: int) -> None:
    x = away_from_zero(2, 3, 2, 3)
    slope = RNG.uniform(0.1, 0.5, size=channels)
    op = CreateOperator("PRelu", ["X", "S"], ["Y"], order=order)
    shape = (1, -1, 1, 1) if order == "NCHW" else (-1,)
    view = slope.reshape(shape) if channels > 1 else slope
    np.testing.assert_allclose(run_op(op, [x, slope])[0], np.where(x > 0, x, x * view))
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert list(ops[0].input) == ["Y", "Y_grad", "X", "S"] and g_in == ["X_grad", "S_grad"]
    check_gradient(op, [x, slope])


@pytest.mark.parametrize("shape,axis", [((4, 5), 1), ((2, 3, 4), 1), ((2, 3, 4), 2),
                                        ((0, 4), 1)])
def test_softmax_and_gradient(shape: tuple, axis: int) -> None:
    x = RNG.standard_normal(shape)
    op = CreateOperator("Softmax", ["X"], ["Y"], axis=axis)
    (y,) = run_op(op, [x])
    assert y.shape == shape
    if not x.size:
        return
    rows = x.reshape(int(np.prod(shape[:axis])), -1)
    ref = np.exp(rows - rows.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, (ref / ref.sum(axis=1, keepdims=True)).reshape(shape),
                               rtol=1e-6)
    check_gradient(op, [x])


def test_dropout_is_test_identity_and_grad() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    op = CreateOperator("Dropout", ["X"], ["Y", "mask"], ratio=0.5, is_test=1)
    y, mask = run_op(op, [x])
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_
    ops, _ = build_gradient(op, ["Y_grad", None])
    assert (ops[0].type, list(ops[0].input)) == ("DropoutGrad", ["Y_grad"])


def test_dropout_training_scales_and_masks() -> None:
    x = np.full((200, 200), 0.8, np.float32)
    op = CreateOperator("Dropout", ["X"], ["Y", "mask"], ratio=0.5)
    y, mask = run_op(op, [x], seed=3)
    assert mask.dtype == np.bool_ and 0.45 < mask.mean() < 0.55
    np.testing.assert_allclose(y[mask], 1.6, rtol=1e-6)
    assert np.all(y[~mask] == 0)
    assert abs(y.mean() - 0.8) < 0.05
    ops, _ = build_gradient(op, ["Y_grad", None])
    assert list(ops[0].input) == ["Y_grad", "mask"]
    state = run_ops(ops, {"Y_grad": np.ones_like(x), "mask": mask})
    np.testing.assert_allclose(state["X_grad"], mask * 2.0)


def test_dropout_training_gradient_needs_mask() -> None:
    with pytest.raises(GradientError, match="mask"):
        build_gradient(CreateOperator("Dropout", ["X"], ["Y"], ratio=0.5), ["Y_grad"])


def test_log_softmax_matches_reference_and_gradient() -> None:
    from dpgraph.ops.gradient_builder import make_op

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    op = make_op("LogSoftmax", ["x"], ["y"], axis=1)
    (y,) = run_op(op, [x])
    rows = x.reshape(3, 8).astype(np.float64)
    expected = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(y, expected.reshape(x.shape), rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32
    check_gradient(op, [x])


def test_dropout_ratio_one_drops_everything() -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    op = CreateOperator("Dropout", ["X"], ["Y", "mask"], ratio=1.0)
    y, mask = run_op(op, [x])
    np.testing.assert_array_equal(y, np.zeros_like(x))
    assert mask.dtype == bool and not mask.any()
    (dx,) = run_op(CreateOperator("DropoutGrad", ["dY", "mask"], ["dX"], ratio=1.0),
                   [np.ones_like(x), mask])
    np.testing.assert_array_equal(dx, np.zeros_like(x))
    with pytest.raises(ArgumentError, match=r"\[0, 1\]"):
        run_op(CreateOperator("Dropout", ["X"], ["Y"], ratio=1.5), [x])
