"""The rebatching queue ops: element-wise and batched enqueue, stacked dequeues, close
semantics (partial last batch, then failure), blocking producers and consumers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import QueueClosedError
from dpgraph.ops.rebatching_queue import RebatchingQueue


@pytest.fixture(autouse=True)
def _fresh() -> None:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _run(op_type: str, inputs: list[str], outputs: list[str], **kwargs: object) -> None:
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


def test_batched_enqueue_stacked_dequeue_and_close() -> None:
    _run("CreateRebatchingQueue", [], ["q"], capacity=10, num_blobs=2)
    workspace.FeedBlob("a", np.arange(7, dtype=np.int32))
    workspace.FeedBlob("b", np.arange(14, dtype=np.float32).reshape(7, 2))
    _run("EnqueueRebatchingQueue", ["q", "a", "b"], [], enqueue_batch=1)
    _run("DequeueRebatchingQueue", ["q"], ["x", "y"], num_elements=5)
    assert workspace.FetchBlob("x").tolist() == [0, 1, 2, 3, 4]
    assert workspace.FetchBlob("y").shape == (5, 2)
    _run("CloseRebatchingQueue", ["q"], [])
    _run("DequeueRebatchingQueue", ["q"], ["x", "y"], num_elements=5)  # what is left
    assert workspace.FetchBlob("x").tolist() == [5, 6]
    with pytest.raises(QueueClosedError):
        _run("DequeueRebatchingQueue", ["q"], ["x", "y"], num_elements=5)
    with pytest.raises(QueueClosedError):
        _run("EnqueueRebatchingQueue", ["q", "a", "b"], [], enqueue_batch=1)


def test_whole_tensor_elements_and_shape_checks() -> None:
    _run("CreateRebatchingQueue", [], ["q"], capacity=4, num_blobs=1)
    workspace.FeedBlob("t", np.ones((2, 3), dtype=np.float32))
    _run("EnqueueRebatchingQueue", ["q", "t"], [])
    _run("EnqueueRebatchingQueue", ["q", "t"], [])
    _run("DequeueRebatchingQueue", ["q"], ["out"], num_elements=2)
    assert workspace.FetchBlob("out").shape == (2, 2, 3)
    with pytest.raises(RuntimeError):
        _run("EnqueueRebatchingQueue", ["q", "t", "t"], [])  # one blob per element


def test_blocking_producer_consumer() -> None:
    queue = RebatchingQueue("q", capacity=2, num_blobs=1)
    rows = [(np.array(i),) for i in range(20)]
    got: list[int] = []

    def consume() -> None:
        for _ in range(4):
            got.extend(int(e[0]) for e in queue.dequeue(5))

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert queue.enqueue(rows)
    consumer.join(5)
    assert not consumer.is_alive() and got == list(range(20))
    blocked = threading.Thread(target=lambda: got.append(len(queue.dequeue(3))))
    blocked.start()
    queue.close()
    blocked.join(5)
    assert not blocked.is_alive() and got[-1] == 0
