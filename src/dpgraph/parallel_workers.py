"""Caffe2's ``parallel_workers`` module (the logic is in :mod:`dpgraph.data.workers`)."""

from dpgraph.data.workers import (
    LOG_INT_SECS,
    GlobalWorkerCoordinator,
    Metrics,
    State,
    Worker,
    WorkerCoordinator,
    global_coordinator,
    init_workers,
    run_worker,
)

__all__ = ["GlobalWorkerCoordinator", "LOG_INT_SECS", "Metrics", "State", "Worker",
           "WorkerCoordinator", "global_coordinator", "init_workers", "run_worker"]
