"""Whole-net gradients from the backward pass against finite differences of the loss.

Each net runs forward and backward on numpy dicts (``dpgraph.ops.testing.run_ops``); sparse
gradients are densified before the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from _autodiff_testops import op

from dpgraph import core
from dpgraph.autodiff import GetBackwardPass
from dpgraph.errors import GradientError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.testing import run_ops
from dpgraph.proto import caffe2_pb2

RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _reseed() -> None:
    """Each test draws the same numbers whatever ran before it."""
    global RNG
    RNG = np.random.default_rng(1234)


def need_ops(*op_types: str) -> None:
    missing = [t for t in op_types if (s := OPERATORS.get(t)) is None or s.kernel is None]
    if missing:
        pytest.skip(f"ops not implemented yet: {', '.join(missing)}")


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def densify(grad: Any, state: Mapping[str, Any], like: np.ndarray) -> np.ndarray:
    if isinstance(grad, GradientSlice):
        dense = np.zeros(like.shape, np.float64)
        indices = np.asarray(state[str(grad.indices)]).reshape(-1)
        values = np.asarray(state[str(grad.values)], np.float64)
        np.add.at(dense, indices, values.reshape((indices.size,) + like.shape[1:]))
        return dense
    return np.asarray(state[str(grad)], np.float64)


def loss_value(ops: Sequence[caffe2_pb2.OperatorDef], feeds: Mapping[str, Any],
               loss: str) -> float:
    return float(np.sum(np.asarray(run_ops(ops, feeds)[loss], np.float64)))


def finite_difference(ops: Sequence[caffe2_pb2.OperatorDef], feeds: Mapping[str, Any],
                      blob: str, loss: str, eps: float) -> np.ndarray:
    base = np.asarray(feeds[blob])
    grad = np.zeros(base.shape, np.float64)
    for j in range(base.size):
        values = []
        for delta in (eps, -eps):
            moved = base.copy()
            moved.reshape(-1)[j] += delta
            values.append(loss_value(ops, {**feeds, blob: moved}, loss))
        grad.reshape(-1)[j] = (values[0] - values[1]) / (2 * eps)
    return grad


def check_net(ops: Sequence[caffe2_pb2.OperatorDef], feeds: Mapping[str, Any], loss: str,
              wrt: Sequence[str], eps: float = 1e-2, rtol: float = 3e-2,
              atol: float = 3e-3) -> tuple[list[caffe2_pb2.OperatorDef], dict[Any, Any]]:
    """Assert d loss / d blob from the backward pass matches finite differences."""
    grad_ops, grad_map = GetBackwardPass(ops, [loss])
    state = run_ops(list(ops) + grad_ops, feeds)
    for blob in wrt:
        assert blob in grad_map, f"no gradient for {blob}"
        analytic = densify(grad_map[blob], state, np.asarray(feeds[blob]))
        numeric = finite_difference(ops, feeds, blob, loss, eps)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {blob}")
    return grad_ops, grad_map


# --- the numeric cases of core_gradients_test ------------------------------------------------
def test_two_ys_along_one_chain() -> None:
    need_ops("Scale", "Sum", "ConstantFill")
    ops = [op("Scale", "in", "m1", scale=2.0), op("Scale", "m1", "m2", scale=3.0)]
    grad_ops, grad_map = GetBackwardPass(ops, ["m2", "m1"])
    state = run_ops(ops + grad_ops, {"in": randn(3)})
    np.testing.assert_allclose(state[str(grad_map["in"])], np.full(3, 8.0))


def test_two_ys_on_two_branches() -> None:
    need_ops("Scale", "Sub", "Negative", "Sum", "ConstantFill")
    ops = [op("Scale", "in", "m1", scale=2.0), op("Scale", "in", "m2", scale=3.0),
           op("Sub", ["m1", "one"], "sub")]
    grad_ops, grad_map = GetBackwardPass(ops, ["m2", "sub"])
    state = run_ops(ops + grad_ops, {"in": randn(3), "one": np.ones(3, np.float32)})
    np.testing.assert_allclose(state[str(grad_map["in"])], np.full(3, 5.0))
    np.testing.assert_allclose(state[str(grad_map["one"])], np.full(3, -1.0))


# --- whole nets ------------------------------------------------------------------------------
def test_mlp_with_softmax_with_loss_and_in_place_relu() -> None:
    need_ops("FC", "Relu", "SoftmaxWithLoss", "ConstantFill")
    ops = [op("FC", ["x", "w1", "b1"], "h"), op("Relu", "h", "h"),
           op("FC", ["h", "w2", "b2"], "logits"),
           op("SoftmaxWithLoss", ["logits", "label"], ["softmax", "loss"])]
    feeds = {"x": randn(4, 3), "w1": randn(5, 3), "b1": randn(5, scale=0.1),
             "w2": randn(3, 5), "b2": randn(3, scale=0.1),
             "label": np.array([0, 2, 1, 2], np.int32)}
    grad_ops, _ = check_net(ops, feeds, "loss", ["x", "w1", "b1", "w2", "b2"], eps=1e-3)
    assert [o.type for o in grad_ops] == ["ConstantFill", "SoftmaxWithLossGradient",
                                          "FCGradient", "ReluGradient", "FCGradient"]


def test_mlp_with_softmax_cross_entropy_and_averaged_loss() -> None:
    need_ops("FC", "Tanh", "Softmax", "LabelCrossEntropy", "AveragedLoss", "ConstantFill")
    ops = [op("FC", ["x", "w1", "b1"], "h"), op("Tanh", "h", "t"),
           op("FC", ["t", "w2", "b2"], "logits"), op("Softmax", "logits", "prob"),
           op("LabelCrossEntropy", ["prob", "label"], "xent"),
           op("AveragedLoss", "xent", "loss")]
    feeds = {"x": randn(3, 4), "w1": randn(4, 4), "b1": randn(4), "w2": randn(3, 4),
             "b2": randn(3), "label": np.array([1, 0, 2], np.int32)}
    check_net(ops, feeds, "loss", ["x", "w1", "b1", "w2", "b2"])


def test_small_cnn_with_spatial_bn_and_max_pool() -> None:
    need_ops("Conv", "SpatialBN", "Relu", "MaxPool", "FC", "SoftmaxWithLoss", "ConstantFill")
    ops = [op("Conv", ["data", "conv_w", "conv_b"], "conv", kernel=3, pad=1),
           op("SpatialBN", ["conv", "bn_s", "bn_b", "bn_rm", "bn_riv"],
              ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"], is_test=0, epsilon=1e-5),
           op("Relu", "bn", "bn"),
           op("MaxPool", "bn", "pool", kernel=2, stride=2),
           op("FC", ["pool", "fc_w", "fc_b"], "logits"),
           op("SoftmaxWithLoss", ["logits", "label"], ["softmax", "loss"])]
    feeds = {"data": randn(3, 1, 4, 4), "conv_w": randn(2, 1, 3, 3), "conv_b": randn(2),
             "bn_s": 1 + randn(2, scale=0.1), "bn_b": randn(2, scale=0.1),
             "bn_rm": np.zeros(2, np.float32), "bn_riv": np.ones(2, np.float32),
             "fc_w": randn(3, 8), "fc_b": randn(3), "label": np.array([0, 1, 2], np.int32)}
    check_net(ops, feeds, "loss", ["conv_w", "conv_b", "bn_s", "bn_b", "fc_w", "fc_b"],
              eps=5e-3, rtol=5e-2, atol=5e-3)


def test_embedding_model_with_gather_and_sparse_lengths_sum() -> None:
    need_ops("Gather", "SparseLengthsSum", "Tanh", "Concat", "FC", "Sqr", "AveragedLoss")
    ops = [op("Gather", ["emb", "idx"], "g"),
           op("SparseLengthsSum", ["emb", "ids", "lengths"], "s"),
           op("Tanh", "g", "gt"), op("Tanh", "s", "st"),
           op("Concat", ["gt", "st"], ["c", "c_split"], axis=0),
           op("FC", ["c", "w", "b"], "o"), op("Sqr", "o", "o2"),
           op("AveragedLoss", "o2", "loss")]
    feeds = {"emb": randn(6, 3), "idx": np.array([1, 4, 1, 0], np.int32),
             "ids": np.array([2, 4, 4, 5, 1], np.int64), "lengths": np.array([3, 2], np.int32),
             "w": randn(2, 3), "b": randn(2)}
    grad_ops, grad_map = check_net(ops, feeds, "loss", ["emb", "w", "b"])
    assert grad_map["emb"] == GradientSlice("emb_grad_indices_concat", "emb_grad_values_concat")
    assert [o.type for o in grad_ops][-2:] == ["Concat", "Concat"]


def test_blob_consumed_three_times() -> None:
    need_ops("FC", "Tanh", "Sigmoid", "Scale", "Sum", "Mul", "AveragedLoss")
    ops = [op("FC", ["x", "w", "b"], "h"), op("Tanh", "h", "a"), op("Sigmoid", "h", "s"),
           op("Scale", "h", "c", scale=0.5), op("Sum", ["a", "s", "c"], "t"),
           op("Mul", ["t", "t"], "q"), op("AveragedLoss", "q", "loss")]
    feeds = {"x": randn(3, 4), "w": randn(5, 4, scale=0.5), "b": randn(5)}
    grad_ops, _ = check_net(ops, feeds, "loss", ["x", "w", "b"])
    sums = [o for o in grad_ops if o.type == "Sum"]
    assert [list(o.input) for o in sums] == [
        ["t_grad", "_t_grad_autosplit_0"],
        ["h_grad", "_h_grad_autosplit_0", "_h_grad_autosplit_1"]]


def test_in_place_relu_through_net_add_gradient_operators() -> None:
    need_ops("FC", "Relu", "AveragedLoss", "ConstantFill")
    net = core.Net("autodiff_inplace_relu")
    net.Proto().op.extend([op("FC", ["x", "w1", "b1"], "h"), op("Relu", "h", "h"),
                           op("FC", ["h", "w2", "b2"], "o"), op("Relu", "o", "o"),
                           op("AveragedLoss", "o", "loss")])
    forward = list(net.Proto().op)
    grad_map = net.AddGradientOperators(["loss"])
    feeds = {"x": randn(3, 4), "w1": randn(5, 4), "b1": randn(5), "w2": randn(2, 5),
             "b2": randn(2) + 1}
    state = run_ops(net.Proto().op, feeds)
    for blob in ("x", "w1", "b1", "w2", "b2"):
        numeric = finite_difference(forward, feeds, blob, "loss", 1e-3)
        np.testing.assert_allclose(state[str(grad_map[blob])], numeric, rtol=3e-2, atol=3e-3)


def test_relu_output_overwritten_by_a_second_in_place_relu_is_refused() -> None:
    # Caffe2 refuses this too: the first ReluGradient needs the first Relu's output.
    need_ops("FC", "Relu", "AveragedLoss")
    ops = [op("FC", ["x", "w", "b"], "h"), op("Relu", "h", "h"), op("Relu", "h", "h"),
           op("AveragedLoss", "h", "loss")]
    with pytest.raises(GradientError, match="output 'h' at version 1"):
        GetBackwardPass(ops, ["loss"])
