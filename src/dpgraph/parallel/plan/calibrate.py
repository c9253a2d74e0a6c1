"""Calibrate the cost model by measuring: collectives on a common world, local reductions
and the compute speed of this machine.

:func:`probe_world` runs on every rank of an existing common world at once and agrees on one
result (the timings are averaged with the world itself), so every rank derives the same
bucket sizes from it.  It measures what a training step sees: collectives issued back to
back without a barrier (so a rank's time includes waiting for a later peer, as after a
backward pass), the *median* of the repeats (not the best: a step pays the typical cost),
over sizes from 4 KiB to 4 MiB (the latency-bound small buckets and the gradient and bucket
sizes of a step); the small sizes set ``alpha`` and the larger ones ``beta`` (:func:`fit`).
It also measures the contention term: the CPU time the transport's threads burn while an
all-reduce runs beside a stretch of compute (a small and a bucket-sized one), of which
:func:`contention_share` comes out of the compute (all of it when the ranks of a host compute
on every core, as on loopback).  :func:`calibrate` starts ``processes`` local ranks over Gloo
on loopback and returns a :class:`CostModel` (``dpgraph plan --calibrate PATH`` saves it).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpgraph.parallel.plan.cost_model import DEFAULTS, AlphaBeta, CostModel

PROBE_BYTES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20)
PROBE_REPEATS = 9
CONTENTION_BYTES = (4 << 10, 2 << 20)


def _best_time(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _typical_time(fn: Any, repeats: int) -> float:
    """Median wall time of ``fn`` (a step pays the typical cost, not the best)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


SMALL_BYTES = 256 << 10


def fit(sizes: Sequence[float], times: Sequence[float], steps: float,
        volume: float) -> AlphaBeta:
    """``t = steps * alpha + volume * n * beta`` (both kept >= 0) in two stages, so that
    neither term drowns the other: an anchor, the latency-bound size (<= 256 KiB; the smallest
    when there are none) of median time, then ``beta`` by least
    squares of what the other sizes take beyond the anchor, and ``alpha`` from the anchor."""
    if steps <= 0 or volume <= 0:
        return AlphaBeta(0.0, 0.0)  # one rank: nothing goes over the wire
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    small = n <= SMALL_BYTES
    if not small.any():
        small = n == n.min()
    candidates = np.flatnonzero(small)
    middle = candidates[np.argsort(t[candidates])[(len(candidates) - 1) // 2]]
    anchor_n, anchor_t = float(n[middle]), float(t[middle])  # the median time, its size
    extra, more = t - anchor_t, volume * (n - anchor_n)
    beta = (max(float(np.dot(more, extra) / np.dot(more, more)), 0.0)
            if np.dot(more, more) > 0 else 0.0)
    if beta == 0.0:  # the large sizes were no slower (noise): their mean time per byte
        beta = float(t[n.argmax()]) / (volume * float(n.max()))
    alpha = max(anchor_t - volume * anchor_n * beta, 0.0) / steps
    return AlphaBeta(alpha, beta)


def _matmul_chunk(seconds: float = 0.015) -> Callable[[], None]:
    """About ``seconds`` of float32 matrix products (the backward pass's kind of work)."""
    a = np.ones((192, 192), np.float32)
    once = _best_time(lambda: a @ a, 3)
    count = max(1, int(seconds / max(once, 1e-6)))

    def compute() -> None:
        for _ in range(count):
            a @ a
    return compute


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def contention_share(local_ranks: int, cpus: int | None = None) -> float:
    """The share of the transport's CPU time that comes out of the overlapped compute when
    ``local_ranks`` ranks (one compute thread each) share this host's ``cpus``: 0 with a
    free core per rank for the transport, 1 with none free, linear in between."""
    cpus = _usable_cpus() if cpus is None else cpus
    free = max(cpus - local_ranks, 0)
    return min(max(1.0 - free / max(local_ranks, 1), 0.0), 1.0)


def probe_contention(world: Any, sizes: Sequence[int] = CONTENTION_BYTES,
                     repeats: int = PROBE_REPEATS,
                     compute: Callable[[], None] | None = None) -> list[float]:
    """Per size: the CPU time the transport burns (every thread of this process but the
    computing one, less what they burn during ``compute`` alone) while one all-reduce of
    that size runs beside ``compute`` (default: ~15 ms of matrix products), as a gradient's
    all-reduce overlaps the backward pass; medians over ``repeats``.  CPU time, unlike the
    compute's slowdown, hardly depends on what else the machine runs.

    Every rank must call this at the same point (it issues collectives on ``world``)."""
    compute = compute or _matmul_chunk()
    burnt = []
    for nbytes in sizes:
        buffer = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        beside, baseline = [], []
        for _ in range(repeats):
            process, own = time.process_time(), time.thread_time()
            compute()  # what the process's other threads burn anyway
            baseline.append((time.process_time() - process) - (time.thread_time() - own))
            failures: list[BaseException] = []
            thread = threading.Thread(target=_allreduce_into, args=(world, buffer, failures),
                                      daemon=True)
            process, own = time.process_time(), time.thread_time()
            thread.start()
            compute()
            thread.join()
            beside.append((time.process_time() - process) - (time.thread_time() - own))
            if failures:
                raise failures[0]
        burnt.append(max(float(np.median(beside) - np.median(baseline)), 0.0))
    return burnt


def _allreduce_into(world: Any, buffer: np.ndarray, failures: list[BaseException]) -> None:
    """One all-reduce on a helper thread; its failure is kept for the caller to raise."""
    try:
        world.allreduce([buffer])
    except BaseException as error:  # noqa: BLE001  (re-raised in the probing thread)
        failures.append(error)


def probe_world(world: Any, sizes: Sequence[int] = PROBE_BYTES,
                repeats: int = PROBE_REPEATS, local_ranks: int = 1,
                compute: Callable[[], None] | None = None) -> AlphaBeta:
    """Alpha-beta figures of ``world`` (a collective backend), identical on every rank:
    median times of back-to-back all-reduces, and the contention term: the transport's CPU
    time beside compute (:func:`probe_contention`) times :func:`contention_share` for
    ``local_ranks`` ranks of the world computing on this host's cores (0 for none).

    Every rank must call this at the same point (it issues collectives on ``world``).
    """
    p = world.size
    walls = []
    for nbytes in sizes:
        buffer = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        world.allreduce([buffer])  # warm the connection and the buffer
        walls.append(_typical_time(lambda b=buffer: world.allreduce([b]), repeats))
    # the ranks agree on the contention share (their mean) before branching on it, so all
    # of them run the same collectives even where their hosts' core counts differ
    shares = np.array([contention_share(local_ranks) if local_ranks > 0 else 0.0])
    world.allreduce([shares])
    share = float(shares[0]) / p
    burnt = probe_contention(world, CONTENTION_BYTES, repeats, compute) if share > 0 else []
    agreed = np.array(walls + [share * b for b in burnt], dtype=np.float64)
    world.allreduce([agreed])
    agreed /= p
    steps, volume = 2 * (p - 1), 2 * (p - 1) / p
    figures = fit(list(sizes), list(agreed[:len(sizes)]), steps, volume)
    if not np.any(agreed[len(sizes):] > 0):
        return figures
    cpu = fit(list(CONTENTION_BYTES), list(agreed[len(sizes):]), steps, volume)
    return AlphaBeta(figures.alpha, figures.beta, cpu.alpha, cpu.beta)


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
        figures = probe_world(world, local_ranks=size)
    finally:
        world.close()
    if rank == 0:
        queue.put(figures)


def calibrate(processes: int = 2, timeout: float = 120.0) -> CostModel:
    """Measure Gloo over ``processes`` local ranks (their contention term assumes they
    compute on this host's cores, one thread each), local reductions and compute speed."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="dpgraph-calibrate-") as tmp:
        path = str(Path(tmp) / "store")
        procs = [context.Process(target=_rank_main, args=(r, processes, path, queue),
                                 daemon=True) for r in range(processes)]
        for proc in procs:
            proc.start()
        figures = queue.get(timeout=timeout)
        for proc in procs:
            proc.join(timeout)
    backends = {**DEFAULTS, "gloo": figures, "local": probe_local()}
    return CostModel(backends, probe_flops(), f"calibrated ({processes} processes)")
