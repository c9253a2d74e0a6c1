"""SmartDecaySparseAdam against a step-by-step numpy replay of the steps a row missed, on
CPU and a virtual GPU, and AdamOptimizer(use_smart_decay=True) wiring."""

from __future__ import annotations

import numpy as np
import pytest
from _optim_util import DEVICES, two_virtual_gpus  # noqa: F401  (autouse fixture)

from dpgraph import core, model_helper, optimizer, workspace
from dpgraph.errors import ModelConfigError
from dpgraph.proto import caffe2_pb2

BETA1, BETA2, EPS, LR = 0.5, 0.9, 0.1, 0.05


def _replay_row(w, m, v, seen, g, t):
    """One row, the missed steps replayed one by one (k = t - seen)."""
    k = t - seen
    v = BETA2 ** k * v + (1 - BETA2) * g * g
    for i in range(k):
        m = m * BETA1 + (g * (1 - BETA1) if i == k - 1 else 0.0)
        w = w + LR * m / (np.sqrt(v) + EPS)
    return w, m, v, t


@pytest.mark.parametrize("device", DEVICES, ids=["cpu", "gpu"])
def test_smart_decay_sparse_adam_replays_missed_steps(device):
    rng = np.random.RandomState(3)
    w, m = rng.randn(5, 3).astype(np.float32), rng.randn(5, 3).astype(np.float32)
    v = np.abs(rng.randn(5, 3)).astype(np.float32)
    seen = np.array([0, 3, 6, 2, 6], np.int64)
    indices = np.array([4, 0, 2], np.int64)
    g = rng.randn(3, 3).astype(np.float32)
    iteration = np.array([6], np.int64)  # t = 7: rows missed 1, 7 and 1 steps
    names = ["w", "m", "v", "seen", "idx", "g", "lr", "iter"]
    values = [w, m, v, seen, indices, g, np.array([LR], np.float32), iteration]
    for name, value in zip(names, values):
        workspace.FeedBlob(name, value, device if name != "iter" else None)
    workspace.RunOperatorOnce(core.CreateOperator(
        "SmartDecaySparseAdam", names, names[:4], beta1=BETA1, beta2=BETA2, epsilon=EPS,
        device_option=device))
    expected = [x.astype(np.float64) for x in (w, m, v)] + [seen.copy()]
    for i, row in enumerate(indices):
        out = _replay_row(w[row].astype(np.float64), m[row].astype(np.float64),
                          v[row].astype(np.float64), int(seen[row]), g[i].astype(np.float64), 7)
        for target, value in zip(expected, out):
            target[row] = value
    for name, ref in zip(names[:4], expected):
        np.testing.assert_allclose(workspace.FetchBlob(name), ref, rtol=1e-5, atol=1e-6)
    assert workspace.FetchBlob("seen").dtype == np.int64


def test_repeated_index_only_adds_to_the_second_moment():
    w = np.ones((2, 2), np.float32)
    names = ["w", "m", "v", "seen", "idx", "g", "lr", "iter"]
    values = [w, np.zeros_like(w), np.zeros_like(w), np.zeros(2, np.int64),
              np.array([1, 1], np.int64), np.ones((2, 2), np.float32),
              np.array([LR], np.float32), np.array([0], np.int64)]
    for name, value in zip(names, values):
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(
        "SmartDecaySparseAdam", names, names[:4], beta1=BETA1, beta2=BETA2, epsilon=EPS))
    v_first = (1 - BETA2) * 1.0
    w_first = 1.0 + LR * (1 - BETA1) / (np.sqrt(v_first) + EPS)
    np.testing.assert_allclose(workspace.FetchBlob("v")[1], [v_first * 2] * 2, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("w")[1], [w_first] * 2, rtol=1e-6)
    np.testing.assert_array_equal(workspace.FetchBlob("w")[0], [1.0, 1.0])


def _sparse_model():
    model = model_helper.ModelHelper(name="smart_decay")
    w = model.param_init_net.ConstantFill([], "w", shape=[4, 2], value=0.0)
    model.params.append(w)
    out = model.net.Gather([w, "indices"], "gathered")
    loss = model.net.AveragedLoss(out, "loss")
    model.AddGradientOperators([loss])
    return model


def test_adam_optimizer_use_smart_decay_builds_smart_decay_op():
    model = _sparse_model()
    optimizer.build_adam(model, base_learning_rate=0.1, beta1=0.0, use_smart_decay=True)
    ops = {op.type: op for op in model.net.Proto().op}
    op = ops["SmartDecaySparseAdam"]
    assert list(op.input)[:4] == ["w", "w_first_moment", "w_second_moment", "w_last_seen"]
    assert list(op.output) == ["w", "w_first_moment", "w_second_moment", "w_last_seen"]
    init = {o.output[0]: o for o in model.param_init_net.Proto().op}
    fill = init["w_last_seen"]
    args = {a.name: a for a in fill.arg}
    assert list(args["shape"].ints) == [4] and args["dtype"].i == caffe2_pb2.TensorProto.INT64
    workspace.FeedBlob("indices", np.array([0, 2], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    # Iter has run once (iteration 1), so t = 2
    np.testing.assert_array_equal(workspace.FetchBlob("w_last_seen"), [2, 0, 2, 0])


def test_use_smart_decay_refuses_row_wise():
    with pytest.raises(ModelConfigError, match="use_smart_decay"):
        optimizer.AdamOptimizer(use_smart_decay=True, rowWise=True)
