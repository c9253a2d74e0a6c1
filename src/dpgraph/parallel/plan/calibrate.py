"""Calibrate the cost model by measuring: collectives on a common world, local reductions
and the compute speed of this machine.

:func:`probe_world` runs on every rank of an existing common world at once and agrees on one
result (the timings are averaged with the world itself), so every rank derives the same
bucket sizes from it.  :func:`calibrate` starts ``processes`` local ranks over Gloo on
loopback and returns a :class:`CostModel` (``dpgraph plan --calibrate PATH`` saves it).
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpgraph.parallel.plan.cost_model import DEFAULTS, AlphaBeta, CostModel

PROBE_BYTES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)


def _best_time(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def fit(sizes: Sequence[float], times: Sequence[float], steps: float,
        volume: float) -> AlphaBeta:
    """Least squares of ``t = steps * alpha + volume * n * beta`` (both kept >= 0)."""
    a = np.array([[steps, volume * n] for n in sizes], dtype=np.float64)
    solution, *_ = np.linalg.lstsq(a, np.asarray(times, dtype=np.float64), rcond=None)
    alpha, beta = (max(float(v), 0.0) for v in solution)
    if beta == 0.0:
        beta = float(times[-1]) / (volume * sizes[-1])
    return AlphaBeta(alpha, beta)


def probe_world(world: Any, sizes: Sequence[int] = PROBE_BYTES, repeats: int = 5) -> AlphaBeta:
    """Alpha-beta figures of ``world`` (a collective backend), identical on every rank.

    Every rank must call this at the same point (it issues collectives on ``world``).
    """
    p = world.size
    times = []
    for nbytes in sizes:
        buffer = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        world.allreduce([buffer])  # warm the connection and the buffer
        times.append(_best_time(lambda b=buffer: world.allreduce([b]), repeats))
    agreed = np.array(times, dtype=np.float64)
    world.allreduce([agreed])
    agreed /= p
    return fit(list(sizes), list(agreed), 2 * (p - 1), 2 * (p - 1) / p)


def probe_local(sizes: Sequence[int] = PROBE_BYTES, repeats: int = 5) -> AlphaBeta:
    """Local two-device reduction as Parallelize emits it (``Sum`` into copy 0, ``Copy`` to
    copy 1), run through a workspace so the executor's per-op cost is in ``alpha``."""
    from dpgraph.proto import caffe2_pb2
    from dpgraph.runtime.workspace import Workspace

    workspace = Workspace("calibrate_local")
    net = caffe2_pb2.NetDef(name="local_reduce")
    net.op.add(type="Sum", input=["a", "b"], output=["a"])
    net.op.add(type="Copy", input=["a"], output=["b"])
    workspace.create_net(net)
    times = []
    for nbytes in sizes:
        workspace.set_blob("a", np.ones(max(nbytes // 4, 1), np.float32))
        workspace.set_blob("b", np.ones(max(nbytes // 4, 1), np.float32))
        times.append(_best_time(lambda: workspace.run_net("local_reduce"), repeats))
    return fit(list(sizes), times, 2, 2)


def probe_flops(n: int = 384, repeats: int = 3) -> float:
    """FLOP/s of a float32 matrix product (the kernels' dominant work)."""
    a = np.ones((n, n), np.float32)
    return 2.0 * n ** 3 / _best_time(lambda: a @ a, repeats)


def _rank_main(rank: int, size: int, path: str, queue: Any) -> None:
    from dpgraph.collectives.registry import create_backend
    from dpgraph.collectives.rendezvous import file_store

    world = create_backend("gloo", store=file_store(path, "calibrate"), rank=rank, size=size,
                           world="calibrate", timeout=60.0)
    try:
        figures = probe_world(world)
    finally:
        world.close()
    if rank == 0:
        queue.put((figures.alpha, figures.beta))


def calibrate(processes: int = 2, timeout: float = 120.0) -> CostModel:
    """Measure Gloo over ``processes`` local ranks, local reductions and compute speed."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="dpgraph-calibrate-") as tmp:
        path = str(Path(tmp) / "store")
        procs = [context.Process(target=_rank_main, args=(r, processes, path, queue),
                                 daemon=True) for r in range(processes)]
        for proc in procs:
            proc.start()
        alpha, beta = queue.get(timeout=timeout)
        for proc in procs:
            proc.join(timeout)
    backends = {**DEFAULTS, "gloo": AlphaBeta(alpha, beta), "local": probe_local()}
    return CostModel(backends, probe_flops(), f"calibrated ({processes} processes)")
