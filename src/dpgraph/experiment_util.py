"""Caffe2's ``experiment_util``: ``ModelTrainerLog``, the CSV-like training log of the
example trainers, and the ``ExternalLogger`` interface.

``ModelTrainerLog("resnext50", args)`` appends to ``<expname>_<YYYYmmdd_HHMMSS>.log`` in the
current directory: a ``# <args>`` line, then on the first ``log`` call a header of the keys
and one line of values per call::

    # Namespace(batch_size=32, ...)
    time_spent,cumulative_time_spent,input_count,cumulative_input_count,...,accuracy,loss
    12.5,12.5,3200,3200,100,256.0,0.1,[2.3]
"""

from __future__ import annotations

import abc
import datetime
import logging
import socket
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger("experiment_logger")
logger.setLevel(logging.INFO)


class ExternalLogger(metaclass=abc.ABCMeta):
    """Receives the runtime arguments once and every logged row (as an OrderedDict)."""

    @abc.abstractmethod
    def set_runtime_args(self, runtime_args: dict[str, Any]) -> None:
        """Called once with the run's arguments (plus experiment_id and hostname)."""

    @abc.abstractmethod
    def log(self, log_dict: OrderedDict[str, Any]) -> None:
        """Called with each row :meth:`ModelTrainerLog.log` writes."""


class ModelTrainerLog:
    """Time/throughput log of a training run, written to ``<experiment_id>.log``."""

    def __init__(self, expname: str, runtime_args: Any,
                 external_loggers: list[ExternalLogger] | None = None) -> None:
        now = datetime.datetime.fromtimestamp(time.time())
        self.experiment_id = "{}_{}".format(expname, now.strftime("%Y%m%d_%H%M%S"))
        self.filename = f"{self.experiment_id}.log"
        self.logstr("# " + str(runtime_args))
        self.headers: list[str] | None = None
        self.start_time = time.time()
        self.last_time = self.start_time
        self.last_input_count = 0
        self.external_loggers: list[ExternalLogger] = []
        if external_loggers is not None:
            self.external_loggers = external_loggers
            if not isinstance(runtime_args, dict):
                runtime_args = dict(vars(runtime_args))
            runtime_args["experiment_id"] = self.experiment_id
            runtime_args["hostname"] = socket.gethostname()
            for ext in self.external_loggers:
                ext.set_runtime_args(runtime_args)

    def logstr(self, str: Any) -> None:  # noqa: A002  (Caffe2's parameter name)
        """Append one line to the log file and log it at INFO."""
        with open(self.filename, "a") as f:
            f.write(str + "\n")
        logger.info(str)

    def log(self, input_count: int, batch_count: int, additional_values: dict[str, Any]
            ) -> None:
        """Write one row: timing and throughput since the last row, then
        ``additional_values`` in sorted key order (the header comes with the first row)."""
        now = time.time()
        delta_t = now - self.last_time
        delta_count = input_count - self.last_input_count
        self.last_time = now
        self.last_input_count = input_count
        logdict: OrderedDict[str, Any] = OrderedDict()
        logdict["time_spent"] = delta_t
        logdict["cumulative_time_spent"] = now - self.start_time
        logdict["input_count"] = delta_count
        logdict["cumulative_input_count"] = input_count
        logdict["cumulative_batch_count"] = batch_count
        logdict["inputs_per_sec"] = delta_count / delta_t if delta_t > 0 else 0.0
        for k in sorted(additional_values):
            logdict[k] = additional_values[k]
        if self.headers is None:
            self.headers = list(logdict)
            self.logstr(",".join(self.headers))
        self.logstr(",".join(str(v) for v in logdict.values()))
        for ext in self.external_loggers:
            try:
                ext.log(logdict)
            except Exception as e:  # an external logger must never stop training
                logger.warning(f"Failed to call ExternalLogger: {e}")


__all__ = ["ExternalLogger", "ModelTrainerLog"]
