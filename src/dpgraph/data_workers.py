"""Caffe2's ``data_workers`` module (the logic is in :mod:`dpgraph.data.feeder`)."""

from dpgraph.data.feeder import (
    BatchFeeder,
    DataWorker,
    GlobalCoordinator,
    enqueuer,
    get_worker_ids,
    global_coordinator,
    init_data_input_workers,
)
from dpgraph.data.workers import (
    LOG_INT_SECS,
    GlobalWorkerCoordinator,
    Metrics,
    State,
    Worker,
    WorkerCoordinator,
    run_worker,
)

__all__ = ["BatchFeeder", "DataWorker", "GlobalCoordinator", "GlobalWorkerCoordinator",
           "LOG_INT_SECS", "Metrics", "State", "Worker", "WorkerCoordinator", "enqueuer",
           "get_worker_ids", "global_coordinator", "init_data_input_workers", "run_worker"]
