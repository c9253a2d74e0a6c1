"""Fill ops: shapes, dtypes, values and the statistics of the random fills."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ArgumentError, ShapeError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import run_op
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


def fill(op_type: str, inputs=(), seed: int = 0, **kwargs) -> np.ndarray:
    names = [f"in{i}" for i in range(len(inputs))]
    return run_op(CreateOperator(op_type, names, ["out"], **kwargs), list(inputs), seed)[0]


def test_constant_fill_default_and_dtypes() -> None:
    out = fill("ConstantFill", shape=[2, 3], value=1.5)
    assert out.dtype == np.float32 and out.shape == (2, 3) and np.all(out == 1.5)
    out = fill("ConstantFill", shape=[1], value=0, dtype=DT.INT64)
    assert out.dtype == np.int64 and out.tolist() == [0]
    assert fill("ConstantFill", shape=[2], value=3, dtype=DT.INT32).dtype == np.int32
    assert fill("ConstantFill", shape=[2], value=1, dtype=DT.BOOL).tolist() == [True, True]
    assert fill("ConstantFill", shape=[1], value=7).dtype == np.int64  # inferred from value
    assert fill("ConstantFill", shape=[1]).dtype == np.float32
    scalar = fill("ConstantFill", shape=[], value=2.0)
    assert scalar.shape == () and float(scalar) == 2.0


def test_constant_fill_from_input() -> None:
    x = np.zeros((2, 3), np.float32)
    out = fill("ConstantFill", [x], value=1.0)
    assert out.shape == (2, 3) and np.all(out == 1)
    assert fill("ConstantFill", [x], value=1.0, extra_shape=[4]).shape == (2, 3, 4)
    shape = np.array([4, 5], np.int64)
    assert fill("ConstantFill", [shape], value=0.0, input_as_shape=1).shape == (4, 5)
    with pytest.raises(ArgumentError):
        fill("ConstantFill", [x], shape=[2])
    with pytest.raises(ArgumentError):
        fill("ConstantFill", extra_shape=[2])


def test_uniform_and_int_fill() -> None:
    out = fill("UniformFill", shape=[1000], min=-2.0, max=3.0)
    assert out.dtype == np.float32 and out.min() >= -2 and out.max() <= 3
    assert abs(out.mean() - 0.5) < 0.2
    default = fill("UniformFill", shape=[100])
    assert default.min() >= 0 and default.max() <= 1
    ints = fill("UniformIntFill", shape=[1000], min=1, max=3)
    assert ints.dtype == np.int32 and set(np.unique(ints)) == {1, 2, 3}
    bounded = fill("UniformFill", [np.array([5], np.int64), np.array(2.0, np.float32),
                                   np.array(2.5, np.float32)], input_as_shape=1)
    assert bounded.shape == (5,) and bounded.min() >= 2.0 and bounded.max() <= 2.5


def test_random_fills_are_seeded() -> None:
    a = fill("GaussianFill", shape=[10], seed=1)
    b = fill("GaussianFill", shape=[10], seed=1)
    np.testing.assert_array_equal(a, b)
    op = CreateOperator("UniformFill", [], ["out"], shape=[4], random_seed=3)
    np.testing.assert_array_equal(run_op(op, [], seed=1)[0], run_op(op, [], seed=2)[0])


def test_gaussian_fill_statistics() -> None:
    out = fill("GaussianFill", shape=[20000], mean=1.0, std=2.0)
    assert out.dtype == np.float32
    assert abs(out.mean() - 1.0) < 0.1 and abs(out.std() - 2.0) < 0.1


def test_xavier_fill_bounds() -> None:
    out = fill("XavierFill", shape=[64, 48])
    scale = np.sqrt(3.0 / 48)
    assert out.dtype == np.float32 and np.abs(out).max() <= scale
    assert np.abs(out).max() > 0.9 * scale


def test_msra_fill_std() -> None:
    out = fill("MSRAFill", shape=[200, 50, 3, 3])
    assert abs(out.std() - np.sqrt(2.0 / (200 * 9))) < 0.002
    assert abs(out.mean()) < 0.002


@pytest.mark.parametrize("op_type,values,dtype", [
    ("GivenTensorFill", [1.0, 2.0, 3.0, 4.0], np.float32),
    ("GivenTensorDoubleFill", [1.0, 2.0, 3.0, 4.0], np.float64),
    ("GivenTensorIntFill", [1, 2, 3, 4], np.int32),
    ("GivenTensorInt64Fill", [1, 2, 3, 4], np.int64),
    ("GivenTensorBoolFill", [1, 0, 1, 0], np.bool_),
])
def test_given_tensor_fills(op_type: str, values: list, dtype) -> None:
    out = fill(op_type, shape=[2, 2], values=values)
    assert out.dtype == dtype and out.shape == (2, 2)
    np.testing.assert_array_equal(out.reshape(-1), np.asarray(values, dtype=dtype))


def test_given_tensor_string_fill_and_size_check() -> None:
    out = fill("GivenTensorStringFill", shape=[2], values=["a", "bc"])
    assert out.tolist() == [b"a", b"bc"]
    with pytest.raises(ArgumentError, match="values"):
        fill("GivenTensorFill", shape=[3], values=[1.0, 2.0])


def test_range_lengths_range_diagonal() -> None:
    np.testing.assert_array_equal(fill("RangeFill", shape=[2, 3]), np.arange(6).reshape(2, 3))
    lengths = np.array([2, 0, 3], np.int32)
    out = fill("LengthsRangeFill", [lengths])
    assert out.dtype == np.int32 and out.tolist() == [0, 1, 0, 1, 2]
    assert fill("LengthsRangeFill", [np.zeros(0, np.int32)]).shape == (0,)
    np.testing.assert_array_equal(fill("DiagonalFill", shape=[3, 3], value=2.5),
                                  np.eye(3) * 2.5)
    cube = fill("DiagonalFill", shape=[2, 2, 2], value=1.0)
    assert cube[0, 0, 0] == cube[1, 1, 1] == 1 and cube.sum() == 2
    assert fill("DiagonalFill", shape=[2, 3], value=1.0, dtype=DT.INT32).dtype == np.int32


def test_fill_shape_functions_and_empty_gradient() -> None:
    op = CreateOperator("ConstantFill", [], ["out"], shape=[2, 3], dtype=DT.INT64)
    assert OPERATORS.lookup("ConstantFill").shape_fn(op, [], []) == [((2, 3), DT.INT64)]
    op2 = CreateOperator("XavierFill", ["x"], ["out"], extra_shape=[4])
    assert OPERATORS.lookup("XavierFill").shape_fn(op2, [(2,)], [1]) == [((2, 4), DT.FLOAT)]
    ops, g_in = build_gradient(op2, ["out_grad"])  # Caffe2's NO_GRADIENT
    assert ops == [] and g_in == [None]


def test_constant_fill_value_from_a_second_input() -> None:
    x = np.zeros((2, 3), np.float32)
    (y,) = run_op(CreateOperator("ConstantFill", ["X", "V"], ["Y"]), [x, np.array([7], np.int32)])
    assert y.shape == (2, 3) and y.dtype == np.int32 and (y == 7).all()
    (z,) = run_op(CreateOperator("ConstantFill", ["X", "V"], ["Y"], dtype=1),
                  [x, np.array([True])])
    assert z.dtype == np.float32 and (z == 1.0).all()
    with pytest.raises(ShapeError, match="exactly one element"):
        run_op(CreateOperator("ConstantFill", ["X", "V"], ["Y"]), [x, np.zeros(2)])


def test_fill_shape_argument_must_be_a_list_and_inverted_input_bounds_fill_nothing() -> None:
    with pytest.raises(ArgumentError, match="must be a list"):
        run_op(CreateOperator("GaussianFill", [], ["Y"], shape=32), [])
    shape, low, high = np.array([3, 2], np.int64), np.array(5, np.int32), np.array(1, np.int32)
    for op_type in ("UniformIntFill", "UniformFill"):
        (y,) = run_op(CreateOperator(op_type, ["S", "A", "B"], ["Y"], input_as_shape=1),
                      [shape, low, high])
        assert y.shape == (0, 2)


def test_float16_uniform_fill() -> None:
    (y,) = run_op(CreateOperator("Float16UniformFill", [], ["Y"], shape=[50, 4], min=-2.0,
                                 max=3.0), [])
    assert y.dtype == np.float16 and y.shape == (50, 4)
    assert y.min() >= -2.0 and y.max() <= 3.0 and y.std() > 0.5
