"""UniqueUniformFill: distinct values in [min, max] avoiding the given ones."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import run_op
from dpgraph.proto.caffe2_pb2 import TensorProto


@pytest.mark.parametrize("high", [60, 10 ** 12])  # candidate list and rejection sampling
@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
def test_unique_values_avoid_and_shape(high: int, dtype: int) -> None:
    if dtype == TensorProto.INT32 and high > 2 ** 31:
        high = 2 ** 31 - 1
    avoid = np.arange(1, 21, dtype=np.int64)
    op = CreateOperator("UniqueUniformFill", ["X", "AVOID"], ["Y"], min=1, max=high,
                        input_as_shape=1, dtype=dtype)
    (y,) = run_op(op, [np.array([5, 8], np.int64), avoid])
    assert y.shape == (5, 8)
    assert y.dtype == (np.int32 if dtype == TensorProto.INT32 else np.int64)
    flat = y.reshape(-1).tolist()
    assert len(set(flat)) == 40 and not set(flat) & set(avoid.tolist())
    assert min(flat) >= 1 and max(flat) <= high


def test_unique_uniform_fill_exhausts_small_range_and_checks_args() -> None:
    op = CreateOperator("UniqueUniformFill", [], ["Y"], shape=[5], min=0, max=4)
    (y,) = run_op(op, [])
    assert sorted(y.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(Exception, match="cannot draw"):
        run_op(CreateOperator("UniqueUniformFill", [], ["Y"], shape=[6], min=0, max=4), [])
    with pytest.raises(Exception, match="bigger than min"):
        run_op(CreateOperator("UniqueUniformFill", [], ["Y"], shape=[1], min=3, max=3), [])
    with pytest.raises(Exception, match="'min' and 'max'"):
        run_op(CreateOperator("UniqueUniformFill", [], ["Y"], shape=[1], max=3), [])
    with pytest.raises(Exception, match="INT32 or INT64"):
        run_op(CreateOperator("UniqueUniformFill", [], ["Y"], shape=[1], min=0, max=3,
                              dtype=TensorProto.FLOAT), [])


def test_byte_string_to_uint8_fill_keeps_every_byte() -> None:
    data = np.array([0, 127, 128, 200, 255], np.uint8)
    op = CreateOperator("GivenTensorByteStringToUInt8Fill", [], ["Y"], shape=[5],
                        values=[data.tobytes()])
    (y,) = run_op(op, [])
    assert y.dtype == np.uint8 and y.tolist() == data.tolist()
