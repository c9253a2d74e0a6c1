"""Cancelling a running net from another thread (Caffe2's ``Net.cancel()``): blocked queue
ops return, ``run()`` raises NetCancelledError, and the net runs again afterwards."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import NetCancelledError


@pytest.mark.parametrize("net_type", ["simple", "async_scheduling"])
def test_cancel_unblocks_a_waiting_dequeue_and_raises(net_type: str) -> None:
    ws = workspace.Workspace()
    init_net = core.Net("cancel_init")
    queue = init_net.CreateBlobsQueue([], "cancel_queue", capacity=2, num_blobs=1)
    ws.create_net(init_net).run()
    net = core.Net(f"cancel_{net_type}")
    net.Proto().type = net_type
    net.SafeDequeueBlobs([queue], ["x", "status"])
    instance = ws.create_net(net)
    canceller = threading.Timer(0.2, instance.cancel)
    canceller.start()
    start = time.monotonic()
    with pytest.raises(NetCancelledError, match="cancelled"):
        instance.run()
    assert time.monotonic() - start < 5
    canceller.join()
    enqueue = core.Net(f"cancel_feed_{net_type}")
    enqueue.EnqueueBlobs([queue, "one"], ["one"])
    ws.create_blob("one").feed(np.ones(1, np.float32))
    ws.run(enqueue)
    assert instance.run()  # not cancelled any more: dequeues what was fed
    np.testing.assert_array_equal(ws.blobs["x"].fetch(), [1.0])
