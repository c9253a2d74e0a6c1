"""Benchmark: dpgraph Conv / ConvGradient kernels against torch.nn.functional.conv2d (CPU).

Prints one JSON object: best-of-N milliseconds of forward and backward (dW, db, dX) for each,
and the ratios dpgraph / torch.  Default problem: X 32x64x56x56, 64 filters 3x3, pad 1.

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


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``fn`` in milliseconds (robust to other load), after a warm-up."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples)


def bench_dpgraph(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: np.ndarray, order: str,
                  repeats: int) -> dict[str, float]:
    args = dict(kernel=3, pad=1, stride=1, order=order)
    fwd = make_op("Conv", ["X", "W", "b"], ["Y"], **args)
    bwd = make_op("ConvGradient", ["X", "W", "dY"], ["dW", "db", "dX"], **args)
    if order == "NHWC":
        x, w, dy = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (x, w, dy))
    return {"fwd_ms": timed(lambda: run_op(fwd, [x, w, b]), repeats),
            "bwd_ms": timed(lambda: run_op(bwd, [x, w, dy]), repeats)}


def bench_torch(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: np.ndarray,
                repeats: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(w).requires_grad_()
    bt = torch.from_numpy(b).requires_grad_()
    dyt = torch.from_numpy(dy)
    with torch.no_grad():
        fwd = timed(lambda: F.conv2d(xt, wt, bt, padding=1), repeats)

    def backward() -> None:
        y = F.conv2d(xt, wt, bt, padding=1)
        start = time.perf_counter()
        torch.autograd.grad(y, (xt, wt, bt), dyt)
        times.append((time.perf_counter() - start) * 1e3)

    times: list[float] = []
    for _ in range(repeats + 1):
        backward()
    return {"fwd_ms": fwd, "bwd_ms": min(times[1:]),
            "threads": torch.get_num_threads(), "version": torch.__version__}


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
    ours = bench_dpgraph(x, w, b, dy, opts.order, opts.repeats)
    result: dict[str, Any] = {
        "problem": f"X {n}x{c}x{s}x{s}, W {m}x{c}x3x3, pad 1, stride 1, float32",
        "order": opts.order, "dpgraph": ours,
    }
    try:
        theirs = bench_torch(x, w, b, dy, opts.repeats)
    except ImportError:
        result["torch"] = None
    else:
        result["torch"] = theirs
        result["ratio_fwd"] = round(ours["fwd_ms"] / theirs["fwd_ms"], 3)
        result["ratio_bwd"] = round(ours["bwd_ms"] / theirs["bwd_ms"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
