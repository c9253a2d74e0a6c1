"""Ops that name a mutex input run read-kernel-store under it (Caffe2's AtomicAppend)."""

from __future__ import annotations

import threading

import numpy as np

from dpgraph import core, workspace


def test_concurrent_atomic_appends_lose_no_record() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateMutex", [], ["mtx"]))
    workspace.FeedBlob("acc", np.zeros((0,), np.int64))
    net = core.Net("append_one")
    net.AtomicAppend(["mtx", "acc", "one"], ["acc"])
    workspace.FeedBlob("one", np.ones((1,), np.int64))
    workspace.CreateNet(net)

    def worker() -> None:
        for _ in range(50):
            workspace.RunNet(net.Name())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert workspace.FetchBlob("acc").shape == (150,)
