"""DAG executor scheduling: the calling thread runs the main chain, lock-free solo edges,
branches on the workers, and errors/order kept as before."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dpgraph import core
from dpgraph.errors import OperatorError, ShapeError
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.runtime import Workspace
from dpgraph.runtime import executor as executor_module
from dpgraph.runtime.executor import DagExecutor

THREADS: list[tuple[str, int]] = []
EVENTS: dict[str, threading.Event] = {}


def _register() -> None:
    if "RtTestThread" in OPERATORS:
        return

    @register_op("RtTestThread", inputs=(0, None), outputs=1)
    def record(ctx):  # which thread ran the op
        THREADS.append((ctx.op.output[0], threading.get_ident()))
        return (np.zeros(1, np.float32),)

    @register_op("RtTestSet", inputs=(0, None), outputs=1)
    def set_event(ctx):
        EVENTS[ctx.op.output[0]].set()
        return (np.zeros(1, np.float32),)

    def wait_event(ctx):  # blocks until another branch's op ran
        event = ctx.args["event"]
        event = event.decode() if isinstance(event, bytes) else event
        assert EVENTS[event].wait(10), "the other branch never ran"
        return (np.zeros(1, np.float32),)

    @register_op("RtTestSleep", inputs=(0, None), outputs=1)
    def sleep(ctx):  # a busy pure op: finishes after ms milliseconds
        time.sleep(ctx.args["ms"] / 1000)
        return record(ctx)

    register_op("RtTestWait", inputs=(0, None), outputs=1)(wait_event)
    register_op("RtTestWaitEffect", inputs=(0, None), outputs=1, side_effects=True)(wait_event)
    register_op("RtTestEffect", inputs=(0, None), outputs=1, side_effects=True)(record)


_register()


def _dag(net: core.Net, workers: int = 2) -> tuple[Workspace, str]:
    ws = Workspace(f"sched_{net.Proto().name}", seed=0)
    net.Proto().type, net.Proto().num_workers = "dag", workers
    ws.create_net(net.Proto())
    return ws, net.Proto().name


def test_calling_thread_runs_the_main_chain() -> None:
    THREADS.clear()
    net = core.Net("sched_chain")
    net.RtTestThread([], "a")
    net.RtTestThread(["a"], "b")
    net.RtTestThread(["b"], "c")
    ws, name = _dag(net)
    ws.run_net(name, num_iter=2)
    assert [n for n, _ in THREADS] == ["a", "b", "c"] * 2
    assert {t for _, t in THREADS} == {threading.get_ident()}
    executor = ws.net(name).executor
    assert isinstance(executor, DagExecutor) and executor.solo == [1, 2, -1]


def test_pure_branches_wait_for_the_thread_that_released_them() -> None:
    """a fans out to b (lowest index: continued by the caller) and c (pure: deferred, run by
    the caller once its chain ends); d joins them."""
    THREADS.clear()
    net = core.Net("sched_fan")
    net.RtTestThread([], "a")
    net.RtTestThread(["a"], "b")
    net.RtTestThread(["a"], "c")
    net.RtTestThread(["b", "c"], "d")
    ws, name = _dag(net)
    ws.run_net(name)
    assert [n for n, _ in THREADS] == ["a", "b", "c", "d"]
    assert {t for _, t in THREADS} == {threading.get_ident()}
    executor = ws.net(name).executor
    assert executor.solo == [-1, -1, -1, -1] and executor.deferrable == [True] * 4


def test_branches_with_side_effects_go_to_the_workers_at_once() -> None:
    """c has side effects and e leads to one: both are queued to the workers, never
    deferred."""
    THREADS.clear()
    net = core.Net("sched_effect")
    net.RtTestThread([], "a")
    net.RtTestThread(["a"], "b")
    net.RtTestEffect(["a"], "c")
    net.RtTestThread(["a"], "e")
    net.RtTestEffect(["e"], "f")
    ws, name = _dag(net)
    ws.run_net(name)
    where = dict(THREADS)
    assert where["a"] == where["b"] == threading.get_ident()
    assert where["c"] != threading.get_ident() and where["e"] != threading.get_ident()
    assert ws.net(name).executor.deferrable == [False, True, False, False, False]


def test_deferred_op_is_handed_over_before_an_op_that_may_block(monkeypatch) -> None:
    """b (side effects) waits for c, which a released as deferrable: the caller hands c to
    the workers before running b, without waiting for the valve."""
    monkeypatch.setattr(executor_module, "DEFER_LIMIT_S", 60.0)
    EVENTS["sched_handover"] = threading.Event()
    net = core.Net("sched_handover")
    net.RtTestThread([], "a")
    net.RtTestWaitEffect(["a"], "b", event="sched_handover")
    net.RtTestSet(["a"], "sched_handover")
    ws, name = _dag(net)
    ws.run_net(name)
    assert ws.has_blob("b")


def test_valve_hands_over_a_deferred_op_a_pure_op_waits_for() -> None:
    """b (no declared side effects, yet it blocks) waits for the deferred c: the valve
    gives c to a worker after DEFER_LIMIT_S, so the run still finishes."""
    EVENTS["sched_valve"] = threading.Event()
    net = core.Net("sched_valve")
    net.RtTestThread([], "a")
    net.RtTestWait(["a"], "b", event="sched_valve")
    net.RtTestSet(["a"], "sched_valve")
    ws, name = _dag(net, workers=1)
    ws.run_net(name)
    assert ws.has_blob("b") and ws.has_blob("sched_valve")


@pytest.mark.parametrize("idle", [False, True])
def test_valve_hands_over_only_when_a_cpu_is_idle(monkeypatch, idle: bool) -> None:
    """While the chain keeps finishing ops, a deferred op waits for it unless the valve
    sees an idle CPU; then a worker runs it at once."""
    monkeypatch.setattr(executor_module, "idle_cpu", lambda: idle)
    monkeypatch.setattr(executor_module, "DEFER_LIMIT_S", 0.2)
    THREADS.clear()
    net = core.Net(f"sched_idle_{idle}")
    net.RtTestThread([], "a")
    previous = "a"
    for i in range(8):  # one op finishes every 40 ms: never stalled for 0.2 s
        net.RtTestSleep([previous], f"s{i}", ms=40)
        previous = f"s{i}"
    net.RtTestThread(["a"], "c")
    ws, name = _dag(net)
    ws.run_net(name)
    order = [n for n, _ in THREADS]
    where = dict(THREADS)
    if idle:
        assert where["c"] != threading.get_ident() and order.index("c") < order.index("s7")
    else:
        assert where["c"] == threading.get_ident() and order[-1] == "c"


def test_failure_drops_deferred_ops() -> None:
    THREADS.clear()
    net = core.Net("sched_fail_deferred")
    net.RtTestThread([], "a")
    net.RtTestFail(["a"], ["b"])
    net.RtTestThread(["a"], "c")   # deferred behind b, never run once b failed
    ws, name = _dag(net)
    with pytest.raises(OperatorError) as info:
        ws.run_net(name)
    assert info.value.op_index == 1
    assert [n for n, _ in THREADS] == ["a"] and not ws.has_blob("c")


def test_caller_chain_may_wait_for_a_branch() -> None:
    """The op on the calling thread blocks until an op of another root's chain ran: the
    branch must run concurrently on a worker."""
    EVENTS["sched_ev"] = threading.Event()
    net = core.Net("sched_wait")
    net.RtTestWait([], "w", event="sched_ev")
    net.RtTestThread([], "x")
    net.RtTestSet(["x"], "sched_ev")
    ws, name = _dag(net, workers=1)
    ws.run_net(name)
    assert ws.has_blob("w") and ws.has_blob("sched_ev")


@pytest.mark.parametrize("failing", [1, 2])
def test_failure_inside_a_solo_chain_stops_it(failing: int) -> None:
    THREADS.clear()
    net = core.Net(f"sched_fail_{failing}")
    outputs = ["a", "b", "c", "d"]
    previous: list[str] = []
    for i, out in enumerate(outputs):
        if i == failing:
            net.RtTestFail(previous, [out])
        else:
            net.RtTestThread(previous, out)
        previous = [out]
    ws, name = _dag(net)
    with pytest.raises(OperatorError) as info:
        ws.run_net(name)
    assert isinstance(info.value, ShapeError) and info.value.op_index == failing
    assert [n for n, _ in THREADS] == outputs[:failing]
    assert not ws.has_blob(outputs[failing]) and not ws.has_blob(outputs[-1])
    THREADS.clear()
    with pytest.raises(OperatorError):  # the executor stays usable
        ws.run_net(name)
    assert [n for n, _ in THREADS] == outputs[:failing]


def test_an_error_on_a_worker_branch_is_raised_by_the_caller() -> None:
    THREADS.clear()
    net = core.Net("sched_branch_fail")
    net.RtTestThread([], "a")
    net.RtTestEffect(["a"], "b")
    net.RtTestFail(["a"], ["c"])     # op 2: after b (side effects) hands it to a worker
    ws, name = _dag(net)
    with pytest.raises(OperatorError) as info:
        ws.run_net(name)
    assert isinstance(info.value, ShapeError) and info.value.op_index == 2
    assert not ws.has_blob("c")
