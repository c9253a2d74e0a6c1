"""Independent float64 numpy references of the recurrent cells (from the facts' formulas),
a driver that builds the same model with dpgraph's rnn_cell, and finite differences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph import gru_cell, rnn_cell, workspace
from dpgraph.model_helper import ModelHelper


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _fc(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w.T + b


def _mask(lengths: np.ndarray | None, t: int, n: int) -> np.ndarray:
    if lengths is None:
        return np.ones((n, 1))
    return (t < lengths).astype(np.float64)[:, None]


def _carry(valid: np.ndarray, new: np.ndarray, prev: np.ndarray, drop: bool) -> np.ndarray:
    return valid * new + (0.0 if drop else 1.0) * (1 - valid) * prev


def lstm_unit(h: np.ndarray, c: np.ndarray, gates: np.ndarray, valid: np.ndarray,
              forget_bias: float, drop: bool) -> tuple[np.ndarray, np.ndarray]:
    d = h.shape[-1]
    i, f = sigmoid(gates[:, :d]), sigmoid(gates[:, d:2 * d] + forget_bias)
    o, g = sigmoid(gates[:, 2 * d:3 * d]), np.tanh(gates[:, 3 * d:])
    c_new = f * c + i * g
    h_new = o * np.tanh(c_new)
    return _carry(valid, h_new, h, drop), _carry(valid, c_new, c, drop)


def run_lstm(kind: str, p: dict[str, np.ndarray], x: np.ndarray, h0: np.ndarray,
             c0: np.ndarray, lengths: np.ndarray | None, forget_bias: float,
             drop: bool) -> list[np.ndarray]:
    """(hidden_all, hidden_last, cell_all, cell_last) of an LSTM or MILSTM."""
    t_len, n = x.shape[:2]
    h = np.broadcast_to(h0.reshape(-1, h0.shape[-1]), (n, h0.shape[-1]))
    c = np.broadcast_to(c0.reshape(-1, c0.shape[-1]), (n, c0.shape[-1]))
    hs, cs = [], []
    for t in range(t_len):
        xt = _fc(x[t], p["i2h_w"], p["i2h_b"])
        if kind == "lstm":
            gates = _fc(h, p["gates_t_w"], p["gates_t_b"]) + xt
        else:
            prev = _fc(h, p["prev_t_w"], p["prev_t_b"])
            gates = (p["alpha"] * xt + p["beta1"]) * prev + (p["beta2"] * xt + p["b"])
        h, c = lstm_unit(h, c, gates, _mask(lengths, t, n), forget_bias, drop)
        hs.append(h)
        cs.append(c)
    hs_all, cs_all = np.stack(hs), np.stack(cs)
    return [hs_all, hs_all[-1:], cs_all, cs_all[-1:]]


def run_gru(p: dict[str, np.ndarray], x: np.ndarray, h0: np.ndarray, lengths: np.ndarray | None,
            drop: bool, linear_before_reset: bool) -> list[np.ndarray]:
    """(hidden_all, hidden_last) of gru_cell.GRU."""
    t_len, n = x.shape[:2]
    h = np.broadcast_to(h0.reshape(-1, h0.shape[-1]), (n, h0.shape[-1]))
    d = h.shape[-1]
    hs = []
    for t in range(t_len):
        xt = _fc(x[t], p["i2h_w"], p["i2h_b"])
        r = sigmoid(_fc(h, p["reset_gate_t_w"], p["reset_gate_t_b"]) + xt[:, :d])
        u = sigmoid(_fc(h, p["update_gate_t_w"], p["update_gate_t_b"]) + xt[:, d:2 * d])
        if linear_before_reset:
            o = r * _fc(h, p["output_gate_t_w"], p["output_gate_t_b"]) + xt[:, 2 * d:]
        else:
            o = _fc(r * h, p["output_gate_t_w"], p["output_gate_t_b"]) + xt[:, 2 * d:]
        h = _carry(_mask(lengths, t, n), u * h + (1 - u) * np.tanh(o), h, drop)
        hs.append(h)
    hs_all = np.stack(hs)
    return [hs_all, hs_all[-1:]]


PARAMS = {
    "lstm": ["i2h_w", "i2h_b", "gates_t_w", "gates_t_b"],
    "milstm": ["i2h_w", "i2h_b", "prev_t_w", "prev_t_b", "alpha", "beta1", "beta2", "b"],
    "gru": ["i2h_w", "i2h_b", "reset_gate_t_w", "reset_gate_t_b", "update_gate_t_w",
            "update_gate_t_b", "output_gate_t_w", "output_gate_t_b"],
}


def param_shapes(kind: str, d_in: int, h: int) -> dict[str, tuple[int, ...]]:
    gates = 3 * h if kind == "gru" else 4 * h
    shapes: dict[str, tuple[int, ...]] = {"i2h_w": (gates, d_in), "i2h_b": (gates,)}
    for name in PARAMS[kind][2:]:
        if name.endswith("_w"):
            shapes[name] = (h, h) if kind == "gru" else (4 * h, h)
        else:
            shapes[name] = (h,) if kind == "gru" else (4 * h,)
    return shapes


class Problem:
    """Random inputs, params and output gradients for one configuration."""

    def __init__(self, kind: str, t: int, n: int, d_in: int, h: int, lengths: bool,
                 init_dims: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.kind, self.h = kind, h
        self.x = rng.standard_normal((t, n, d_in))
        shape = {1: (h,), 2: (n, h), 3: (1, n, h)}[init_dims]
        self.h0 = rng.standard_normal(shape) * 0.5
        self.c0 = rng.standard_normal(shape) * 0.5
        self.lengths = rng.integers(1, t + 1, size=n).astype(np.int32) if lengths else None
        self.params = {k: rng.standard_normal(s) * 0.4
                       for k, s in param_shapes(kind, d_in, h).items()}
        if kind == "milstm":
            for k in ("alpha", "beta1", "beta2"):
                self.params[k] = 1.0 + 0.3 * rng.standard_normal(4 * h)
        n_out = 2 if kind == "gru" else 4
        self.out_grads = [rng.standard_normal((t if k % 2 == 0 else 1, n, h))
                          for k in range(n_out)]

    def reference(self, values: dict[str, np.ndarray], forget_bias: float,
                  drop: bool, linear_before_reset: bool = False) -> list[np.ndarray]:
        p = {k: values[k] for k in self.params}
        if self.kind == "gru":
            return run_gru(p, values["x"], values["h0"], self.lengths, drop, linear_before_reset)
        return run_lstm(self.kind, p, values["x"], values["h0"], values["c0"], self.lengths,
                        forget_bias, drop)

    def values(self) -> dict[str, np.ndarray]:
        return {"x": self.x, "h0": self.h0, "c0": self.c0, **self.params}


def numeric_grads(f: Callable[[dict[str, np.ndarray]], float], values: dict[str, np.ndarray],
                  names: list[str], eps: float = 1e-6) -> dict[str, np.ndarray]:
    """Central differences of the scalar ``f`` w.r.t. each named array (float64)."""
    result = {}
    for name in names:
        base = values[name]
        grad = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            for sign in (1, -1):
                bumped = base.copy()
                bumped[index] += sign * eps
                grad[index] += sign * f({**values, name: bumped}) / (2 * eps)
        result[name] = grad
    return result


def build(problem: Problem, scope: str, forward_only: bool, outputs_with_grads: list[int],
          forget_bias: float, drop: bool, **cell_kwargs: Any) -> tuple[ModelHelper, list[Any]]:
    """The dpgraph model of ``problem`` (rnn_cell.LSTM/MILSTM or gru_cell.GRU)."""
    workspace.ResetWorkspace()
    model = ModelHelper(name="rnn_ref")
    x, h0, c0 = model.net.AddExternalInputs("x", "h0", "c0")
    seq = model.net.AddExternalInput("seq_lengths") if problem.lengths is not None else None
    fn = {"lstm": rnn_cell.LSTM, "milstm": rnn_cell.MILSTM, "gru": gru_cell.GRU}[problem.kind]
    states = [h0] if problem.kind == "gru" else [h0, c0]
    outputs = fn(model, x, seq, states, dim_in=problem.x.shape[2], dim_out=problem.h,
                 scope=scope, outputs_with_grads=outputs_with_grads, forget_bias=forget_bias,
                 forward_only=forward_only, drop_states=drop, **cell_kwargs)
    return model, list(outputs)


def feed(problem: Problem, scope: str) -> None:
    workspace.FeedBlob("x", problem.x.astype(np.float32))
    workspace.FeedBlob("h0", problem.h0.astype(np.float32))
    workspace.FeedBlob("c0", problem.c0.astype(np.float32))
    if problem.lengths is not None:
        workspace.FeedBlob("seq_lengths", problem.lengths)
    for name, value in problem.params.items():
        workspace.FeedBlob(f"{scope}/{name}", value.astype(np.float32))
