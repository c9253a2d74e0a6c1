"""LSTM benchmark: prints ONE JSON object.

An ``rnn_cell.LSTM`` (RecurrentNetwork + LSTMUnit, with its backward step net) over a
sequence, forward and backward in one net run, against the same math written as a plain
float32 numpy loop (input projection as one matmul, a per-step gates matmul and the LSTM
unit forward; the reverse loop with the unit's gradient and the three weight gradients),
timed in the same process in alternating rounds.  ``ratio`` = dpgraph time / numpy time
(target <= 1.5).  Both are checked to compute the same parameter gradients first.

BLAS runs on one thread for both sides unless ``BENCH_BLAS_THREADS`` says otherwise (set
before numpy loads): on a small shared machine threaded BLAS timings are mostly contention.

Usage: ``python bench/rnn.py [--batch 32] [--hidden 256] [--seq 50] [--input 256]``.
"""

from __future__ import annotations

import os

BLAS_THREADS = os.environ.get("BENCH_BLAS_THREADS", "1")
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, BLAS_THREADS)

import argparse  # noqa: E402
import json  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
from _bench_util import median_seconds  # noqa: E402

from dpgraph import rnn_cell, workspace  # noqa: E402
from dpgraph.model_helper import ModelHelper  # noqa: E402

TARGET = 1.5


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class NumpyLSTM:
    """Forward and backward of the LSTM in a plain loop (loss = sum of all hidden states)."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.p = params

    def run(self, x: np.ndarray, h0: np.ndarray, c0: np.ndarray) -> dict[str, np.ndarray]:
        p = self.p
        t_len, n, _ = x.shape
        d = h0.shape[-1]
        xw = (x.reshape(t_len * n, -1) @ p["i2h_w"].T + p["i2h_b"]).reshape(t_len, n, 4 * d)
        hs, cs, acts = [h0], [c0], []
        for t in range(t_len):
            gates = hs[-1] @ p["gates_t_w"].T + p["gates_t_b"] + xw[t]
            i, f = _sigmoid(gates[:, :d]), _sigmoid(gates[:, d:2 * d])
            o, g = _sigmoid(gates[:, 2 * d:3 * d]), np.tanh(gates[:, 3 * d:])
            c = f * cs[-1] + i * g
            hs.append(o * np.tanh(c))
            cs.append(c)
            acts.append((i, f, o, g))
        return self._backward(x, hs, cs, acts)

    def _backward(self, x: np.ndarray, hs: list[np.ndarray], cs: list[np.ndarray],
                  acts: list[tuple[np.ndarray, ...]]) -> dict[str, np.ndarray]:
        p = self.p
        t_len, n, _ = x.shape
        dgates_all = np.empty((t_len, n, p["gates_t_w"].shape[0]), np.float32)
        dh_next = np.zeros_like(hs[0])
        dc_next = np.zeros_like(cs[0])
        for t in reversed(range(t_len)):
            i, f, o, g = acts[t]
            dh = 1.0 + dh_next
            tc = np.tanh(cs[t + 1])
            dc = dc_next + dh * o * (1 - tc * tc)
            dgates = dgates_all[t]
            d = dh.shape[-1]
            dgates[:, :d] = dc * g * i * (1 - i)
            dgates[:, d:2 * d] = dc * cs[t] * f * (1 - f)
            dgates[:, 2 * d:3 * d] = dh * tc * o * (1 - o)
            dgates[:, 3 * d:] = dc * i * (1 - g * g)
            dc_next = dc * f
            dh_next = dgates @ p["gates_t_w"]
        flat = dgates_all.reshape(t_len * n, -1)
        h_prev = np.stack(hs[:-1]).reshape(t_len * n, -1)
        return {"gates_t_w": flat.T @ h_prev, "gates_t_b": flat.sum(0),
                "i2h_w": flat.T @ x.reshape(t_len * n, -1), "i2h_b": flat.sum(0),
                "x": (flat @ p["i2h_w"]).reshape(x.shape)}


def build_dpgraph(batch: int, hidden: int, seq: int, dim_in: int,
                  params: dict[str, np.ndarray], x: np.ndarray, h0: np.ndarray,
                  c0: np.ndarray) -> Callable[[], None]:
    workspace.ResetWorkspace()
    model = ModelHelper(name="bench_lstm")
    inputs = model.net.AddExternalInputs("x", "h0", "c0")
    hidden_all, _, _, _ = rnn_cell.LSTM(model, inputs[0], None, inputs[1:], dim_in=dim_in,
                                        dim_out=hidden, scope="lstm")
    model.AddGradientOperators([model.net.SumElements(hidden_all, "loss")])
    workspace.RunNetOnce(model.param_init_net)
    for name, value in params.items():
        workspace.FeedBlob(f"lstm/{name}", value)
    for name, value in (("x", x), ("h0", h0[None]), ("c0", c0[None])):
        workspace.FeedBlob(name, value)
    workspace.CreateNet(model.net)
    name = model.net.Proto().name
    return lambda: workspace.RunNet(name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=50)
    parser.add_argument("--input", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    h, d_in = args.hidden, args.input
    params = {"i2h_w": rng.standard_normal((4 * h, d_in)) * 0.05,
              "i2h_b": rng.standard_normal(4 * h) * 0.05,
              "gates_t_w": rng.standard_normal((4 * h, h)) * 0.05,
              "gates_t_b": rng.standard_normal(4 * h) * 0.05}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x = rng.standard_normal((args.seq, args.batch, d_in)).astype(np.float32)
    h0 = rng.standard_normal((args.batch, h)).astype(np.float32) * 0.1
    c0 = rng.standard_normal((args.batch, h)).astype(np.float32) * 0.1
    reference = NumpyLSTM(params)
    run = build_dpgraph(args.batch, h, args.seq, d_in, params, x, h0, c0)
    run()
    expected = reference.run(x, h0, c0)
    worst = max(float(np.max(np.abs(workspace.FetchBlob(f"lstm/{k}_grad") - expected[k])) /
                      (float(np.max(np.abs(expected[k]))) + 1e-6))
                for k in params)
    ours, theirs = [], []
    for _ in range(args.rounds):  # alternate so load from other processes hits both
        ours.append(median_seconds(run, args.reps))
        theirs.append(median_seconds(lambda: reference.run(x, h0, c0), args.reps))
    dpgraph_s, numpy_s = min(ours), min(theirs)
    print(json.dumps({
        "benchmark": "rnn_lstm_forward_backward", "batch": args.batch, "hidden": h,
        "seq": args.seq, "input": d_in, "blas_threads": int(BLAS_THREADS),
        "dpgraph_s": round(dpgraph_s, 5),
        "numpy_loop_s": round(numpy_s, 5), "ratio": round(dpgraph_s / numpy_s, 3),
        "target": TARGET, "meets_target": dpgraph_s / numpy_s <= TARGET,
        "max_rel_grad_diff": float(f"{worst:.2e}")}))


if __name__ == "__main__":
    main()
