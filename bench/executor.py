"""Executor benchmark: dispatch overhead per op and an MLP training step vs plain numpy.

Prints ONE JSON object.  Figures:

* ``dispatch``: a net of 10,000 tiny ``Scale`` ops on a [1] float blob (in place, so a chain)
  for each executor: total µs/op, the kernel alone µs/op, and the difference (overhead).
  ``dag_independent`` runs 10,000 independent ops, so the DAG executor's scheduling is on
  the critical path.
* ``mlp``: one training step (batch 256, 784-1024-1024-10, FC/Relu/SoftmaxWithLoss, gradients
  from AddGradientOperators, MomentumSGDUpdate) with the simple and the dag executor vs the
  same math hand-written in numpy in the same process, timed in turn in every round.
  ``*_ratio`` compares medians with numpy computing the same gradients as Caffe2 (including
  the first FC's data gradient, which FCGradient always computes; target <= 1.05),
  ``*_ratio_no_data_grad`` with numpy skipping it (target <= 1.2).  ``same_math_as_numpy``
  checks that one dpgraph step gives the parameters one numpy step gives.  ``*_cpu_ratio*``
  are the same ratios of process CPU time (steadier than wall time when other processes
  load the machine).

``machine`` records the load around the run (1-minute load average and, where the kernel
reports it, the share of time runnable threads waited for a CPU): on a shared 2-core machine
ratios from a loaded run swing by tens of percent, so compare runs made at low load.

Run: ``python bench/executor.py [--ops N] [--steps K] [--blas-threads T]``.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _cpu_time(fn: Any) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call; CPU time is steadier on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


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


def numpy_step(state: dict[str, np.ndarray], x: np.ndarray, label: np.ndarray,
               data_grad: bool = True) -> float:
    """The same training step hand-written in numpy: forward, softmax loss, backward and an
    in-place momentum update.  ``data_grad`` also computes d loss / d data (Caffe2's
    FCGradient always does, since the first FC's input could need it)."""
    layers = len(SIZES) - 1
    acts = [x]
    for i in range(layers):
        h = acts[-1] @ state[f"w{i}"].T
        h += state[f"b{i}"]
        acts.append(np.maximum(h, 0) if i < layers - 1 else h)
    logits = acts[-1]
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    rows = np.arange(BATCH)
    loss = -np.mean(np.log(np.maximum(prob[rows, label], 1e-20)))
    grad = prob
    grad[rows, label] -= 1
    grad /= BATCH
    for i in reversed(range(layers)):
        if i < layers - 1:
            grad = grad * (acts[i + 1] > 0)
        gw, gb = grad.T @ acts[i], grad.sum(axis=0)
        if i > 0 or data_grad:
            grad = grad @ state[f"w{i}"]
        for name, g in ((f"w{i}", gw), (f"b{i}", gb)):
            m = state[f"{name}_m"]
            m *= MOMENTUM
            m += LR * g
            state[name] -= m
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
    """Step times; the numpy baselines and each executor are timed in turn within every
    round (in a rotating order) so that load from other processes and the cache state left
    by the previous step affect them alike.  Ratios are of medians."""
    rng = np.random.default_rng(0)
    params = _params(rng)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    label = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    state = {**{k: v.copy() for k, v in params.items()},
             **{f"{k}_m": np.zeros_like(v) for k, v in params.items()}}
    baselines = {"numpy": lambda: numpy_step(state, x, label, data_grad=True),
                 "numpy_no_data_grad": lambda: numpy_step(state, x, label, data_grad=False)}
    runs = {t: _mlp_workspace(t, params, x, label) for t in ("simple", "dag")}
    same_math = _same_math(params, x, label, runs["simple"][0])
    for fn in baselines.values():
        fn()
    steps = {**baselines,
             **{t: (lambda w=ws, n=net: w.run_net(n)) for t, (ws, net) in runs.items()}}
    times: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    order = list(steps)
    for round_ in range(iters):  # the order rotates, so no variant always follows another
        for key in order[round_ % len(order):] + order[:round_ % len(order)]:
            wall, used = _cpu_time(steps[key])
            times[key].append(wall)
            cpu[key].append(used)
    same = np.array_equal(runs["simple"][0].fetch_blob("w0"), runs["dag"][0].fetch_blob("w0"))
    result: dict[str, Any] = {"batch": BATCH, "sizes": list(SIZES), "steps": iters,
                              "simple_equals_dag": bool(same), "same_math_as_numpy": same_math}
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for key in times:
        result[f"{key}_median_ms"] = round(median[key], 3)
        result[f"{key}_min_ms"] = round(min(times[key]) * 1e3, 3)
    cpu_median = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
    for net_type in runs:
        for suffix, base in (("", "numpy"), ("_no_data_grad", "numpy_no_data_grad")):
            result[f"{net_type}_ratio{suffix}"] = round(median[net_type] / median[base], 3)
            result[f"{net_type}_cpu_ratio{suffix}"] = round(
                cpu_median[net_type] / cpu_median[base], 3)
    for ws, _ in runs.values():
        ws.reset()
    return result


def _same_math(params: dict[str, np.ndarray], x: np.ndarray, label: np.ndarray,
               ws: Workspace) -> bool:
    """After the warm-up step, dpgraph's parameters equal one numpy step's (float32
    tolerance): the baseline computes what the net computes."""
    state = {**{k: v.copy() for k, v in params.items()},
             **{f"{k}_m": np.zeros_like(v) for k, v in params.items()}}
    numpy_step(state, x, label)
    return all(np.allclose(ws.fetch_blob(k), state[k], rtol=1e-4, atol=1e-6) for k in params)


def _limit_blas_threads(threads: int) -> Any:
    """A context limiting BLAS threads (threadpoolctl), or ``None`` when not asked/available."""
    if threads <= 0:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads, user_api="blas")


def machine_load() -> dict[str, Any]:
    """The 1-minute load average, the CPU count and the CPU pressure (``some avg10``, % of
    time some runnable thread waited for a CPU; absent where /proc/pressure is missing)."""
    result: dict[str, Any] = {"cpus": os.cpu_count(),
                              "loadavg_1min": round(os.getloadavg()[0], 2)}
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as handle:
            fields = dict(item.split("=") for item in handle.readline().split()[1:])
        result["cpu_pressure_avg10"] = float(fields["avg10"])
    except (OSError, KeyError, ValueError):
        pass
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blas-threads", type=int, default=0,
                        help="also time the MLP with BLAS limited to N threads (threadpoolctl): "
                             "steadier figures on a shared machine; 0 = only the default")
    args = parser.parse_args()
    before = machine_load()
    report: dict[str, Any] = {"benchmark": "executor",
                              "dispatch": dispatch(args.ops, args.repeats),
                              "mlp": mlp(args.steps)}
    limit = _limit_blas_threads(args.blas_threads)
    if limit is not None:
        with limit:
            report[f"mlp_blas_threads_{args.blas_threads}"] = mlp(args.steps)
    report["targets"] = {"simple_us_per_op": 15, "mlp_ratio": 1.05,
                         "mlp_ratio_no_data_grad": 1.2}
    report["machine"] = {"before": before, "after": machine_load()}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
