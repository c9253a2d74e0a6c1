"""Net observers: net.AddObserver("TimeObserver" | "RunCountObserver") as in Caffe2."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import WorkspaceError
from dpgraph.ops import observing


def _net(name: str, net_type: str = "simple") -> core.Net:
    workspace.FeedBlob("x", np.ones((4, 4), np.float32))
    net = core.Net(name)
    net.Proto().type = net_type
    net.Relu("x", "a")
    net.Sigmoid("a", "b")
    net.Scale("x", "c", scale=2.0)
    workspace.CreateNet(net, overwrite=True)
    return net


@pytest.mark.parametrize("net_type", ["simple", "dag"])
def test_run_count_observer_counts_operator_runs(net_type: str) -> None:
    net = _net(f"counted_{net_type}", net_type)
    counter = net.AddObserver("RunCountObserver")
    workspace.RunNet(net, 2)
    assert counter.debug_info() == "This operator runs 6 times."
    assert net.NumObservers() == 1
    net.RemoveObserver(counter)
    assert net.NumObservers() == 0 and observing.ACTIVE == []
    workspace.RunNet(net)
    assert counter.debug_info() == "This operator runs 6 times."  # detached: no more counts


def test_time_observer_averages_the_net_and_its_operators() -> None:
    net = _net("timed")
    timer = net.AddObserver("TimeObserver")
    assert timer.average_time() == 0.0
    workspace.RunNet(net, 3)
    assert timer.average_time() > 0.0
    assert 0.0 < timer.average_time_children() < timer.average_time()
    assert timer.debug_info() == ""


def test_observers_belong_to_the_created_instance_and_bad_calls_are_named() -> None:
    net = _net("observed")
    net.AddObserver("TimeObserver")
    workspace.CreateNet(net, overwrite=True)  # a new instance starts without observers
    assert net.NumObservers() == 0
    with pytest.raises(WorkspaceError, match="no observer type 'Nope'.*RunCountObserver"):
        net.AddObserver("Nope")
    other = _net("other").AddObserver("TimeObserver")
    with pytest.raises(WorkspaceError, match="not attached to this net"):
        net.RemoveObserver(other)
    with pytest.raises(WorkspaceError, match="Can't find net"):
        core.Net("never_created").AddObserver("TimeObserver")


def test_run_counts_include_a_recurrent_networks_step_ops() -> None:
    from dpgraph import model_helper, rnn_cell

    counts = []
    for steps in (2, 3, 4):
        workspace.ResetWorkspace()
        model = model_helper.ModelHelper(name=f"lstm_{steps}")
        output, *_ = rnn_cell.LSTM(model, "input", "lengths", ["h0", "c0"], dim_in=2,
                                   dim_out=3, scope="lstm", forward_only=True)
        workspace.FeedBlob("input", np.ones((steps, 1, 2), np.float32))
        workspace.FeedBlob("lengths", np.array([steps], np.int32))
        for state in ("h0", "c0"):
            workspace.FeedBlob(state, np.zeros((1, 1, 3), np.float32))
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net)
        counter = model.net.AddObserver("RunCountObserver")
        workspace.RunNet(model.net)
        counts.append(int(counter.debug_info().split()[3]))
    per_step = counts[1] - counts[0]
    assert per_step > 0 and counts[2] - counts[1] == per_step  # the step net's ops, per step



def _with_python_op(name: str, body: object) -> core.Net:
    workspace.FeedBlob("x", np.ones(3, np.float32))
    net = core.Net(name)
    net.Python(body)([], [])
    net.Relu("x", "y")
    workspace.CreateNet(net, overwrite=True)
    return net


def test_observers_added_or_removed_during_a_run_leave_nothing_behind() -> None:
    action = {"now": lambda: None}
    net = _with_python_op("mutating", lambda inputs, outputs: action["now"]())
    first = net.AddObserver("RunCountObserver")
    action["now"] = lambda: net.AddObserver("RunCountObserver")
    workspace.RunNet(net)  # one added mid-run: the run succeeds, the new one starts next run
    assert observing.ACTIVE == [] and net.NumObservers() == 2
    assert first.debug_info() == "This operator runs 2 times."
    action["now"] = lambda: net.RemoveObserver(first)
    workspace.RunNet(net)  # removed mid-run: told of this run's end, then never again
    assert observing.ACTIVE == [] and net.NumObservers() == 1
    action["now"] = lambda: None
    workspace.RunNet(net)
    _net("unrelated")
    workspace.RunNet("unrelated")
    assert first.debug_info() == "This operator runs 4 times."


def test_ops_of_other_nets_running_meanwhile_are_not_counted() -> None:
    import threading

    other = _net("other_thread")  # three ops
    started, finished = threading.Event(), threading.Event()

    def wait_for_the_other_net(inputs: object, outputs: object) -> None:
        started.set()
        assert finished.wait(10)

    net = _with_python_op("waiting", wait_for_the_other_net)
    counter = net.AddObserver("RunCountObserver")

    def run_other() -> None:
        started.wait(10)
        workspace.RunNet(other)
        finished.set()

    thread = threading.Thread(target=run_other)
    thread.start()
    workspace.RunNet(net)
    thread.join()
    assert counter.debug_info() == "This operator runs 2 times."
