"""Helpers the benchmark scripts share (they run as ``python bench/<name>.py``, so this
module is importable as ``_bench_util``)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Median wall-clock seconds of ``reps`` calls of ``fn`` (the same count every time)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one_thread_per_process() -> None:
    """Ranks inherit this: one BLAS/OpenMP thread each, so processes do not oversubscribe
    the cores (the executor's own threads still run independent ops side by side)."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
