"""data_workers and parallel_workers: Caffe2's API, rebatching, a Parallelized model fed on
4 CPU devices, stop() joining every thread, and a failing fetcher raising in the caller."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dpgraph import (
    brew,
    core,
    data_parallel_model,
    data_workers,
    model_helper,
    optimizer,
    parallel_workers,
    workspace,
)
from dpgraph.errors import DataInputError


def _alive(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def dummy_fetcher(fetcher_id: int, batch_size: int) -> list[np.ndarray]:
    n = np.random.randint(64) + 1
    data = np.zeros((n, 3))
    labels = []
    for j in range(n):
        data[j, :] = j + fetcher_id
        labels.append(data[j, 0])
    return [np.array(data), np.array(labels)]


def test_data_workers_test_pattern() -> None:
    model = model_helper.ModelHelper(name="test")
    seq_before = data_workers.global_coordinator._fetcher_id_seq
    coordinator = data_workers.init_data_input_workers(
        model, ["data", "label"], dummy_fetcher, 32, 2, input_source_name="unittest")
    assert coordinator is data_workers.global_coordinator
    assert data_workers.global_coordinator._fetcher_id_seq == seq_before + 2
    assert [op.type for op in model.net.Proto().op] == ["DequeueBlobs", "DequeueBlobs"]
    assert workspace.HasBlob("data_c2queue_unittest")
    assert workspace.HasBlob("data_scratch_unittest_status")
    coordinator.start()
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    for _ in range(50):
        workspace.RunNet(model.net.Proto().name)
        data, label = workspace.FetchBlob("data"), workspace.FetchBlob("label")
        assert data.shape == (32, 3) and label.shape == (32,) and data.dtype == np.float64
        np.testing.assert_array_equal(label, data[:, 0])
    assert coordinator.stop_coordinator("unittest")
    assert coordinator._coordinators == []
    assert _alive("data_workers fetcher") == [] and _alive("Enqueuer unittest") == []


def test_rnn_batch_columns_and_stop_returns_true() -> None:
    T = 20

    def rnn_fetcher(fetcher_id: int, batch_size: int) -> list[np.ndarray]:
        n = np.random.randint(batch_size) + 1
        return [np.zeros((T, n, 33)), np.zeros((T, n)), np.zeros(n)]

    model = model_helper.ModelHelper(name="rnn_test")
    coordinator = data_workers.init_data_input_workers(
        model, ["data1", "data2", "data3"], rnn_fetcher, 32, 2, input_source_name="rnn",
        batch_columns=[1, 1, 0])
    coordinator.start()
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    deadline = time.time() + 10
    while coordinator._coordinators[0]._state._inputs < 100 and time.time() < deadline:
        time.sleep(0.01)
    for _ in range(2):
        workspace.RunNet(model.net.Proto().name)
    assert workspace.FetchBlob("data1").shape == (T, 32, 33)
    assert workspace.FetchBlob("data3").shape == (32,)
    assert coordinator.stop() is True
    assert _alive("data_workers fetcher") == [] and _alive("Enqueuer rnn") == []


def test_failing_fetcher_raises_in_the_training_thread() -> None:
    def broken(fetcher_id: int, batch_size: int) -> list[np.ndarray]:
        raise ValueError("disk on fire")

    model = model_helper.ModelHelper(name="broken")
    coordinator = data_workers.init_data_input_workers(
        model, ["data"], broken, 4, 1, input_source_name="broken_src")
    coordinator.start()
    workspace.CreateNet(model.net)
    with pytest.raises(DataInputError, match="disk on fire") as info:
        workspace.RunNet(model.net.Proto().name)
    assert isinstance(info.value, RuntimeError)
    assert coordinator.stop_coordinator("broken_src")
    assert _alive("data_workers fetcher") == []


def test_wrong_chunk_stops_with_a_typed_error() -> None:
    model = model_helper.ModelHelper(name="wrong")
    coordinator = data_workers.init_data_input_workers(
        model, ["a", "b"], lambda i, n: [np.zeros(2), np.zeros(3)], 2, 1,
        input_source_name="wrong_src")
    coordinator.start()
    workspace.CreateNet(model.net)
    with pytest.raises(DataInputError, match="same number of examples"):
        workspace.RunNet(model.net.Proto().name)
    coordinator.stop_coordinator("wrong_src")


def test_parallelized_model_fed_on_four_devices() -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((6, 3)).astype(np.float32)

    def fetcher(worker_id: int, batch_size: int) -> list[np.ndarray]:
        x = np.random.default_rng().standard_normal((batch_size, 6)).astype(np.float32)
        return [x, np.argmax(x @ weights, axis=1).astype(np.int32)]

    def input_builder(model: model_helper.ModelHelper) -> None:
        data_workers.init_data_input_workers(model, ["data", "label"], fetcher, 8, 1,
                                             input_source_name="dpm_train")

    def forward(model: model_helper.ModelHelper, loss_scale: float) -> list:
        fc = brew.fc(model, "data", "fc", dim_in=6, dim_out=3)
        softmax, loss = model.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"])
        return [model.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    model = model_helper.ModelHelper(name="dpm_data_workers")
    data_parallel_model.Parallelize(
        model, input_builder, forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.5), devices=range(4),
        cpu_device=True)
    assert len(data_workers.global_coordinator._coordinators) == 4
    data_workers.global_coordinator.start()
    data_parallel_model.RunInitNet(model)
    losses = []
    for _ in range(50):
        data_parallel_model.RunNet(model, 1)
        losses.append(float(workspace.FetchBlob("cpu_0/loss")))
    for device in range(4):
        assert workspace.FetchBlob(f"cpu_{device}/data").shape == (8, 6)
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    assert data_workers.global_coordinator.stop() is True
    assert data_workers.global_coordinator._coordinators == []
    assert _alive("data_workers fetcher") == [] and _alive("Enqueuer dpm_train") == []


def test_parallel_workers_ids_callbacks_and_queue() -> None:
    queue = "pw_queue"
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], [queue],
                                                  num_blobs=1, capacity=1000))
    calls: list[str] = []
    start_seq = parallel_workers.global_coordinator._fetcher_id_seq

    def worker_fun(worker_id: int) -> None:
        blob = f"pw_blob_{worker_id}"
        workspace.FeedBlob(blob, np.array([str(worker_id)], dtype=object))
        workspace.RunOperatorOnce(core.CreateOperator(
            "SafeEnqueueBlobs", [queue, blob], [blob, f"{blob}_status"]))
        time.sleep(0.001)

    coordinator = parallel_workers.init_workers(
        worker_fun, worker_name="pw", init_fun=lambda c, g: calls.append("init"),
        shutdown_fun=lambda: calls.append("shutdown"))
    assert coordinator is parallel_workers.global_coordinator
    coordinator.start()
    for _ in range(10):
        workspace.RunOperatorOnce(core.CreateOperator("SafeDequeueBlobs", [queue],
                                                      ["out", "status"]))
        value = workspace.FetchBlob("out")[0]
        assert value in (str(start_seq).encode(), str(start_seq + 1).encode())
    workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", [queue], []))
    assert coordinator.stop() is True
    assert calls == ["init", "shutdown"]
    assert parallel_workers.global_coordinator._fetcher_id_seq == start_seq + 2
    assert _alive("parallel_workers worker") == []


def test_stop_frees_workers_blocked_on_a_full_queue() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], ["tiny"],
                                                  num_blobs=1, capacity=1))

    def worker_fun(worker_id: int) -> None:
        blob = f"tiny_blob_{worker_id}"
        workspace.FeedBlob(blob, np.array([worker_id]))
        workspace.RunOperatorOnce(core.CreateOperator(
            "SafeEnqueueBlobs", ["tiny", blob], [blob, f"{blob}_status"]))

    coordinator = parallel_workers.init_workers(worker_fun, worker_name="blocked")
    coordinator.start()
    deadline = time.time() + 5
    while len(workspace.FetchBlob("tiny")) < 1 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # both workers are now waiting on the full queue
    started = time.time()
    assert coordinator.stop() is True
    assert time.time() - started < 2.0
    assert _alive("parallel_workers worker") == []
