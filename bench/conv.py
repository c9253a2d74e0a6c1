"""Benchmark: dpgraph Conv / ConvGradient kernels against torch.nn.functional.conv2d (CPU).

Prints one JSON object: best-of-N milliseconds of forward and backward (dW, db, dX) for
each library (run in alternating blocks) and the ratios dpgraph / torch.
Default problem: X 32x64x56x56, 64 filters 3x3, pad 1.

    python bench/conv.py [--batch 32] [--repeats 5] [--order NCHW]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ops.gradient_builder import make_op
from dpgraph.ops.testing import run_op


def once(fn: Callable[[], Any]) -> float:
    """Wall time of one call of ``fn`` in milliseconds."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def dpgraph_steps(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: np.ndarray,
                  order: str) -> dict[str, Callable[[], Any]]:
    args = dict(kernel=3, pad=1, stride=1, order=order)
    fwd = make_op("Conv", ["X", "W", "b"], ["Y"], **args)
    bwd = make_op("ConvGradient", ["X", "W", "dY"], ["dW", "db", "dX"], **args)
    if order == "NHWC":
        x, w, dy = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (x, w, dy))
    return {"fwd": lambda: run_op(fwd, [x, w, b]), "bwd": lambda: run_op(bwd, [x, w, dy])}


def torch_steps(x: np.ndarray, w: np.ndarray, b: np.ndarray,
                dy: np.ndarray) -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn.functional as F

    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    bt = torch.from_numpy(b).requires_grad_()
    dyt = torch.from_numpy(dy)
    graph: dict[str, Any] = {}

    def forward() -> None:
        with torch.no_grad():
            F.conv2d(xt, wt, bt, padding=1)

    def backward() -> None:  # the forward graph is built outside the timed call
        torch.autograd.grad(graph.pop("y"), (xt, wt, bt), dyt)

    def prepare() -> None:
        graph["y"] = F.conv2d(xt, wt, bt, padding=1)

    return {"fwd": forward, "bwd": backward, "prepare": prepare}


def measure(ours: dict[str, Callable[[], Any]], theirs: dict[str, Callable[[], Any]] | None,
            repeats: int, rounds: int = 2) -> dict[str, dict[str, float]]:
    """Best-of-N milliseconds per library and step.

    Each library runs in blocks (warm-up, then ``repeats`` timed calls) and the blocks
    alternate for ``rounds`` rounds, so both see similar machine load while neither runs
    right after the other's thread pool (OpenMP threads spin for a while after a call).
    """
    libs = {"dpgraph": ours} | ({"torch": theirs} if theirs is not None else {})
    best: dict[str, dict[str, float]] = {lib: {} for lib in libs}
    for _ in range(rounds):
        for lib, steps in libs.items():
            for step in ("fwd", "bwd"):
                key = f"{step}_ms"
                for rep in range(repeats + 1):
                    if step == "bwd" and "prepare" in steps:
                        steps["prepare"]()
                    ms = once(steps[step])
                    if rep:
                        best[lib][key] = min(best[lib].get(key, ms), ms)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--filters", type=int, default=64)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--order", choices=["NCHW", "NHWC"], default="NCHW")
    opts = parser.parse_args()
    rng = np.random.default_rng(0)
    n, c, m, s = opts.batch, opts.channels, opts.filters, opts.size
    x = rng.standard_normal((n, c, s, s), dtype=np.float32)
    w = rng.standard_normal((m, c, 3, 3), dtype=np.float32) * 0.05
    b = rng.standard_normal(m, dtype=np.float32)
    dy = rng.standard_normal((n, m, s, s), dtype=np.float32)
    try:
        theirs = torch_steps(x, w, b, dy)
    except ImportError:
        theirs = None
    best = measure(dpgraph_steps(x, w, b, dy, opts.order), theirs, opts.repeats)
    result: dict[str, Any] = {
        "problem": f"X {n}x{c}x{s}x{s}, W {m}x{c}x3x3, pad 1, stride 1, float32",
        "order": opts.order, "repeats": opts.repeats, "dpgraph": best["dpgraph"],
        "torch": best["torch"] or None,
    }
    if theirs is not None:
        import torch

        result["torch_version"] = torch.__version__
        result["torch_threads"] = torch.get_num_threads()
        for step in ("fwd", "bwd"):
            ratio = best["dpgraph"][f"{step}_ms"] / best["torch"][f"{step}_ms"]
            result[f"ratio_{step}"] = round(ratio, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
