"""Allreduce benchmark: prints ONE JSON object.

* ``cpu``: the cpu backend summing 4 local device copies, against a numpy floor (the same
  three in-place adds on the same buffers, without the copies back to the other devices).
* ``gloo``: dpgraph's ``Allreduce`` op (CreateCommonWorld + a net run through the workspace)
  over 2 processes, against a raw ``torch.distributed.all_reduce`` of the same buffer in the
  same processes, measured in 8 rounds of the same number of calls, rotating which goes
  first; each method's time is its best round's median (robust to load from other
  processes).  ``noise_ratio_raw_vs_raw`` times raw Gloo against itself the same way.
  ``ratio`` = raw time / dpgraph time (1.0 = as fast as raw Gloo; the target is >= 0.9 at
  every size >= 1 MiB).

Usage: ``python bench/allreduce.py [--sizes 4096,1048576] [--min-time 0.2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _bench_util import median_seconds

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
TARGET = 0.9
ROUNDS = 8


def _repeat(fn: Callable[[], Any], min_time: float, max_reps: int = 2000) -> float:
    """Median seconds per call, calling at least 3 times and for about ``min_time``."""
    fn()  # warm-up
    times: list[float] = []
    total = 0.0
    while (len(times) < 3 or total < min_time) and len(times) < max_reps:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return statistics.median(times)


def bench_cpu(sizes: list[int], min_time: float, devices: int = 4) -> list[dict[str, Any]]:
    from dpgraph.collectives import create_backend

    world = create_backend("cpu", world="bench")
    rows = []
    for nbytes in sizes:
        copies = [np.zeros(nbytes // 4, np.float32) for _ in range(devices)]

        def floor(copies: list[np.ndarray] = copies) -> None:
            for other in copies[1:]:
                np.add(copies[0], other, out=copies[0])

        def floor_and_copies(copies: list[np.ndarray] = copies) -> None:
            floor(copies)
            for other in copies[1:]:
                np.copyto(other, copies[0])

        backend_s = _repeat(lambda copies=copies: world.allreduce(copies), min_time)
        floor_s = _repeat(floor, min_time)
        floor_copies_s = _repeat(floor_and_copies, min_time)
        rows.append({"bytes": nbytes, "backend_s": backend_s, "numpy_floor_s": floor_s,
                     "ratio": floor_s / backend_s,
                     "numpy_sum_and_copies_s": floor_copies_s,
                     "ratio_vs_sum_and_copies": floor_copies_s / backend_s})
    return rows


def _agree_reps(dist: Any, torch: Any, fn: Callable[[], Any], budget: float) -> int:
    """Calls per timing round: rank 0 calibrates, every rank uses its count (collectives must
    be issued the same number of times on every rank)."""
    per_call = median_seconds(fn, 3)
    reps = torch.tensor([max(3, min(1000, int(budget / max(per_call, 1e-6))))])
    dist.broadcast(reps, src=0)
    return int(reps.item())


def _gloo_rank(rank: int, path: str, sizes: list[int], min_time: float, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from dpgraph import core, workspace
    from dpgraph.runtime.api import current

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init = core.Net("init")
    init.FileStoreHandlerCreate([], "store", path=path, prefix="dpgraph")
    init.CreateCommonWorld("store", "cw", size=2, rank=rank, engine="GLOO", timeout_ms=120000)
    workspace.RunNetOnce(init)
    raw_store = dist.PrefixStore("raw", dist.FileStore(os.path.join(path, "raw.store"), -1))
    dist.init_process_group("gloo", store=raw_store, rank=rank, world_size=2)
    rows = []
    for nbytes in sizes:
        workspace.FeedBlob("buf", np.zeros(nbytes // 4, np.float32))  # zeros stay finite
        net = core.Net(f"allreduce_{nbytes}")
        net.Allreduce(["cw", "buf"], ["buf"], engine="GLOO")
        workspace.CreateNet(net)
        raw = torch.from_numpy(current().get_blob("buf"))  # the very same buffer
        name = net.Name()
        methods = {"dpgraph": lambda name=name: workspace.RunNet(name),
                   "raw": lambda raw=raw: dist.all_reduce(raw)}
        methods["raw_again"] = methods["raw"]  # an A/A pair: how noisy this machine is
        reps = _agree_reps(dist, torch, methods["raw"], min_time / ROUNDS / 3)
        times: dict[str, list[float]] = {key: [] for key in methods}
        order = list(methods)
        for round_ in range(ROUNDS):  # rotate who goes first: load drifts hit all alike
            for key in order[round_ % 3:] + order[:round_ % 3]:
                dist.barrier()  # both ranks start each block together: no skew is timed
                times[key].append(median_seconds(methods[key], reps))
        rows.append({"bytes": nbytes, "reps": reps * ROUNDS,
                     **{f"{key}_s": min(values) for key, values in times.items()}})
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def bench_gloo(sizes: list[int], min_time: float, timeout: float = 600) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as path:
        procs = [ctx.Process(target=_gloo_rank, args=(r, path, sizes, min_time, queue))
                 for r in range(2)]
        for proc in procs:
            proc.start()
        try:
            rows = queue.get(timeout=timeout)
        finally:
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
    for row in rows:
        row["ratio"] = row["raw_s"] / row["dpgraph_s"]
        row["noise_ratio_raw_vs_raw"] = row["raw_s"] / row["raw_again_s"]
        row["dpgraph_gbps"] = row["bytes"] / row["dpgraph_s"] / 1e9
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="message sizes in bytes, comma separated")
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="seconds to spend per size and method")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cpu = bench_cpu(sizes, args.min_time)
    gloo = bench_gloo(sizes, args.min_time)
    large = [row["ratio"] for row in gloo if row["bytes"] >= 1 << 20]
    print(json.dumps({
        "benchmark": "allreduce", "dtype": "float32",
        "cpu": {"devices": 4, "sizes": cpu},
        "gloo": {"processes": 2, "sizes": gloo, "target_ratio_ge_1MiB": TARGET,
                 "min_ratio_ge_1MiB": min(large) if large else None,
                 "meets_target": bool(large) and min(large) >= TARGET},
        "python": sys.version.split()[0],
    }))


if __name__ == "__main__":
    main()
