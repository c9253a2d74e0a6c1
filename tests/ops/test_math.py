"""Math ops: numpy references, Caffe2 broadcasting, gradient op structure and finite
differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ArgumentError, GradientError, ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(7)


def rand(*shape: int, dtype: type = np.float32, low: float = -1.0, high: float = 1.0
         ) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(dtype)


def distinct(*shape: int) -> np.ndarray:
    """float64 values in [-1, 1) that differ pairwise by >= 2/size and avoid 0 (no ties or
    kinks within finite-difference reach)."""
    size = int(np.prod(shape))
    values = (np.arange(size) + 0.5) * (2.0 / size) - 1.0
    return RNG.permutation(values).reshape(shape)


def grads_of(op, g_output=None):
    g_output = g_output or [o + "_grad" for o in op.output]
    return build_gradient(op, g_output)


# --- binary arithmetic -------------------------------------------------------------------
@pytest.mark.parametrize("op_type,fn", [("Add", np.add), ("Sub", np.subtract),
                                        ("Mul", np.multiply), ("Div", np.divide)])
def test_binary_same_shape(op_type: str, fn) -> None:
    a, b = rand(3, 4), rand(3, 4, low=0.5, high=2.0)
    (out,) = run_op(CreateOperator(op_type, ["A", "B"], ["C"]), [a, b])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, fn(a, b), rtol=1e-6)


@pytest.mark.parametrize("a_shape,b_shape,axis,padded", [
    ((2, 3, 4, 5), (4, 5), -1, (1, 1, 4, 5)),
    ((2, 3, 4, 5), (3, 4), 1, (1, 3, 4, 1)),
    ((2, 3, 4, 5), (2,), 0, (2, 1, 1, 1)),
    ((2, 3, 4, 5), (1, 4, 1), 1, (1, 1, 4, 1)),
    ((2, 3), (), -1, ()),
])
def test_legacy_broadcast(a_shape, b_shape, axis, padded) -> None:
    a, b = rand(*a_shape), rand(*b_shape)
    op = CreateOperator("Mul", ["A", "B"], ["C"], broadcast=1, axis=axis)
    (out,) = run_op(op, [a, b])
    assert out.shape == a_shape
    np.testing.assert_allclose(out, a * b.reshape(padded), rtol=1e-6)


def test_legacy_broadcast_axis_str() -> None:
    a, b = rand(2, 3, 4, 5), rand(3)
    op = CreateOperator("Add", ["A", "B"], ["C"], broadcast=1, axis_str="C", order="NCHW")
    np.testing.assert_allclose(run_op(op, [a, b])[0], a + b.reshape(1, 3, 1, 1), rtol=1e-6)


def test_legacy_broadcast_mismatch_raises() -> None:
    op = CreateOperator("Add", ["A", "B"], ["C"], broadcast=1)
    with pytest.raises(ShapeError, match="mismatch"):
        run_op(op, [rand(2, 3), rand(4)])
    with pytest.raises(ShapeError, match="rank"):
        run_op(op, [rand(3), rand(2, 3)])
    (scalar,) = run_op(op, [np.array(2.0, np.float32), np.array([3.0], np.float32)])
    assert scalar.shape == () and float(scalar) == 5.0


def test_numpy_broadcast_without_flag() -> None:
    a, b = rand(4, 1), rand(1, 3)
    (out,) = run_op(CreateOperator("Sub", ["A", "B"], ["C"]), [a, b])
    np.testing.assert_allclose(out, a - b, rtol=1e-6)


def test_integer_div_truncates_like_cpp() -> None:
    a = np.array([7, -7, 6, -6], dtype=np.int32)
    b = np.array([2, 2, -4, 4], dtype=np.int32)
    (out,) = run_op(CreateOperator("Div", ["A", "B"], ["C"]), [a, b])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [3, -3, -1, -1])


@pytest.mark.parametrize("op_type", ["Add", "Sub"])
def test_add_and_sub_gradients_are_real_ops(op_type: str) -> None:
    """The final Caffe2: AddGradient/SubGradient([dC, A, B]) -> [dA, dB], forward args copied."""
    ops, g_in = grads_of(CreateOperator(op_type, ["a", "b"], ["c"], broadcast=1, axis=1))
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (f"{op_type}Gradient", ["c_grad", "a", "b"], ["a_grad", "b_grad"])]
    assert g_in == ["a_grad", "b_grad"]
    assert arguments_dict(ops[0].arg) == {"broadcast": 1, "axis": 1}


def test_mul_gradient_structure() -> None:
    """The final Caffe2: MulGradient([dC, A, B]) -> [dA, dB], forward args copied."""
    ops, g_in = grads_of(CreateOperator("Mul", ["a", "b"], ["c"]))
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("MulGradient", ["c_grad", "a", "b"], ["a_grad", "b_grad"])]
    ops, _ = grads_of(CreateOperator("Mul", ["a", "b"], ["c"], broadcast=1, axis=0))
    assert arguments_dict(ops[0].arg) == {"broadcast": 1, "axis": 0}
    with pytest.raises(GradientError, match="in-place"):
        grads_of(CreateOperator("Mul", ["a", "b"], ["a"]))


def test_div_gradient_structure_and_legacy_form() -> None:
    """The final Caffe2: DivGradient([dC, A, B, C]) -> [dA, dB]; [B, C, dC] still runs."""
    ops, _ = grads_of(CreateOperator("Div", ["a", "b"], ["c"], broadcast=1, axis=0))
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("DivGradient", ["c_grad", "a", "b", "c"], ["a_grad", "b_grad"])]
    assert arguments_dict(ops[0].arg) == {"broadcast": 1, "axis": 0}
    with pytest.raises(GradientError, match="over B"):
        grads_of(CreateOperator("Div", ["a", "b"], ["b"]))
    b, c, dc = rand(4, low=1.0, high=2.0), rand(3, 4), rand(3, 4)
    da, db = run_op(CreateOperator("DivGradient", ["B", "C", "dC"], ["dA", "dB"]), [b, c, dc])
    np.testing.assert_allclose(da, dc / b, rtol=1e-6)
    np.testing.assert_allclose(db, (-dc * c / b).sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_binary_gradients_numeric(op_type: str) -> None:
    a, b = rand(3, 4, dtype=np.float64), rand(3, 4, dtype=np.float64, low=0.5, high=2.0)
    check_gradient(CreateOperator(op_type, ["A", "B"], ["C"]), [a, b])


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_broadcast_gradients_numeric(op_type: str) -> None:
    a, b = rand(2, 3, 4, dtype=np.float64), rand(3, dtype=np.float64, low=0.5, high=2.0)
    check_gradient(CreateOperator(op_type, ["A", "B"], ["C"], broadcast=1, axis=1), [a, b])


def test_sum_reduce_like() -> None:
    a = rand(2, 3, 4, 5)
    (out,) = run_op(CreateOperator("SumReduceLike", ["A", "B"], ["C"], axis=1),
                    [a, np.zeros((3, 4), np.float32)])
    np.testing.assert_allclose(out, a.sum(axis=(0, 3)), rtol=1e-5)
    (out,) = run_op(CreateOperator("SumReduceLike", ["A", "B"], ["C"]),
                    [a, np.zeros((), np.float32)])
    assert out.shape == () and np.isclose(out, a.sum(), rtol=1e-5)


@pytest.mark.parametrize("op_type,sign", [("AddGradient", 1), ("SubGradient", -1)])
def test_late_style_gradient_kernels(op_type: str, sign: int) -> None:
    dc, a, b = rand(4, 3), rand(4, 3), rand(3)
    da, db = run_op(CreateOperator(op_type, ["dC", "A", "B"], ["dA", "dB"]), [dc, a, b])
    np.testing.assert_allclose(da, dc, rtol=1e-6)
    np.testing.assert_allclose(db, sign * dc.sum(axis=0), rtol=1e-5)
    da, db = run_op(CreateOperator("MulGradient", ["dC", "A", "B"], ["dA", "dB"]), [dc, a, b])
    np.testing.assert_allclose(da, dc * b, rtol=1e-6)
    np.testing.assert_allclose(db, (dc * a).sum(axis=0), rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_legacy_broadcast_matches_numpy(a_shape: list[int], data) -> None:
    start = data.draw(st.integers(0, len(a_shape) - 1))
    stop = data.draw(st.integers(start, len(a_shape)))
    b_shape = a_shape[start:stop]
    local = np.random.default_rng(len(a_shape) * 10 + start)  # keeps the shared RNG stable
    a = local.standard_normal(a_shape).astype(np.float32)
    b = local.standard_normal(b_shape).astype(np.float32)
    op = CreateOperator("Add", ["A", "B"], ["C"], broadcast=1, axis=start)
    padded = [1] * start + b_shape + [1] * (len(a_shape) - stop)
    np.testing.assert_allclose(run_op(op, [a, b])[0], a + b.reshape(padded), rtol=1e-6)


# --- comparisons and logic ---------------------------------------------------------------
@pytest.mark.parametrize("op_type,fn", [("EQ", np.equal), ("NE", np.not_equal),
                                        ("LT", np.less), ("LE", np.less_equal),
                                        ("GT", np.greater), ("GE", np.greater_equal)])
def test_comparisons(op_type: str, fn) -> None:
    a = np.array([1, 2, 3, 4], np.int32)
    b = np.array([2, 2, 2, 2], np.int32)
    (out,) = run_op(CreateOperator(op_type, ["A", "B"], ["C"]), [a, b])
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, fn(a, b))


def test_logical_ops() -> None:
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    for op_type, fn in [("And", np.logical_and), ("Or", np.logical_or),
                        ("Xor", np.logical_xor)]:
        np.testing.assert_array_equal(
            run_op(CreateOperator(op_type, ["A", "B"], ["C"]), [a, b])[0], fn(a, b))
    np.testing.assert_array_equal(run_op(CreateOperator("Not", ["A"], ["C"]), [a])[0], ~a)


# --- unary -------------------------------------------------------------------------------
UNARY = [("Exp", np.exp, (-1, 1)), ("Log", np.log, (0.5, 2)), ("Sqrt", np.sqrt, (0.5, 2)),
         ("Abs", np.abs, (-1, 1)), ("Negative", np.negative, (-1, 1)),
         ("Sqr", np.square, (-1, 1)), ("Cos", np.cos, (-1, 1)), ("Sin", np.sin, (-1, 1)),
         ("Tan", np.tan, (-1, 1)), ("Acos", np.arccos, (-0.9, 0.9)),
         ("Asin", np.arcsin, (-0.9, 0.9)), ("Atan", np.arctan, (-1, 1)),
         ("Cosh", np.cosh, (-1, 1)), ("Sinh", np.sinh, (-1, 1)),
         ("Cube", lambda x: x ** 3, (-1, 1)), ("Rsqrt", lambda x: 1 / np.sqrt(x), (0.5, 2))]


@pytest.mark.parametrize("op_type,fn,bounds", UNARY)
def test_unary_forward_and_gradient(op_type: str, fn, bounds) -> None:
    x = rand(3, 4, low=bounds[0], high=bounds[1])
    (out,) = run_op(CreateOperator(op_type, ["X"], ["Y"]), [x])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, fn(x), rtol=1e-5, atol=1e-6)
    x64 = x.astype(np.float64)
    if op_type == "Abs":
        x64 = np.where(np.abs(x64) < 0.1, 0.5, x64)
    check_gradient(CreateOperator(op_type, ["X"], ["Y"]), [x64])


def test_sign_ceil_floor_erf() -> None:
    x = np.array([-1.5, -0.2, 0.0, 0.7, 2.0], np.float32)
    for op_type, expected in [("Sign", np.sign(x)), ("Ceil", np.ceil(x)),
                              ("Floor", np.floor(x))]:
        np.testing.assert_array_equal(run_op(CreateOperator(op_type, ["X"], ["Y"]), [x])[0],
                                      expected)
    (erf,) = run_op(CreateOperator("Erf", ["X"], ["Y"]), [x])
    np.testing.assert_allclose(erf, [-0.96610515, -0.22270259, 0.0, 0.67780119, 0.99532227],
                               rtol=1e-5)
    check_gradient(CreateOperator("Erf", ["X"], ["Y"]), [x.astype(np.float64)])


def test_sqr_gradient_is_inplace_scale_then_mul() -> None:
    ops, g_in = grads_of(CreateOperator("Sqr", ["x"], ["y"]))
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("Scale", ["y_grad"], ["y_grad"]), ("Mul", ["y_grad", "x"], ["x_grad"])]
    assert arguments_dict(ops[0].arg) == {"scale": 2.0}


def test_unary_gradient_op_inputs() -> None:
    expected = {"Exp": ("Mul", ["y", "y_grad"]), "Log": ("Div", ["y_grad", "x"]),
                "Cosh": ("CoshGradient", ["y_grad", "x"]),
                "Cube": ("CubeGradient", ["y_grad", "x"]),
                "Rsqrt": ("RsqrtGradient", ["y_grad", "y"]),
                "Tan": ("TanGradient", ["x", "y_grad"]), "Negative": ("Negative", ["y_grad"])}
    for op_type, (grad_type, inputs) in expected.items():
        ops, _ = grads_of(CreateOperator(op_type, ["x"], ["y"]))
        assert (ops[0].type, list(ops[0].input)) == (grad_type, inputs)


def test_scale_and_gradient() -> None:
    x = rand(2, 3)
    op = CreateOperator("Scale", ["X"], ["Y"], scale=-2.5)
    np.testing.assert_allclose(run_op(op, [x])[0], -2.5 * x, rtol=1e-6)
    ops, _ = grads_of(op)
    assert ops[0].type == "Scale" and arguments_dict(ops[0].arg) == {"scale": -2.5}
    check_gradient(op, [x.astype(np.float64)])


def test_pow_exponent_and_tensor() -> None:
    x = rand(2, 3, low=0.5, high=2.0)
    op = CreateOperator("Pow", ["X"], ["Y"], exponent=0.5)
    np.testing.assert_allclose(run_op(op, [x])[0], np.sqrt(x), rtol=1e-6)
    ops, _ = grads_of(op)
    assert [o.type for o in ops] == ["Pow", "Mul", "Scale"]
    assert arguments_dict(ops[0].arg) == {"exponent": -0.5}
    check_gradient(op, [x.astype(np.float64)])
    y = rand(2, 3, low=0.5, high=2.0)
    op2 = CreateOperator("Pow", ["X", "E"], ["Y"])
    np.testing.assert_allclose(run_op(op2, [x, y])[0], x ** y, rtol=1e-5)
    check_gradient(op2, [x.astype(np.float64), y.astype(np.float64)])


def test_pow_broadcast_gradient_numeric() -> None:
    x, e = rand(2, 3, 4, dtype=np.float64, low=0.5, high=2), rand(3, dtype=np.float64)
    check_gradient(CreateOperator("Pow", ["X", "E"], ["Z"], broadcast=1, axis=1), [x, e])


# --- N-ary -------------------------------------------------------------------------------
def test_sum_inplace_and_pass_through() -> None:
    xs = [rand(2, 3) for _ in range(3)]
    op = CreateOperator("Sum", ["X0", "X1", "X2"], ["X0"])
    buffers = [x.copy() for x in xs]
    (out,) = run_op(op, buffers)
    assert out is buffers[0]  # in place, as Caffe2's Sum
    np.testing.assert_array_equal(out, xs[0] + xs[1] + xs[2])
    (fresh,) = run_op(CreateOperator("Sum", ["X0", "X1", "X2"], ["Y"]), xs)
    np.testing.assert_array_equal(fresh, out)
    # an input aliasing X0 is read before X0 is overwritten
    aliased = xs[0].copy()
    (twice,) = run_op(CreateOperator("Sum", ["X0", "X1", "X2"], ["X0"]),
                      [aliased, xs[1], aliased])
    np.testing.assert_array_equal(twice, xs[0] + xs[1] + xs[0])
    ops, g_in = grads_of(CreateOperator("Sum", ["a", "b"], ["c"]))
    assert ops == [] and g_in == ["c_grad", "c_grad"]
    assert OPERATORS.lookup("Sum").allows_inplace(0, 0)


@pytest.mark.parametrize("op_type,fn", [("Max", np.maximum), ("Min", np.minimum)])
def test_max_min_and_gradients(op_type: str, fn) -> None:
    xs = list(distinct(3, 3, 4))
    op = CreateOperator(op_type, ["X", "Y", "Z"], ["m"])
    np.testing.assert_allclose(run_op(op, xs)[0], fn(fn(xs[0], xs[1]), xs[2]))
    ops, _ = grads_of(op)
    assert (ops[0].type, list(ops[0].input), list(ops[0].output)) == (
        op_type + "Gradient", ["m", "m_grad", "X", "Y", "Z"], ["X_grad", "Y_grad", "Z_grad"])
    check_gradient(op, xs)


def test_mean_and_gradient() -> None:
    xs = [rand(2, 2, dtype=np.float64) for _ in range(4)]
    op = CreateOperator("Mean", ["a", "b", "c", "d"], ["m"])
    np.testing.assert_allclose(run_op(op, xs)[0], np.mean(xs, axis=0))
    check_gradient(op, xs)


# --- Clip, SquareRootDivide, Where, IsMemberOf, NegateGradient ---------------------------
def test_clip_and_gradient() -> None:
    x = np.array([-2.0, -0.5, 0.25, 0.75, 3.0], np.float64)
    op = CreateOperator("Clip", ["X"], ["Y"], min=-1.0, max=0.5)
    np.testing.assert_allclose(run_op(op, [x])[0], np.clip(x, -1.0, 0.5))
    check_gradient(op, [x])
    (half,) = run_op(CreateOperator("Clip", ["X"], ["Y"], min=0.0), [x])
    np.testing.assert_allclose(half, np.maximum(x, 0))


def test_square_root_divide() -> None:
    data, factor = rand(3, 2, dtype=np.float64), np.array([4.0, 0.0, 9.0])
    op = CreateOperator("SquareRootDivide", ["D", "S"], ["Y"])
    expected = data / np.sqrt([[4.0], [1.0], [9.0]])
    np.testing.assert_allclose(run_op(op, [data, factor])[0], expected)
    check_gradient(op, [data, factor], inputs_to_check=[0])


def test_negate_gradient() -> None:
    x = rand(3, dtype=np.float64)
    op = CreateOperator("NegateGradient", ["X"], ["Y"])
    np.testing.assert_allclose(run_op(op, [x])[0], x)
    ops, _ = grads_of(op)
    state = run_ops(ops, {"Y_grad": np.ones(3)})
    np.testing.assert_allclose(state["X_grad"], -np.ones(3))


def test_where_and_is_member_of() -> None:
    c = np.array([True, False, True])
    x, y = rand(3), rand(3)
    np.testing.assert_allclose(run_op(CreateOperator("Where", ["C", "X", "Y"], ["Z"]),
                                      [c, x, y])[0], np.where(c, x, y))
    rows = run_op(CreateOperator("Where", ["C", "X", "Y"], ["Z"], broadcast_on_rows=1),
                  [c, rand(3, 2), np.zeros((3, 2), np.float32)])[0]
    assert np.all(rows[1] == 0) and rows.shape == (3, 2)
    member = run_op(CreateOperator("IsMemberOf", ["X"], ["Y"], value=[1, 5]),
                    [np.array([1, 2, 5], np.int64)])[0]
    np.testing.assert_array_equal(member, [True, False, True])


# --- reductions --------------------------------------------------------------------------
def test_sum_elements_variants() -> None:
    x = rand(3, 4, dtype=np.float64)
    (out,) = run_op(CreateOperator("SumElements", ["X"], ["y"]), [x])
    assert out.shape == () and np.isclose(out, x.sum())
    (avg,) = run_op(CreateOperator("SumElements", ["X"], ["y"], average=1), [x])
    assert np.isclose(avg, x.mean())
    check_gradient(CreateOperator("SumElements", ["X"], ["y"], average=1), [x])
    (sq,) = run_op(CreateOperator("SumSqrElements", ["X"], ["y"]), [x])
    assert sq.shape == () and np.isclose(sq, (x * x).sum())
    (ints,) = run_op(CreateOperator("SumElementsInt", ["X"], ["y"]),
                     [np.arange(5, dtype=np.int32)])
    assert ints.dtype == np.int32 and ints.shape == () and int(ints) == 10


@pytest.mark.parametrize("kind,fn", [("Sum", np.sum), ("Mean", np.mean), ("Max", np.max)])
@pytest.mark.parametrize("front", [True, False])
def test_reduce_front_back(kind: str, fn, front: bool) -> None:
    x = distinct(2, 3, 4)
    op_type = f"Reduce{'Front' if front else 'Back'}{kind}"
    op = CreateOperator(op_type, ["X"], ["Y"], num_reduce_dim=2)
    axes = (0, 1) if front else (1, 2)
    np.testing.assert_allclose(run_op(op, [x])[0], fn(x, axis=axes))
    check_gradient(op, [x])


@pytest.mark.parametrize("kind", ["Sum", "Mean", "Max", "Min", "L1", "L2"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes(kind: str, keepdims: int) -> None:
    x = distinct(2, 3, 4)
    op = CreateOperator("Reduce" + kind, ["X"], ["Y"], axes=[0, 2], keepdims=keepdims)
    ref = {"Sum": np.sum, "Mean": np.mean, "Max": np.max, "Min": np.min,
           "L2": lambda v, axis, keepdims: np.sqrt(np.sum(v * v, axis=axis, keepdims=keepdims)),
           "L1": lambda v, axis, keepdims: np.sum(np.abs(v), axis=axis, keepdims=keepdims),
           }[kind]
    np.testing.assert_allclose(run_op(op, [x])[0], ref(x, axis=(0, 2), keepdims=bool(keepdims)))
    check_gradient(op, [x])


@pytest.mark.parametrize("op_type,axis", [("RowwiseMax", 2), ("ColwiseMax", 1)])
def test_rowwise_colwise_max(op_type: str, axis: int) -> None:
    x = distinct(2, 3, 4)
    op = CreateOperator(op_type, ["x"], ["y"])
    np.testing.assert_allclose(run_op(op, [x])[0], x.max(axis=axis))
    check_gradient(op, [x])


def test_bad_arguments_raise_typed_errors() -> None:
    with pytest.raises(ArgumentError, match="exponent"):
        run_op(CreateOperator("Pow", ["X"], ["Y"]), [rand(2)])
    with pytest.raises(ShapeError):
        run_op(CreateOperator("ReduceFrontSum", ["X"], ["Y"], num_reduce_dim=3), [rand(2)])


def test_shape_functions() -> None:
    infer = OPERATORS.lookup("Add").shape_fn
    op = CreateOperator("Add", ["A", "B"], ["C"])
    assert infer(op, [(4, 1), (1, 3)], [1, 1]) == [((4, 3), 1)]
    assert OPERATORS.lookup("EQ").shape_fn(op, [(2,), (2,)], [1, 1]) == [((2,), 5)]
    assert OPERATORS.lookup("SumElements").shape_fn(op, [(2, 2)], [1]) == [((), 1)]


def test_clip_tensor_by_scaling() -> None:
    x = rand(3, 2)
    op = CreateOperator("ClipTensorByScaling", ["X", "v"], ["Y"], threshold=0.5)
    np.testing.assert_allclose(run_op(op, [x, np.array(2.0, np.float32)])[0], x * 0.25,
                               rtol=1e-6)
    np.testing.assert_array_equal(run_op(op, [x, np.array(0.1, np.float32)])[0], x)


@pytest.mark.parametrize("op_type,fn", [("ArgMax", np.argmax), ("ArgMin", np.argmin)])
def test_arg_max_min(op_type: str, fn) -> None:
    x = rand(3, 4, 5)
    (out,) = run_op(CreateOperator(op_type, ["X"], ["I"], axis=1), [x])
    assert out.dtype == np.int64 and out.shape == (3, 1, 5)
    np.testing.assert_array_equal(out[:, 0], fn(x, axis=1))
    (flat,) = run_op(CreateOperator(op_type, ["X"], ["I"], keepdims=0), [x])
    np.testing.assert_array_equal(flat, fn(x, axis=-1))


@pytest.mark.parametrize("kind", ["Sum", "Mean", "Max"])
@pytest.mark.parametrize("front", [True, False])
def test_reduce_front_back_with_lengths(kind: str, front: bool) -> None:
    x = RNG.standard_normal((4, 3, 2))
    lengths = np.array([1, 4, 2, 3, 4, 2] if front else [1, 6, 3, 2], dtype=np.int32)
    op_type = f"Reduce{'Front' if front else 'Back'}{kind}"
    op = CreateOperator(op_type, ["X", "L"], ["Y"], num_reduce_dim=1 if front else 2)
    (y,) = run_op(op, [x, lengths])
    x2 = x.reshape(4, 6)
    reduce = {"Sum": np.sum, "Mean": np.mean, "Max": np.max}[kind]
    expected = [reduce(x2[:n, j]) for j, n in enumerate(lengths)] if front else \
        [reduce(x2[i, :n]) for i, n in enumerate(lengths)]
    assert y.shape == ((3, 2) if front else (4,))
    np.testing.assert_allclose(y.reshape(-1), expected)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert list(ops[0].input)[-1] == "L" and ops[0].type == op_type + "Gradient"
    if kind != "Max":
        check_gradient(op, [x, lengths], inputs_to_check=[0])
        (by_shape,) = run_op(CreateOperator(op_type + "Gradient", ["dY", "S", "L"], ["dX"],
                                            num_reduce_dim=1 if front else 2),
                             [np.ones_like(y), np.array(x.shape, np.int64), lengths])
        (by_x,) = run_op(ops[0], [np.ones_like(y), x, lengths])
        np.testing.assert_array_equal(by_shape, by_x)


def test_scale_blobs_scales_every_input_and_its_gradient() -> None:
    a, b = rand(2, 3, dtype=np.float64), rand(4, dtype=np.float64)
    op = CreateOperator("ScaleBlobs", ["A", "B"], ["A2", "B2"], scale=2.5)
    ya, yb = run_op(op, [a, b])
    np.testing.assert_allclose(ya, 2.5 * a)
    np.testing.assert_allclose(yb, 2.5 * b)
    check_gradient(op, [a, b], outputs_with_grads=(0, 1))
