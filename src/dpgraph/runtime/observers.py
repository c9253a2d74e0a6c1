"""Net observers, as Caffe2's ``net.AddObserver(type)`` attaches them to a created net.

* ``TimeObserver``: ``average_time()``, the mean wall time of the net's runs in
  milliseconds, and ``average_time_children()``, the mean over the net's operators of their
  mean run time.
* ``RunCountObserver``: counts the net's operator runs and those of the ops they run in turn
  (a RecurrentNetwork's step net, a control-flow subnet), not those of other nets running at
  the same time; ``debug_info()`` says ``"This operator runs N times."``.

An observer belongs to one created net instance (``CreateNet`` again makes a new instance
without observers).  While no observer is attached anywhere, operators run with one empty
list check of overhead.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from dpgraph.errors import WorkspaceError
from dpgraph.ir.registry import NET_EXTENSIONS
from dpgraph.ops.observing import ACTIVE


class NetObserver:
    """Caffe2's ``ObserverBase<NetBase>``: told when its net and each operator run."""

    def __init__(self, ops: list[Any]) -> None:
        self._ops = {id(op) for op in ops}

    def net_started(self) -> None:
        """The observed net starts a run."""

    def net_finished(self, seconds: float) -> None:
        """The observed net finished a run that took ``seconds``."""

    def op_finished(self, op: Any, seconds: float) -> None:
        """One of the net's operators finished, or an op that one of them ran (a nested
        net's)."""

    def observes(self, op: Any) -> bool:
        return id(op) in self._ops

    def debug_info(self) -> str:
        return ""


class TimeObserver(NetObserver):
    def __init__(self, ops: list[Any]) -> None:
        super().__init__(ops)
        self._runs, self._total = 0, 0.0
        self._op_times: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
        self._num_ops = len(ops)

    def net_finished(self, seconds: float) -> None:
        self._runs += 1
        self._total += seconds

    def op_finished(self, op: Any, seconds: float) -> None:
        if self.observes(op):
            entry = self._op_times[id(op)]
            entry[0] += 1
            entry[1] += seconds

    def average_time(self) -> float:
        """Mean milliseconds per run of the net (0 before its first run)."""
        return 1000.0 * self._total / self._runs if self._runs else 0.0

    def average_time_children(self) -> float:
        """The mean over the net's operators of their mean milliseconds per run."""
        if not self._num_ops:
            return 0.0
        means = sum(total / count for count, total in self._op_times.values() if count)
        return 1000.0 * means / self._num_ops


class RunCountObserver(NetObserver):
    def __init__(self, ops: list[Any]) -> None:
        super().__init__(ops)
        self.count = 0

    def op_finished(self, op: Any, seconds: float) -> None:
        self.count += 1

    def debug_info(self) -> str:
        return f"This operator runs {self.count} times."


OBSERVER_TYPES: dict[str, type[NetObserver]] = {
    "TimeObserver": TimeObserver, "RunCountObserver": RunCountObserver}


def make_observer(observer_type: str, ops: list[Any], net_name: str) -> NetObserver:
    factory = OBSERVER_TYPES.get(observer_type)
    if factory is None:
        raise WorkspaceError(f"AddObserver on net {net_name!r}: no observer type "
                             f"{observer_type!r}; use one of {sorted(OBSERVER_TYPES)}.")
    return factory(ops)


def run_observed(observers: list[NetObserver], run: Any) -> None:
    """``run()`` with ``observers`` active: they hear of the ops it runs, then of the net's
    run.  The observers attached when the run starts are the ones told, even if some are
    added or removed while it runs."""
    attached = list(observers)
    for observer in attached:
        observer.net_started()
    ACTIVE.extend(attached)
    start = time.perf_counter()
    try:
        run()
    finally:
        seconds = time.perf_counter() - start
        for observer in attached:
            ACTIVE.remove(observer)
        for observer in attached:
            observer.net_finished(seconds)


def _net_instance(net_name: Any) -> Any:
    from dpgraph.runtime.api import current  # the current workspace of the facade's API

    return current().net(net_name)


def add_observer_to_net(net_name: Any, observer_type: str) -> NetObserver:
    """Caffe2's ``C.add_observer_to_net``: attach a new observer to a created net."""
    instance = _net_instance(net_name)
    observer = make_observer(observer_type, instance.ops, instance.name)
    instance.observers.append(observer)
    return observer


def remove_observer_from_net(net_name: Any, observer: NetObserver) -> None:
    instance = _net_instance(net_name)
    if observer not in instance.observers:
        raise WorkspaceError(f"RemoveObserver on net {instance.name!r}: that observer is not "
                             "attached to this net (it may belong to an earlier CreateNet).")
    instance.observers.remove(observer)


def num_observers_on_net(net_name: Any) -> int:
    return len(_net_instance(net_name).observers)


NET_EXTENSIONS.register("add_observer", add_observer_to_net)
NET_EXTENSIONS.register("remove_observer", remove_observer_from_net)
NET_EXTENSIONS.register("num_observers", num_observers_on_net)
