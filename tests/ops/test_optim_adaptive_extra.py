"""RowWiseCounter with a [rows, 1] prev_iter (Caffe2's rowwise_counter_test feeds one) and
WeightScale (Caffe2's weight_scale_test semantics), on CPU and a virtual GPU."""

from __future__ import annotations

import numpy as np
import pytest
from _optim_util import DEVICES, two_virtual_gpus  # noqa: F401  (autouse fixture)

from dpgraph import core, workspace
from dpgraph.errors import OperatorError


@pytest.mark.parametrize("prev_shape", [(6,), (6, 1)])
def test_row_wise_counter_accepts_a_column_of_prev_iters(prev_shape):
    prev = np.array([0, 90, 3, 99, 50, 7], np.int64).reshape(prev_shape)
    counter = np.arange(6, dtype=np.float64)
    for name, value in (("prev", prev), ("counter", counter),
                        ("idx", np.array([1, 3, 4], np.int64)),
                        ("iter", np.array([100], np.int64))):
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(
        "RowWiseCounter", ["prev", "counter", "idx", "iter"], ["prev", "counter"],
        counter_halflife=10))
    new_prev, new_counter = workspace.FetchBlob("prev"), workspace.FetchBlob("counter")
    assert new_prev.shape == prev_shape
    np.testing.assert_array_equal(new_prev.reshape(-1), [0, 100, 3, 100, 100, 7])
    expected = counter.copy()
    for row, delta in ((1, 10), (3, 1), (4, 50)):
        expected[row] = 1 + 2.0 ** (-delta / 10) * counter[row]
    np.testing.assert_allclose(new_counter, expected, rtol=1e-12)


def test_row_wise_counter_refuses_mismatched_sizes():
    for name, value in (("prev", np.zeros(4, np.int64)), ("counter", np.zeros(5)),
                        ("idx", np.array([1], np.int64)), ("iter", np.array([1], np.int64))):
        workspace.FeedBlob(name, value)
    with pytest.raises(OperatorError, match="one entry per row"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "RowWiseCounter", ["prev", "counter", "idx", "iter"], ["prev", "counter"]))


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
@pytest.mark.parametrize("iteration,scaled", [(19, True), (18, False), (39, True), (59, False)])
def test_weight_scale_scales_on_step_multiples_below_the_bound(device, iteration, scaled):
    w = np.random.RandomState(0).randn(3, 2).astype(np.float32)
    workspace.FeedBlob("w", w, device)
    workspace.FeedBlob("iter", np.array([iteration], np.int64))
    workspace.RunOperatorOnce(core.CreateOperator(
        "WeightScale", ["w", "iter"], ["nw"], stepsize=20, upper_bound_iter=60, scale=0.5,
        device_option=device))
    # t = iter + 1: 20 and 40 scale; 19 is no multiple; 60 reaches the bound
    np.testing.assert_allclose(workspace.FetchBlob("nw"), w * 0.5 if scaled else w)
    assert workspace.FetchBlob("nw").dtype == np.float32


def test_weight_scale_defaults_leave_weights_alone():
    workspace.FeedBlob("w", np.ones(3, np.float32))
    workspace.FeedBlob("iter", np.array([5], np.int64))
    workspace.RunOperatorOnce(core.CreateOperator("WeightScale", ["w", "iter"], ["w"]))
    np.testing.assert_array_equal(workspace.FetchBlob("w"), np.ones(3))
