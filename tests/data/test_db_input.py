"""TensorProtosDBInput over an LMDB written with the ``lmdb`` package as Caffe2's examples
write it: bit-exact batches, in key order, wrapping around, on CPU and virtual GPUs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _records import write_lmdb_tensor_protos

from dpgraph import brew, core, model_helper, workspace
from dpgraph.proto import caffe2_pb2


def _in_key_order(items: list[tuple[np.ndarray, int]]) -> list[tuple[np.ndarray, int]]:
    order = sorted(range(len(items)), key=lambda j: str(j).encode())
    return [items[j] for j in order]


def test_lmdb_create_example_reads_back_bit_exact_and_wraps(tmp_path: Path) -> None:
    items = _in_key_order(write_lmdb_tensor_protos(tmp_path / "db", 12))
    model = model_helper.ModelHelper(name="lmdb_test")
    data, label = model.TensorProtosDBInput([], ["data", "label"], batch_size=5,
                                            db=str(tmp_path / "db"), db_type="lmdb")
    assert (str(data), str(label)) == ("data", "label")
    assert model.param_init_net.Proto().op[0].output[0] == "dbreader_" + str(tmp_path / "db")
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    seen = []
    for _ in range(4):  # 20 reads of 12 records: wraps around
        workspace.RunNet(model.net.Proto().name)
        batch, labels = workspace.FetchBlob("data"), workspace.FetchBlob("label")
        assert batch.shape == (5, 3, 8, 4) and batch.dtype == np.float32
        assert labels.shape == (5,) and labels.dtype == np.int32
        seen.extend(zip(batch, labels))
    for index, (got, got_label) in enumerate(seen):
        expected, expected_label = items[index % 12]
        assert np.array_equal(got, expected) and got_label == expected_label


def test_unbatched_reads_one_record(tmp_path: Path) -> None:
    items = _in_key_order(write_lmdb_tensor_protos(tmp_path / "db", 3))
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["r"], db=str(tmp_path / "db"), db_type="lmdb"))
    workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["d", "l"]))
    assert workspace.FetchBlob("d").shape == (3, 8, 4)
    assert workspace.FetchBlob("l").shape == ()
    np.testing.assert_array_equal(workspace.FetchBlob("d"), items[0][0])


def test_brew_db_input_on_virtual_gpus_and_shared_reader(tmp_path: Path) -> None:
    items = _in_key_order(write_lmdb_tensor_protos(tmp_path / "db", 8))
    workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="gpu_input")
    reader = model.CreateDB("reader", db=str(tmp_path / "db"), db_type="lmdb")
    for gpu in range(2):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, gpu)), \
                core.NameScope(f"gpu_{gpu}"):
            model.net.TensorProtosDBInput(reader, ["data", "label"], batch_size=2)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    from dpgraph.runtime.api import current

    assert current().placement("gpu_1/data") == (caffe2_pb2.CUDA, 1)
    got = np.concatenate([workspace.FetchBlob("gpu_0/data"), workspace.FetchBlob("gpu_1/data")])
    np.testing.assert_array_equal(got, np.stack([items[j][0] for j in range(4)]))


def test_brew_db_input_helper_names(tmp_path: Path) -> None:
    write_lmdb_tensor_protos(tmp_path / "db", 2)
    model = model_helper.ModelHelper(name="m")
    with core.NameScope("cpu_0"):
        data, label = brew.db_input(model, ["data", "label"], batch_size=2,
                                    db=str(tmp_path / "db"), db_type="lmdb")
    assert str(data) == "cpu_0/data"
    op = model.param_init_net.Proto().op[0]
    assert op.type == "CreateDB" and op.output[0] == "cpu_0/dbreader_" + str(tmp_path / "db")
    with pytest.raises(TypeError):
        model.TensorProtosDBInput([], ["d"], batch_size=1, db="x", db_type="lmdb", extra=1)


def test_record_errors_name_the_db(tmp_path: Path) -> None:
    write_lmdb_tensor_protos(tmp_path / "db", 2)
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["r"], db=str(tmp_path / "db"), db_type="lmdb"))
    with pytest.raises(RuntimeError, match="hold 2 TensorProtos"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "TensorProtosDBInput", ["r"], ["d", "l", "x"], batch_size=2))
    with pytest.raises(RuntimeError, match="Must specify a db name"):
        workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r2"], db_type="lmdb"))
    with pytest.raises(RuntimeError, match="No such file|cannot open"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "CreateDB", [], ["r3"], db=str(tmp_path / "none"), db_type="lmdb"))


def test_record_of_the_wrong_type_names_db_and_key(tmp_path: Path) -> None:
    workspace.FeedBlob("w", np.ones((2, 3), np.float32))
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["w"], [], db=str(tmp_path / "saved"), db_type="lmdb", absolute_path=1))
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["r"], db=str(tmp_path / "saved"), db_type="lmdb"))
    before = set(workspace.Blobs())
    with pytest.raises(RuntimeError, match=r"saved', key b'w#%0'.*not a serialized "
                                           "TensorProtos") as info:
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["a"],
                                                      batch_size=2))
    assert "CorruptDataError" in type(info.value).__name__
    assert set(workspace.Blobs()) == before


def test_blobs_queue_db_feeds_tensor_protos_db_input() -> None:
    """blobs_queue_db_test: string records enqueued into a queue, read through
    CreateBlobsQueueDB + TensorProtosDBInput."""
    num_samples, batch_size = 200, 10
    init_net, net = core.Net("init_net"), core.Net("test_create_blobs_queue_db")
    queue = init_net.CreateBlobsQueue([], "queue", capacity=num_samples)
    reader = init_net.CreateBlobsQueueDB([queue], "blobs_queue_db_reader", value_blob_index=0,
                                         timeout_secs=0.1)
    workspace.RunNetOnce(init_net)
    for i in range(num_samples):
        item = caffe2_pb2.TensorProtos()
        data = item.protos.add(data_type=caffe2_pb2.TensorProto.STRING)
        data.string_data.append(f"foo{i}".encode())
        item.protos.add(data_type=caffe2_pb2.TensorProto.INT32, int32_data=[i])
        workspace.FeedBlob("blob", item.SerializeToString())
        workspace.RunOperatorOnce(core.CreateOperator(
            "SafeEnqueueBlobs", ["queue", "blob"], ["blob", "blob_status"]))
    net.TensorProtosDBInput([reader], ["image", "label"], batch_size=batch_size)
    workspace.CreateNet(net)
    seen = []
    for _ in range(num_samples // batch_size):
        workspace.RunNet(net)
        images, labels = workspace.FetchBlob("image"), workspace.FetchBlob("label")
        assert len(images) == batch_size == len(labels)
        for image, label in zip(images, labels):
            assert image == f"foo{label}".encode()
        seen.extend(labels.tolist())
    assert sorted(seen) == list(range(num_samples))
    workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", ["queue"], []))


def test_interpreter_exits_with_a_prefetch_blocked_on_a_queue() -> None:
    import subprocess
    import sys

    script = Path(__file__).with_name("_exit_with_blocked_prefetch.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "ran; exiting" in done.stdout, done.stderr[-2000:]


def _labels_of_runs(db: Path, runs: int, **args: int) -> list[list[int]]:
    """Labels delivered by ``runs`` RunOperatorOnce calls (each a new op instance)."""
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db=str(db),
                                                  db_type="lmdb"))
    delivered = []
    for _ in range(runs):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"],
                                                      ["d", "l"], batch_size=2, **args))
        delivered.append(workspace.FetchBlob("l").tolist())
    workspace.ResetWorkspace()
    return delivered


def test_a_destroyed_op_drops_its_prefetched_batch_as_caffe2s(tmp_path: Path) -> None:
    """PrefetchOperator: the reader is one batch ahead; the batch in flight when the op goes
    away (the end of RunOperatorOnce) is consumed and dropped."""
    items = _in_key_order(write_lmdb_tensor_protos(tmp_path / "db", 12))
    labels = [label for _, label in items]
    assert _labels_of_runs(tmp_path / "db", 3) == [labels[0:2], labels[4:6], labels[8:10]]
    assert _labels_of_runs(tmp_path / "db", 3, no_prefetch=1) == [labels[0:2], labels[2:4],
                                                                    labels[4:6]]


def test_prefetching_delivers_the_synchronous_sequence(tmp_path: Path) -> None:
    write_lmdb_tensor_protos(tmp_path / "db", 7)
    batches = {}
    for no_prefetch in (0, 1):
        workspace.ResetWorkspace()
        workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"],
                                                      db=str(tmp_path / "db"), db_type="lmdb"))
        net = core.Net(f"input{no_prefetch}")
        net.TensorProtosDBInput(["r"], ["d", "l"], batch_size=3, no_prefetch=no_prefetch)
        workspace.CreateNet(net)
        runs = []
        for _ in range(6):
            workspace.RunNet(net)
            runs.append((workspace.FetchBlob("d"), workspace.FetchBlob("l")))
        batches[no_prefetch] = runs
    for (data, label), (sync_data, sync_label) in zip(batches[0], batches[1]):
        assert np.array_equal(data, sync_data) and np.array_equal(label, sync_label)


def test_destroying_an_op_whose_prefetch_waits_on_an_empty_queue_returns() -> None:
    import time

    init = core.Net("init")
    queue = init.CreateBlobsQueue([], "queue", capacity=4)
    init.CreateBlobsQueueDB([queue], "reader")  # timeout_secs 0: reads wait forever
    workspace.RunNetOnce(init)
    for label in (7, 8):
        record = caffe2_pb2.TensorProtos()
        record.protos.add(data_type=caffe2_pb2.TensorProto.INT32, int32_data=[label])
        workspace.FeedBlob("record", record.SerializeToString())
        workspace.RunOperatorOnce(core.CreateOperator(
            "SafeEnqueueBlobs", ["queue", "record"], ["record", "status"]))
    net = core.Net("queue_input")
    net.TensorProtosDBInput(["reader"], ["label"], batch_size=1)
    workspace.CreateNet(net)
    workspace.RunNet(net)  # delivers 7; the prefetch reads 8, then waits for a third
    assert workspace.FetchBlob("label").tolist() == [7]
    start = time.monotonic()
    workspace.ResetWorkspace()
    assert time.monotonic() - start < 10
