"""Executor benchmark: dispatch overhead per op and an MLP training step vs plain numpy.

Prints ONE JSON object.  Figures:

* ``dispatch``: a net of 10,000 tiny ``Scale`` ops on a [1] float blob (in place, so a chain)
  for each executor: total µs/op, the kernel alone µs/op, and the difference (overhead).
  ``dag_independent`` runs 10,000 independent ops, so the DAG executor's scheduling is on
  the critical path.
* ``mlp``: one training step (batch 256, 784-1024-1024-10, FC/Relu/SoftmaxWithLoss, gradients
  from AddGradientOperators, MomentumSGDUpdate) in dpgraph vs the same math written directly
  in numpy in the same process, timed in turn in every round; the ratio uses the fastest
  step of each (robust to load from other processes), medians are reported too.

Run: ``python bench/executor.py [--ops N] [--iters K]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from dpgraph import core
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.context import OpContext
from dpgraph.runtime import Workspace

BATCH, SIZES, LR, MOMENTUM = 256, (784, 1024, 1024, 10), 0.01, 0.9


def _time(fn: Any, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def dispatch(num_ops: int, repeats: int) -> dict[str, Any]:
    result: dict[str, Any] = {"num_ops": num_ops}
    op = core.CreateOperator("Scale", ["p"], ["p"], scale=1.0)
    ctx = OpContext(op, arguments_dict(op.arg), np, op.device_option)
    kernel = OPERATORS.lookup("Scale").kernel
    value = np.ones(1, np.float32)

    def kernels_only() -> None:
        for _ in range(num_ops):
            ctx.inputs = [value]
            kernel(ctx)

    kernel_us = min(_time(kernels_only, repeats)) / num_ops * 1e6
    result["kernel_us_per_op"] = round(kernel_us, 3)
    for label, net_type, chain in (("simple", "simple", True), ("dag", "dag", True),
                                   ("dag_independent", "dag", False)):
        ws = Workspace(f"bench_{label}", seed=0)
        ws.feed_blob("p", value)
        net = core.Net(f"bench_dispatch_{label}")
        for i in range(num_ops):
            net.Scale("p", "p" if chain else f"q{i}", scale=1.0)
        net.Proto().type = net_type
        ws.create_net(net.Proto())
        ws.run_net(net)  # warm up (thread pool start)
        total = min(_time(lambda n=net, w=ws: w.run_net(n), repeats)) / num_ops * 1e6
        result[label] = {"us_per_op": round(total, 3),
                         "overhead_us_per_op": round(total - kernel_us, 3)}
        ws.reset()
    return result


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        params[f"w{i}"] = (rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype(
            np.float32)
        params[f"b{i}"] = np.zeros(fan_out, np.float32)
    return params


def mlp_net(net_type: str) -> core.Net:
    net = core.Net(f"bench_mlp_{net_type}")
    blob = "data"
    layers = len(SIZES) - 1
    for i in range(layers):
        blob = net.FC([blob, f"w{i}", f"b{i}"], f"fc{i}")
        if i < layers - 1:
            blob = net.Relu(blob, f"relu{i}")
    _, loss = net.SoftmaxWithLoss([blob, "label"], ["softmax", "loss"])
    grads = net.AddGradientOperators([loss])
    for i in range(layers):
        for name in (f"w{i}", f"b{i}"):
            net.MomentumSGDUpdate([grads[name], f"{name}_m", "lr", name],
                                  [grads[name], f"{name}_m", name], momentum=MOMENTUM)
    net.Proto().type = net_type
    return net


def numpy_step(state: dict[str, np.ndarray], x: np.ndarray, label: np.ndarray) -> float:
    """The same training step written directly in numpy."""
    layers = len(SIZES) - 1
    acts, pre = [x], []
    for i in range(layers):
        h = acts[-1] @ state[f"w{i}"].T + state[f"b{i}"]
        pre.append(h)
        acts.append(np.maximum(h, 0) if i < layers - 1 else h)
    logits = acts[-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(shifted)
    prob /= prob.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(np.maximum(prob[np.arange(BATCH), label], 1e-20)))
    grad = prob.copy()
    grad[np.arange(BATCH), label] -= 1
    grad /= BATCH
    for i in reversed(range(layers)):
        if i < layers - 1:
            grad = grad * (pre[i] > 0)
        gw, gb = grad.T @ acts[i], grad.sum(axis=0)
        grad = grad @ state[f"w{i}"]  # for i == 0 this is d loss / d data, as FCGradient does
        for name, g in ((f"w{i}", gw), (f"b{i}", gb)):
            m = state[f"{name}_m"] = MOMENTUM * state[f"{name}_m"] + LR * g
            state[name] = state[name] - m
    return float(loss)


def _mlp_workspace(net_type: str, params: dict[str, np.ndarray], x: np.ndarray,
                   label: np.ndarray) -> tuple[Workspace, core.Net]:
    ws = Workspace(f"bench_mlp_{net_type}", seed=0)
    for name, value in params.items():
        ws.feed_blob(name, value)
        ws.feed_blob(f"{name}_m", np.zeros_like(value))
    ws.feed_blob("data", x)
    ws.feed_blob("label", label)
    ws.feed_blob("lr", np.array([LR], np.float32))
    net = mlp_net(net_type)
    ws.create_net(net.Proto())
    ws.run_net(net)  # warm up
    return ws, net


def mlp(iters: int) -> dict[str, Any]:
    """Step times; numpy and each executor are timed in turn within every round so that
    load from other processes affects them alike."""
    rng = np.random.default_rng(0)
    params = _params(rng)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    label = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    state = {**{k: v.copy() for k, v in params.items()},
             **{f"{k}_m": np.zeros_like(v) for k, v in params.items()}}
    numpy_step(state, x, label)
    runs = {t: _mlp_workspace(t, params, x, label) for t in ("simple", "dag")}
    times: dict[str, list[float]] = {"numpy": [], "simple": [], "dag": []}
    for _ in range(iters):
        times["numpy"] += _time(lambda: numpy_step(state, x, label), 1)
        for net_type, (ws, net) in runs.items():
            times[net_type] += _time(lambda w=ws, n=net: w.run_net(n), 1)
    same = np.array_equal(runs["simple"][0].fetch_blob("w0"), runs["dag"][0].fetch_blob("w0"))
    result: dict[str, Any] = {"batch": BATCH, "sizes": list(SIZES), "iters": iters,
                              "simple_equals_dag": bool(same)}
    numpy_ms = min(times["numpy"]) * 1e3
    result["numpy_ms"] = round(numpy_ms, 3)
    result["numpy_median_ms"] = round(statistics.median(times["numpy"]) * 1e3, 3)
    for net_type in ("simple", "dag"):
        ms = min(times[net_type]) * 1e3
        result[f"{net_type}_ms"] = round(ms, 3)
        result[f"{net_type}_median_ms"] = round(statistics.median(times[net_type]) * 1e3, 3)
        result[f"{net_type}_ratio"] = round(ms / numpy_ms, 3)
    for ws, _ in runs.values():
        ws.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report = {"benchmark": "executor", "dispatch": dispatch(args.ops, args.repeats),
              "mlp": mlp(args.iters), "targets": {"simple_us_per_op": 15, "mlp_ratio": 1.2}}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
