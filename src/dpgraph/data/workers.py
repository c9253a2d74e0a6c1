"""Caffe2's ``parallel_workers``: worker threads run a function in a loop until their
coordinator stops them.

``init_workers`` takes worker ids from a process-wide sequence, builds one
:class:`WorkerCoordinator` per call and returns the :data:`global_coordinator`, whose
``start()``/``stop()`` drive every coordinator.  An exception in a worker stops its
coordinator (and is kept in ``coordinator.error`` so the data layer can report it to the
training thread).  ``stop()`` joins every thread (5 s each) and returns whether all ended.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from dpgraph.ops.queue import cancel_blocking_waits, forget_cancelled

logger = logging.getLogger("dpgraph.parallel_workers")
LOG_INT_SECS = 60


class Metrics:
    """Named counters logged to ``external_loggers`` (objects with ``log(dict)``)."""

    def __init__(self, external_loggers: list[Any] | None) -> None:
        self._metrics: defaultdict[str, float] = defaultdict(int)
        self._external_loggers = external_loggers if external_loggers else []

    def reset_metrics(self) -> None:
        self._metrics = defaultdict(int)

    def log_metrics(self) -> None:
        if not self._external_loggers:
            return
        for external_logger in self._external_loggers:
            try:
                external_logger.log(self._metrics)
            except Exception as error:  # noqa: BLE001  (a logger never stops training)
                print(f"Failed to call ExternalLogger: {error}")

    def put_metric(self, key: str, value: float, count: bool = True) -> None:
        self._metrics[key] += value
        if count:
            self._metrics[key + "_count"] += 1


class State(ABC):
    """What a coordinator starts, stops and cleans up with its threads."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def cleanup(self) -> None: ...


class WorkerCoordinator:
    """The threads of one ``worker_name`` and the state they share."""

    def __init__(self, worker_name: str, worker_ids: list[int], init_fun: Callable | None,
                 state: State | None = None, shutdown_fun: Callable | None = None) -> None:
        self._active = True
        self._started = False
        self._workers: list[threading.Thread] = []
        self._worker_name = worker_name
        self._worker_ids = worker_ids
        self._init_fun = init_fun
        self._state = state
        self._shutdown_fun = shutdown_fun
        self.error: BaseException | None = None

    def is_active(self) -> bool:
        return self._active

    def init(self, global_coordinator: Any) -> None:
        if self._init_fun and not self._started:
            self._init_fun(self, global_coordinator)

    def _start(self) -> None:
        if self._started:
            return
        self._active = True
        self._started = True
        if self._state:
            self._state.start()
        for worker in self._workers:
            worker.daemon = True
            worker.start()

    def _stop(self, reason: str | None = None) -> None:
        self._active = False
        if reason is not None:
            logger.error("Data input failed due to an error: %s", reason)
        if self._shutdown_fun and self._started:
            self._shutdown_fun()
        if self._state:
            self._state.stop()
        self._started = False

    def _wait_finish(self, cleanup: Callable | None = None) -> bool:
        print(f"Wait for workers to die: {self._worker_name}")
        idents = [worker.ident for worker in self._workers]
        cancel_blocking_waits(idents)  # free workers blocked on a blobs queue
        for worker in self._workers:
            if worker != threading.current_thread() and worker.ident is not None:
                worker.join(5.0)
        success = not any(worker.is_alive() for worker in self._workers)
        if success:
            forget_cancelled(idents)
        if success and self._state:
            self._state.cleanup()
        print(f"All workers terminated: {success}")
        return success

    def get_worker_ids(self) -> list[int]:
        return self._worker_ids


class GlobalWorkerCoordinator:
    """Every coordinator of the process, and the worker-id sequence (never reset)."""

    def __init__(self) -> None:
        self._coordinators: list[WorkerCoordinator] = []
        self._fetcher_id_seq = 0
        self._worker_ids: list[int] = []
        self.register_shutdown_handler()

    def add(self, coordinator: WorkerCoordinator) -> None:
        self._coordinators.append(coordinator)

    def get_new_worker_id(self) -> int:
        worker_id = self._fetcher_id_seq
        self._worker_ids.append(worker_id)
        self._fetcher_id_seq += 1
        return worker_id

    def get_worker_ids(self) -> list[int]:
        return self._worker_ids

    def start(self) -> None:
        for coordinator in self._coordinators:
            coordinator.init(self)
        for coordinator in self._coordinators:
            coordinator._start()

    def stop(self) -> bool:
        """Stop every coordinator and join its threads; True when all ended."""
        all_success = True
        for coordinator in self._coordinators:
            coordinator._stop()
        for coordinator in self._coordinators:
            all_success = coordinator._wait_finish() and all_success
        self._coordinators = []
        return all_success

    def stop_coordinator(self, worker_name: str) -> bool:
        """Stop, join and remove the coordinators named ``worker_name``."""
        success = True
        for coordinator in self._coordinators:
            if coordinator._worker_name == worker_name:
                coordinator._stop()
                success = coordinator._wait_finish() and success
        self._coordinators = [c for c in self._coordinators if c._worker_name != worker_name]
        return success

    def register_shutdown_handler(self) -> None:
        atexit.register(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        """``stop()`` at interpreter exit; a failure there is logged, never raised."""
        try:
            self.stop()
        except Exception:  # noqa: BLE001
            logger.exception("Stopping the workers at exit failed")


class Worker:
    """One thread's job: call ``worker_fun(worker_id)``; an exception stops the coordinator."""

    def __init__(self, coordinator: WorkerCoordinator, worker_id: int,
                 worker_fun: Callable | None = None, metrics: Metrics | None = None) -> None:
        self._coordinator = coordinator
        self._worker_id = worker_id
        self._worker_fun = worker_fun
        self._metrics = metrics
        self._start_time = 0.0

    def start(self) -> None:
        self._start_time = time.time()

    def run(self) -> None:
        assert self._worker_fun is not None
        self._worker_fun(self._worker_id)

    def handle_exception(self, error: BaseException) -> None:
        traceback.print_exc()
        logging.exception("Exception in worker")
        if self._coordinator.error is None:
            self._coordinator.error = error
        self._coordinator._stop(f"Exception in worker {self._worker_id}: {error}")

    def finish(self) -> None:
        if self._metrics is not None:
            self._metrics.put_metric("worker_time", time.time() - self._start_time)
            self._metrics.log_metrics()


def run_worker(coordinator: WorkerCoordinator, worker: Worker) -> None:
    """The thread body: run the worker until the coordinator stops."""
    while coordinator.is_active():
        worker.start()
        try:
            worker.run()
        except Exception as error:  # noqa: BLE001  (reported through the coordinator)
            worker.handle_exception(error)
        finally:
            worker.finish()


def init_workers(worker_fun: Callable, num_worker_threads: int = 2, worker_name: str = "train",
                 init_fun: Callable | None = None, external_loggers: list[Any] | None = None,
                 shutdown_fun: Callable | None = None) -> GlobalWorkerCoordinator:
    """Threads running ``worker_fun(worker_id)`` in a loop; returns the global coordinator
    (call its ``start()`` and ``stop()``)."""
    metrics = Metrics(external_loggers)
    worker_ids = [global_coordinator.get_new_worker_id() for _ in range(num_worker_threads)]
    coordinator = WorkerCoordinator(worker_name, worker_ids, init_fun, shutdown_fun=shutdown_fun)
    workers = [threading.Thread(target=run_worker,
                                name=f"parallel_workers worker id {worker_id}",
                                args=[coordinator, Worker(coordinator, worker_id, worker_fun,
                                                          metrics)])
               for worker_id in worker_ids]
    coordinator._workers = workers
    global_coordinator.add(coordinator)
    return global_coordinator


global_coordinator = GlobalWorkerCoordinator()
