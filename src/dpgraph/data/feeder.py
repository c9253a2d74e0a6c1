"""Caffe2's ``data_workers``: Python fetcher threads feed a net through blobs queues.

``init_data_input_workers(net, blobs, fetch_fun, batch_size, ...)`` creates one
``CreateBlobsQueue`` (capacity 4) per input blob in the current workspace, adds
``DequeueBlobs`` ops to ``net``, and starts (on ``start()``) ``num_worker_threads`` fetchers
calling ``fetch_fun(worker_id, batch_size)`` plus one enqueuer that rebatches their chunks
to ``batch_size`` rows and enqueues them.  A fetcher that raises stops its coordinator and
closes the queues, so the training thread's ``RunNet`` raises a
:class:`~dpgraph.errors.DataInputError` naming the failure once the queued batches are used.
"""

from __future__ import annotations

import logging
import queue as pyqueue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.data.workers import (
    LOG_INT_SECS,
    GlobalWorkerCoordinator,
    Metrics,
    State,
    Worker,
    WorkerCoordinator,
    run_worker,
)
from dpgraph.errors import DataInputError
from dpgraph.ir import scope
from dpgraph.ir.blob import ScopedBlobReference
from dpgraph.ir.device import DeviceOption
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api

logger = logging.getLogger("dpgraph.data_workers")


def get_worker_ids(num_workers: int) -> list[int]:
    """``num_workers`` fresh ids from the global sequence."""
    return [global_coordinator.get_new_worker_id() for _ in range(num_workers)]


def _check_worker_arguments(input_blob_names: list[Any], fetch_fun: Any, batch_size: Any,
                            num_worker_threads: Any) -> None:
    """Refuse arguments the workers could not run with, before any thread starts."""
    if not callable(fetch_fun):
        raise DataInputError(f"init_data_input_workers: fetch_fun must be callable "
                             f"(fetch_fun(worker_id, batch_size) -> list of arrays), got "
                             f"{type(fetch_fun).__name__}.")
    if not list(input_blob_names):
        raise DataInputError("init_data_input_workers: input_blob_names is empty; name the "
                             "blobs the fetcher fills (e.g. ['data', 'label']).")
    for what, value in (("batch_size", batch_size), ("num_worker_threads", num_worker_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataInputError(f"init_data_input_workers: {what} must be an int >= 1, got "
                                 f"{value!r}.")


def init_data_input_workers(net: Any, input_blob_names: list[Any], fetch_fun: Callable,
                            batch_size: int, num_worker_threads: int = 2,
                            input_source_name: str = "train", max_buffered_batches: int = 800,
                            init_fun: Callable | None = None,
                            external_loggers: list[Any] | None = None,
                            dont_rebatch: bool = False, batch_columns: list[int] | None = None,
                            timeout: float = 600) -> GlobalCoordinator:
    """Fetcher threads feeding ``input_blob_names`` of ``net``; returns the coordinator
    (``start()``, ``stop()``, ``stop_coordinator(name)``, ``reset_data_input(...)``)."""
    _check_worker_arguments(input_blob_names, fetch_fun, batch_size, num_worker_threads)
    device_option = scope.CurrentDeviceScope() or DeviceOption(caffe2_pb2.PROTO_CPU)
    metrics = Metrics(external_loggers)
    feeder = BatchFeeder(net, input_blob_names, batch_size, device_option,
                         scope.CurrentNameScope(), input_source_name,
                         global_coordinator.get_queue(input_source_name, max_buffered_batches),
                         metrics, dont_rebatch, batch_columns, timeout=timeout)
    worker_ids = get_worker_ids(num_worker_threads)
    coordinator = WorkerCoordinator(input_source_name, worker_ids, init_fun, feeder)
    feeder._coordinator = coordinator
    workers = [threading.Thread(target=run_worker, name=f"data_workers fetcher id {worker_id}",
                                args=[coordinator, DataWorker(coordinator, worker_id,
                                                              fetch_fun, metrics, batch_size,
                                                              feeder)])
               for worker_id in worker_ids]
    workers.append(threading.Thread(target=enqueuer,
                                    name=f"Enqueuer {input_source_name} "
                                         f"{scope.CurrentNameScope()}",
                                    args=[coordinator, feeder]))
    coordinator._workers = workers
    global_coordinator.add(coordinator)
    return global_coordinator


class BatchFeeder(State):
    """Creates the queues and DequeueBlobs ops, then moves fetched chunks into the queues."""

    def __init__(self, net: Any, input_blob_names: list[Any], batch_size: int,
                 device_option: caffe2_pb2.DeviceOption, namescope: str,
                 input_source_name: str, queue: pyqueue.Queue, metrics: Metrics,
                 dont_rebatch: bool, batch_columns: list[int] | None,
                 timeout: float = 600) -> None:
        self._counter = 0
        self._input_blob_names = [str(b) for b in input_blob_names]
        self._batch_size = batch_size
        self._internal_queue = queue
        self._queues: list[Any] = []
        self._device_option = device_option
        self._namescope = namescope
        self._timeout = timeout
        self._input_source_name = input_source_name
        self._c2_queue_capacity = 4
        self._workspace = api.current()
        self._coordinator: WorkerCoordinator | None = None
        self._create_caffe2_queues(net)
        self._create_caffe2_ops(net)
        self._inputs = 0
        self._prev_seconds = 0.0
        self._last_warning = time.time()
        self._dont_rebatch = dont_rebatch
        self._init_scratch()
        self._metrics = metrics
        self._batch_columns = batch_columns if batch_columns is not None \
            else [0] * len(self._input_blob_names)
        if len(self._batch_columns) != len(self._input_blob_names):
            raise DataInputError(f"data_workers {input_source_name!r}: batch_columns has "
                                 f"{len(self._batch_columns)} entries for "
                                 f"{len(self._input_blob_names)} input blobs.")

    # --- State ------------------------------------------------------------------------
    def start(self) -> None:
        self._inputs = 0
        self._prev_seconds = time.time()

    def stop(self) -> None:
        error = self._coordinator.error if self._coordinator is not None else None
        for queue in self._queues:  # what CloseBlobsQueue does, plus the failure reason
            value = self._workspace.get_blob_or_none(str(queue))
            if hasattr(value, "close"):
                value.close(error)
        self._log_inputs_per_interval(0, force=True)

    def cleanup(self) -> None:
        blobs = [b for b in list(self._scratch_blob.values()) +
                 list(self._scratch_status.values()) if self._workspace.has_blob(b)]
        if blobs:
            self._run(CreateOperator("Free", blobs, blobs))

    # --- construction -------------------------------------------------------------------
    def _run(self, op: caffe2_pb2.OperatorDef) -> None:
        op.device_option.CopyFrom(self._device_option)
        self._workspace.run_operators_once([op])

    def _create_caffe2_queues(self, net: Any) -> None:
        for blob_name in self._input_blob_names:
            queue_name = blob_name + "_c2queue_" + self._input_source_name
            with scope.DeviceScope(self._device_option):
                op = CreateOperator("CreateBlobsQueue", [], [queue_name], num_blobs=1,
                                    capacity=self._c2_queue_capacity)
            self._workspace.run_operators_once([op])
            self._queues.append(ScopedBlobReference(queue_name))

    def _create_caffe2_ops(self, net: Any) -> None:
        for queue, blob_name in zip(self._queues, self._input_blob_names):
            net.DequeueBlobs(queue, blob_name, timeout_secs=float(self._timeout))

    def _init_scratch(self) -> None:
        self._scratch_blob: dict[str, str] = {}
        self._scratch_status: dict[str, str] = {}
        for blob_name in self._input_blob_names:
            scratch = self._namescope + blob_name + "_scratch_" + self._input_source_name
            self._scratch_blob[blob_name] = scratch
            self._scratch_status[blob_name] = scratch + "_status"
        for name in list(self._scratch_blob.values()) + list(self._scratch_status.values()):
            self._workspace.feed_blob(name, np.array([]).astype(np.float32),
                                      self._device_option)

    # --- fetcher side -------------------------------------------------------------------
    def _validate_chunk(self, chunk: Any) -> None:
        where = f"data_workers {self._input_source_name!r}"
        if not isinstance(chunk, (list, tuple)) or len(chunk) != len(self._input_blob_names):
            raise DataInputError(
                f"{where}: the fetcher must return a list of {len(self._input_blob_names)} "
                f"numpy arrays (one per blob {self._input_blob_names}), got "
                f"{type(chunk).__name__}.")
        for name, item in zip(self._input_blob_names, chunk):
            if not isinstance(item, np.ndarray):
                raise DataInputError(f"{where}: the fetcher returned a {type(item).__name__} "
                                     f"for blob {name!r}; return numpy arrays.")
        if self._dont_rebatch:
            return
        first = chunk[0].shape[self._batch_columns[0]]
        for name, item, column in zip(self._input_blob_names, chunk, self._batch_columns):
            if item.shape[column] != first:
                raise DataInputError(
                    f"{where}: blob {name!r} has {item.shape[column]} rows along its batch "
                    f"column {column}, the first blob {first}; every array of a chunk must "
                    "hold the same number of examples.")

    def put(self, chunk: Any, data_input_coordinator: WorkerCoordinator) -> None:
        """Queue one fetched chunk (blocking while the buffer is full)."""
        if chunk is None:
            logger.warning("Fetcher function returned None")
            return
        self._validate_chunk(chunk)
        while data_input_coordinator.is_active():
            try:
                if self._internal_queue.qsize() < 2 and \
                        time.time() - self._last_warning > LOG_INT_SECS:
                    logger.warning("Warning, data loading lagging behind: %s",
                                   self._input_source_name)
                    self._last_warning = time.time()
                self._counter += 1
                self._internal_queue.put(chunk, block=True, timeout=0.5)
                self._inputs += chunk[0].shape[0]
                return
            except pyqueue.Full:
                logger.debug("Queue full: stalling fetchers...")

    # --- enqueuer side ------------------------------------------------------------------
    def _enqueue_batch_direct(self, data_input_coordinator: WorkerCoordinator) -> None:
        chunk = self._get(data_input_coordinator)
        if chunk is not None and data_input_coordinator.is_active():
            for blob, queue, array in zip(self._input_blob_names, self._queues, chunk):
                self._enqueue(blob, queue, array)

    def _get(self, data_input_coordinator: WorkerCoordinator) -> Any:
        start = time.time()
        last_warning = start
        while data_input_coordinator.is_active():
            try:
                return self._internal_queue.get(block=True, timeout=0.5)
            except pyqueue.Empty:
                if time.time() - last_warning > 10.0:
                    logger.warning("** Data input is slow: (still) no data in %.0f secs.",
                                   time.time() - start)
                    last_warning = time.time()
        return None

    def _enqueue_batch(self, data_input_coordinator: WorkerCoordinator) -> None:
        """Collect chunks into one batch of ``batch_size`` rows and enqueue it."""
        if self._dont_rebatch:
            self._enqueue_batch_direct(data_input_coordinator)
            return
        column = self._batch_columns[0]
        batch: list[np.ndarray | None] = [None] * len(self._input_blob_names)
        while (batch[0] is None or batch[0].shape[column] < self._batch_size) and \
                data_input_coordinator.is_active():
            chunk = self._get(data_input_coordinator)
            if chunk is None:
                return
            for j, item in enumerate(chunk):
                so_far = batch[j]
                batch[j] = item.copy() if so_far is None else \
                    np.append(so_far, item, axis=self._batch_columns[j])
        if batch[0] is None or not data_input_coordinator.is_active():
            return
        arrays: list[np.ndarray] = [b for b in batch if b is not None]
        start = time.time()
        try:
            if arrays[0].shape[column] > self._batch_size:
                parts = [np.split(b, [self._batch_size], axis=c)
                         for b, c in zip(arrays, self._batch_columns)]
                arrays = [p[0] for p in parts]
                try:
                    self._internal_queue.put([p[1] for p in parts], block=False)
                except pyqueue.Full:
                    pass
            for blob, queue, array in zip(self._input_blob_names, self._queues, arrays):
                self._enqueue(blob, queue, array)
        finally:
            self._metrics.put_metric("enqueue_time", time.time() - start)
            self._log_inputs_per_interval(0)

    def _enqueue(self, blob_name: str, queue: Any, data_arr: np.ndarray) -> None:
        """Feed the scratch blob and run SafeEnqueueBlobs (blocks while the queue is full)."""
        scratch = self._scratch_blob[blob_name]
        status = self._scratch_status[blob_name]
        self._workspace.feed_blob(scratch, data_arr, self._device_option)
        self._run(CreateOperator("SafeEnqueueBlobs", [queue, scratch], [scratch, status]))

    def _log_inputs_per_interval(self, inputs: int, force: bool = False) -> None:
        self._inputs += inputs
        current = time.time()
        delta = current - self._prev_seconds
        if delta > LOG_INT_SECS or force:
            self._metrics.put_metric("inputs_per_sec", self._inputs / max(delta, 1e-9), False)
            self._metrics.put_metric("queue_size", self._internal_queue.qsize(), False)
            self._metrics.put_metric("time_elapsed", delta, False)
            self._metrics.log_metrics()
            self._metrics.reset_metrics()
            self._prev_seconds = current
            self._inputs = 0


class GlobalCoordinator(GlobalWorkerCoordinator):
    """data_workers' own coordinator: one buffer queue per input source."""

    def __init__(self) -> None:
        super().__init__()
        self._queues: dict[str, pyqueue.Queue] = {}

    def get_queue(self, queue_name: str, max_buffered_batches: int) -> pyqueue.Queue:
        if not isinstance(max_buffered_batches, int) or isinstance(max_buffered_batches, bool):
            raise DataInputError(f"max_buffered_batches must be an int, got "
                                 f"{max_buffered_batches!r}.")
        if queue_name not in self._queues:
            self._queues[queue_name] = pyqueue.Queue(maxsize=max_buffered_batches)
        return self._queues[queue_name]

    def reset_data_input(self, namescope: str, name: str, net: Any, batch_size: int) -> None:
        """Point the feeders of ``name`` in ``namescope`` at ``net`` with a new batch size."""
        for coordinator in self._coordinators:
            state = coordinator._state
            if coordinator._worker_name == name and state is not None and \
                    state._namescope == namescope:  # type: ignore[attr-defined]
                state._batch_size = batch_size  # type: ignore[attr-defined]
                state._create_caffe2_ops(net)  # type: ignore[attr-defined]


class DataWorker(Worker):
    """A fetcher thread: ``fetch_fun(worker_id, batch_size)`` then ``feeder.put``."""

    def __init__(self, coordinator: WorkerCoordinator, worker_id: int, worker_fun: Callable,
                 metrics: Metrics, batch_size: int, batch_feeder: BatchFeeder) -> None:
        super().__init__(coordinator, worker_id, worker_fun=worker_fun, metrics=metrics)
        self._batch_size = batch_size
        self._batch_feeder = batch_feeder

    def run(self) -> None:
        assert self._worker_fun is not None
        input_data = self._worker_fun(self._worker_id, self._batch_size)
        self._batch_feeder.put(input_data, self._coordinator)

    def finish(self) -> None:
        if self._metrics is not None:
            self._metrics.put_metric("fetcher_time", time.time() - self._start_time)


def enqueuer(coordinator: WorkerCoordinator, batch_feeder: BatchFeeder) -> None:
    """The enqueuer thread body."""
    while coordinator.is_active():
        try:
            batch_feeder._enqueue_batch(coordinator)
        except Exception as error:  # noqa: BLE001  (reported through the coordinator)
            if coordinator.is_active():
                Worker(coordinator, -1).handle_exception(error)


global_coordinator = GlobalCoordinator()
