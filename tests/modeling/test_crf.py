"""CRF layer (modeling/crf.py, facades crf / crf_predict) and the ViterbiPath/SwapBestPath
ops (ops/crf_viterbi.py): the loss against a brute-force sum over every tag path, Viterbi
against exhaustive search, and the op-based re-ranking against the Python-op one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _workspace import clean_runtime  # noqa: F401

from dpgraph import crf, crf_predict, workspace
from dpgraph.errors import OperatorError, ShapeError
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import run_op

RNG = np.random.default_rng(4)


def brute_force_loss(pred: np.ndarray, labels: np.ndarray, trans: np.ndarray) -> float:
    """-log P(labels): every path from BOS (tag C) to EOS (tag C + 1) over the real tags."""
    steps, tags = pred.shape
    bos, eos = tags, tags + 1

    def score(path: tuple[int, ...]) -> float:
        full = (bos, *path, eos)
        return sum(pred[t, k] for t, k in enumerate(path)) + \
            sum(trans[a, b] for a, b in zip(full[:-1], full[1:]))

    all_scores = [score(p) for p in itertools.product(range(tags), repeat=steps)]
    return float(np.logaddexp.reduce(all_scores) - score(tuple(labels)))


def test_crf_loss_matches_brute_force_and_has_gradients() -> None:
    tags, steps = 3, 4
    model = ModelHelper(name="crf_model")
    pred_blob, label_blob, trans_blob = model.net.AddExternalInputs("pred", "labels", "trans")
    pred = RNG.standard_normal((steps, tags)).astype(np.float32)
    labels = RNG.integers(0, tags, steps).astype(np.int64)
    trans = RNG.uniform(-1, 1, (tags + 2, tags + 2)).astype(np.float32)
    for name, value in (("pred", pred), ("labels", labels), ("trans", trans)):
        workspace.FeedBlob(name, value)
    layer = crf.CRFWithLoss(model, tags, trans_blob)
    assert layer.num_classes_padded == tags + 2 and trans_blob in model.params
    loss = layer.crf_loss(pred_blob, label_blob)
    assert str(loss) == "crf_loss"
    grads = model.net.AddGradientOperators([loss])
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    np.testing.assert_allclose(workspace.FetchBlob("crf_loss"),
                               brute_force_loss(pred, labels, trans), rtol=1e-4, atol=1e-4)
    # d loss / d pred: marginal tag probabilities minus the one-hot labels (rows sum to 0).
    d_pred = workspace.FetchBlob(str(grads["pred"]))
    np.testing.assert_allclose(d_pred.sum(axis=1), 0, atol=1e-4)
    eps, bumped = 1e-2, pred.copy()
    bumped[1, 2] += eps
    numeric = (brute_force_loss(bumped, labels, trans) -
               brute_force_loss(pred, labels, trans)) / eps
    np.testing.assert_allclose(d_pred[1, 2], numeric, atol=2e-2)


def test_default_transitions_are_a_uniform_param() -> None:
    model = ModelHelper(name="m")
    layer = crf.CRFWithLoss(model, 2)
    init = model.param_init_net.Proto().op[-1]
    assert (init.type, list(init.output)) == ("UniformFill", ["crf_transitions"])
    assert layer.transitions in model.params


def brute_force_viterbi(pred: np.ndarray, trans: np.ndarray) -> list[int]:
    steps, tags = pred.shape

    def score(path: tuple[int, ...]) -> float:
        return sum(pred[t, k] for t, k in enumerate(path)) + \
            sum(trans[a, b] for a, b in zip(path[:-1], path[1:]))

    return list(max(itertools.product(range(tags), repeat=steps), key=score))


def test_viterbi_path_is_the_best_path() -> None:
    for steps, tags in ((1, 3), (4, 3), (5, 2)):
        pred = RNG.standard_normal((steps, tags)).astype(np.float32)
        trans = RNG.standard_normal((tags, tags)).astype(np.float32)
        (path,) = run_op(make_op("ViterbiPath", ["P", "T"], ["V"]), [pred, trans])
        assert path.dtype == np.int32 and path.tolist() == brute_force_viterbi(pred, trans)


def test_swap_best_path_moves_each_rows_best_score() -> None:
    data = np.array([[1.0, 5.0, 2.0], [0.5, 0.1, 3.0]], np.float32)
    (out,) = run_op(make_op("SwapBestPath", ["D", "B"], ["O"]),
                    [data, np.array([0, 2], np.int32)])
    np.testing.assert_array_equal(out, np.array([[5, 1, 2], [0.5, 0.1, 3]], np.float32))


def test_viterbi_ops_validate_and_have_no_gradient() -> None:
    with pytest.raises((ShapeError, OperatorError), match="not matching"):
        run_op(make_op("ViterbiPath", ["P", "T"], ["V"]),
               [np.ones((2, 3), np.float32), np.ones((2, 2), np.float32)])
    with pytest.raises((ShapeError, OperatorError), match="not matching"):
        run_op(make_op("SwapBestPath", ["D", "B"], ["O"]),
               [np.ones((2, 3), np.float32), np.zeros(3, np.int32)])
    for op_type in ("ViterbiPath", "SwapBestPath"):
        ops, _ = build_gradient(make_op(op_type, ["a", "b"], ["c"]), ["c_grad"])
        assert ops == []


def test_crf_update_predictions_ops_match_python_op() -> None:
    tags, steps = 3, 5
    model = ModelHelper(name="decode")
    pred_blob, trans_blob = model.net.AddExternalInputs("predictions", "crf_transitions")
    pred = RNG.standard_normal((steps, tags)).astype(np.float32)
    workspace.FeedBlob("predictions", pred)
    workspace.FeedBlob("crf_transitions",
                       RNG.uniform(-1, 1, (tags + 2, tags + 2)).astype(np.float32))
    layer = crf.CRFWithLoss(model, tags, trans_blob)
    with_ops = crf_predict.crf_update_predictions(model, layer, pred_blob)
    with_python = layer.update_predictions(pred_blob)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    got, ref = workspace.FetchBlob(str(with_ops)), workspace.FetchBlob(str(with_python))
    assert got.shape == (steps, tags)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(pred, axis=1))
