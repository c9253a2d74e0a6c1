"""rnn_cell.LSTM, rnn_cell.MILSTM and gru_cell.GRU against independent numpy references:
forward to 1e-5 and gradients (params, input, initial states) to 1e-4 of float64 finite
differences, with and without sequence lengths, forward_only on and off."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _rnn_reference import PARAMS, Problem, build, feed, numeric_grads  # noqa: E402

from dpgraph import workspace  # noqa: E402

SCOPE = "rnn"
CASES = [
    # kind, lengths, init_dims, forget_bias, drop_states, outputs_with_grads
    ("lstm", True, 3, 0.0, False, [0]),
    ("lstm", False, 2, 0.5, False, [0, 1, 2, 3]),
    ("lstm", True, 1, 1.0, True, [0, 3]),
    ("milstm", True, 3, 0.0, False, [0, 1, 2, 3]),
    ("milstm", False, 2, 0.3, False, [0]),
    ("gru", True, 3, 0.0, False, [0, 1]),
    ("gru", False, 2, 0.0, True, [0]),
]


def _outputs(problem: Problem, forward_only: bool, owg: list[int], forget_bias: float,
             drop: bool, **kwargs: object) -> list[np.ndarray]:
    model, outputs = build(problem, SCOPE, forward_only, owg, forget_bias, drop, **kwargs)
    workspace.RunNetOnce(model.param_init_net)
    feed(problem, SCOPE)
    workspace.RunNetOnce(model.net)
    return [workspace.FetchBlob(o) for o in outputs]


@pytest.mark.parametrize("forward_only", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-len{int(c[1])}-init{c[2]}")
def test_forward_matches_reference(case: tuple, forward_only: bool) -> None:
    kind, lengths, init_dims, forget_bias, drop, owg = case
    problem = Problem(kind, 4, 3, 3, 4, lengths, init_dims, seed=len(kind) + init_dims)
    got = _outputs(problem, forward_only, owg, forget_bias, drop)
    expected = problem.reference(problem.values(), forget_bias, drop)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def _loss(problem: Problem, owg: list[int], forget_bias: float, drop: bool, **kwargs: object):
    def f(values: dict[str, np.ndarray]) -> float:
        outs = problem.reference(values, forget_bias, drop, **kwargs)
        return float(sum(np.sum(outs[k] * problem.out_grads[k]) for k in owg))
    return f


def _analytic(problem: Problem, owg: list[int], forget_bias: float, drop: bool,
              **kwargs: object) -> dict[str, np.ndarray]:
    model, outputs = build(problem, SCOPE, False, owg, forget_bias, drop, **kwargs)
    for k in owg:
        model.net.AddExternalInput(f"out_grad_{k}")
    model.AddGradientOperators({outputs[k]: f"out_grad_{k}" for k in owg})
    workspace.RunNetOnce(model.param_init_net)
    feed(problem, SCOPE)
    for k in owg:
        workspace.FeedBlob(f"out_grad_{k}", problem.out_grads[k].astype(np.float32))
    workspace.RunNetOnce(model.net)
    grads = {"x": workspace.FetchBlob("x_grad"), "h0": workspace.FetchBlob("h0_grad")}
    if problem.kind != "gru":
        grads["c0"] = workspace.FetchBlob("c0_grad")
    for name in PARAMS[problem.kind]:
        grads[name] = workspace.FetchBlob(f"{SCOPE}/{name}_grad")
    return grads


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-len{int(c[1])}-init{c[2]}")
def test_gradients_match_finite_differences(case: tuple) -> None:
    kind, lengths, init_dims, forget_bias, drop, owg = case
    problem = Problem(kind, 3, 2, 3, 3, lengths, init_dims, seed=7 * len(kind) + init_dims)
    got = _analytic(problem, owg, forget_bias, drop)
    expected = numeric_grads(_loss(problem, owg, forget_bias, drop), problem.values(),
                             list(got))
    for name, value in got.items():
        assert value.shape == expected[name].shape, name
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("linear_before_reset", [False, True])
def test_gru_linear_before_reset(linear_before_reset: bool) -> None:
    problem = Problem("gru", 3, 2, 2, 3, True, 2, seed=5)
    got = _analytic(problem, [0], 0.0, False, linear_before_reset=linear_before_reset)
    f = _loss(problem, [0], 0.0, False, linear_before_reset=linear_before_reset)
    expected = numeric_grads(f, problem.values(), list(got))
    for name, value in got.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_sequence_lengths_carry_states_past_the_end() -> None:
    problem = Problem("lstm", 4, 3, 2, 3, True, 2, seed=3)
    problem.lengths = np.array([4, 1, 2], np.int32)
    hidden_all, hidden_last, _, cell_last = _outputs(problem, True, [0], 0.0, False)
    np.testing.assert_array_equal(hidden_all[1:, 1], np.repeat(hidden_all[:1, 1], 3, axis=0))
    np.testing.assert_array_equal(hidden_last[0], hidden_all[-1])
    dropped = _outputs(problem, True, [0], 0.0, True)
    assert np.all(dropped[0][1:, 1] == 0) and np.all(dropped[3][0, 1] == 0)
    assert np.all(cell_last[0, 1] != 0)


@pytest.mark.parametrize("kind", ["lstm", "milstm"])
def test_memory_optimization_recomputes_gates_with_the_same_gradients(kind: str) -> None:
    problem = Problem(kind, 3, 2, 3, 3, True, 3, seed=11)
    plain = _analytic(problem, [0, 3], 0.2, False)
    recomputed = _analytic(problem, [0, 3], 0.2, False, memory_optimization=True)
    for name, value in plain.items():
        np.testing.assert_allclose(recomputed[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_layer_norm_lstm_runs_and_refuses_memory_optimization() -> None:
    from dpgraph import rnn_cell
    from dpgraph.errors import ModelError
    from dpgraph.model_helper import ModelHelper

    workspace.ResetWorkspace()
    model = ModelHelper(name="ln")
    out = rnn_cell.LayerNormLSTM(model, "x", "lengths", ["h0", "c0"], 2, 4, scope="ln")
    model.AddGradientOperators([model.net.SumElements(out[0], "loss")])
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    workspace.FeedBlob("x", rng.standard_normal((3, 2, 2)).astype(np.float32))
    workspace.FeedBlob("lengths", np.array([3, 2], np.int32))
    for name in ("h0", "c0"):
        workspace.FeedBlob(name, rng.standard_normal((1, 2, 4)).astype(np.float32))
    workspace.RunNetOnce(model.net)
    assert np.all(np.isfinite(workspace.FetchBlob("ln/gates_t_norm_scale_grad")))
    with pytest.raises(ModelError, match="recompute"):
        rnn_cell.LayerNormLSTM(ModelHelper(name="ln2"), "x", "lengths", ["h0", "c0"], 2, 4,
                               scope="ln", memory_optimization=True)
