"""RunPlan execution steps and blobs queues."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import QueueClosedError, WorkspaceError
from dpgraph.ops.queue import BlobsQueue
from dpgraph.proto import caffe2_pb2


def _counter_net(name: str, blob: str) -> core.Net:
    net = core.Net(name)
    net.Add([blob, "one"], blob)
    return net


def _feed_counters(*names: str) -> None:
    workspace.FeedBlob("one", np.ones(1, np.float32))
    for name in names:
        workspace.FeedBlob(name, np.zeros(1, np.float32))


def _value(name: str) -> float:
    return float(workspace.FetchBlob(name)[0])


def test_plan_num_iter_substeps_and_only_once() -> None:
    _feed_counters("a", "b", "init")
    plan = caffe2_pb2.PlanDef(name="rt_plan")
    for net in (_counter_net("rt_a", "a"), _counter_net("rt_b", "b"),
                _counter_net("rt_init", "init")):
        plan.network.add().CopyFrom(net.Proto())
    outer = plan.execution_step.add(name="outer", num_iter=3)
    outer.substep.add(name="init", network=[plan.network[2].name], only_once=True)
    outer.substep.add(name="a", network=[plan.network[0].name], num_iter=2)
    outer.substep.add(name="b", network=[plan.network[1].name])
    assert workspace.RunPlan(plan) is True
    assert (_value("init"), _value("a"), _value("b")) == (1.0, 6.0, 3.0)
    assert set(workspace.Nets()) >= {n.name for n in plan.network}


def test_plan_should_stop_blob() -> None:
    _feed_counters("i")
    workspace.FeedBlob("limit", np.array([4.0], np.float32))
    net = _counter_net("rt_stop", "i")
    net.GE(["i", "limit"], "stop")
    workspace.CreateNet(net)
    step = caffe2_pb2.ExecutionStep(name="loop", network=[net.Name()], should_stop_blob="stop")
    workspace.RunPlan(step)
    assert _value("i") == 4.0
    bounded = caffe2_pb2.ExecutionStep(name="b", network=[net.Name()], num_iter=10,
                                       should_stop_blob="stop")
    workspace.RunPlan(bounded)  # stop is already true: nothing runs
    assert _value("i") == 4.0


def test_plan_concurrent_substeps_with_queue() -> None:
    workspace.FeedBlob("x", np.arange(3, dtype=np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], ["q"], capacity=2,
                                                  num_blobs=1))
    producer = core.Net("rt_producer")
    producer.EnqueueBlobs(["q", "x"], ["x"])
    closer = core.Net("rt_closer")
    closer.CloseBlobsQueue(["q"], [])
    consumer = core.Net("rt_consumer")
    consumer.SafeDequeueBlobs(["q"], ["got", "done"])
    consumer.Add(["total", "got"], "total")
    workspace.FeedBlob("total", np.zeros(3, np.float32))
    workspace.FeedBlob("got", np.zeros(3, np.float32))
    plan = caffe2_pb2.PlanDef(name="rt_pc")
    for net in (producer, closer, consumer):
        plan.network.add().CopyFrom(net.Proto())
    top = plan.execution_step.add(name="top", concurrent_substeps=True)
    produce = top.substep.add(name="produce")
    produce.substep.add(name="enq", network=[producer.Name()], num_iter=5)
    produce.substep.add(name="close", network=[closer.Name()])
    top.substep.add(name="consume", network=[consumer.Name()], should_stop_blob="done")
    workspace.RunPlan(plan)
    # the consumer adds each record once, then one more time the last value on "done"
    np.testing.assert_array_equal(workspace.FetchBlob("total"), np.arange(3) * 6)
    assert bool(workspace.FetchBlob("done")) is True


def test_plan_errors() -> None:
    step = caffe2_pb2.ExecutionStep(name="x", network=["nope"])
    with pytest.raises(WorkspaceError, match="Can't find net nope"):
        workspace.RunPlan(step)
    workspace.RunPlan(caffe2_pb2.ExecutionStep(name="w", create_workspace=True))  # child ws
    with pytest.raises(WorkspaceError, match="PlanDef"):
        workspace.RunPlan(3)


def test_queue_blocking_and_close() -> None:
    queue = BlobsQueue("q", capacity=1, num_blobs=1)
    assert queue.put((1,)) is True
    results: list[object] = []
    consumer = threading.Thread(target=lambda: results.extend([queue.get(), queue.get()]))
    consumer.start()
    assert queue.put((2,), timeout=5) is True  # unblocks once the consumer took the first
    consumer.join(5)
    assert results == [(1,), (2,)]
    waiter = threading.Thread(target=lambda: results.append(queue.get()))
    waiter.start()
    queue.close()
    waiter.join(5)
    assert results[-1] is None and queue.put((3,)) is False


def test_queue_ops_errors() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], ["q"], num_blobs=2))
    workspace.FeedBlob("a", np.ones(1, np.float32))
    with pytest.raises(Exception, match="2 blobs per record"):
        workspace.RunOperatorOnce(core.CreateOperator("EnqueueBlobs", ["q", "a"], ["a"]))
    workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", ["q"], []))
    with pytest.raises(QueueClosedError, match="closed"):
        workspace.RunOperatorOnce(core.CreateOperator("DequeueBlobs", ["q"], ["x", "y"]))
    workspace.RunOperatorOnce(core.CreateOperator("SafeEnqueueBlobs", ["q", "a", "a"],
                                                  ["a", "a", "status"]))
    assert bool(workspace.FetchBlob("status")) is True
    with pytest.raises(WorkspaceError, match="timed out"):
        queue = BlobsQueue("t", 1, 1)
        queue.get(timeout=0.01)


def test_queue_records_are_copies() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], ["q"], capacity=4))
    workspace.FeedBlob("a", np.array([1.0], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("EnqueueBlobs", ["q", "a"], ["a"]))
    workspace.FeedBlob("a", np.array([2.0], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("DequeueBlobs", ["q"], ["b"]))
    np.testing.assert_array_equal(workspace.FetchBlob("b"), [1.0])
