"""Whole-record dataset ops: PackRecords/UnPackRecords, TrimDataset, ComputeOffset,
SortAndShuffle, ReadRandomBatch, LastNWindowCollector, tensor vectors, CollectTensor;
dataset.Const and the random reader."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, dataset, workspace
from dpgraph.ops.dataset_records import _std_shuffle

FIELDS = ["a:lengths", "a:values", "b"]
COLUMNS = [np.array([2, 0, 1], np.int32), np.array([10, 11, 30], np.int64),
           np.array([1.5, 2.5, 3.5], np.float32)]


def _feed(prefix: str) -> list[str]:
    names = [f"{prefix}_{i}" for i in range(len(COLUMNS))]
    for name, value in zip(names, COLUMNS):
        workspace.FeedBlob(name, value)
    return names


def test_pack_unpack_roundtrip_per_record_and_single() -> None:
    cols = _feed("pk")
    for single in (False, True):
        net = core.Net("pk_net")
        packed = net.PackRecords(cols, 1, fields=FIELDS, pack_to_single_shared_ptr=single)
        unpacked = packed.UnPackRecords([], len(FIELDS), fields=FIELDS)
        workspace.RunNetOnce(net)
        assert workspace.FetchBlob(packed).shape == ((1,) if single else (3,))
        for blob, ref in zip(unpacked, COLUMNS):
            np.testing.assert_array_equal(workspace.FetchBlob(blob), ref)
    record = workspace.FetchBlob(packed)[0]
    assert [list(v) for v in record] == [list(c) for c in COLUMNS]


def test_trim_compute_offset_and_random_reads() -> None:
    cols = _feed("tr")
    workspace.RunOperatorOnce(core.CreateOperator("CreateTreeCursor", [], ["tr_cur"],
                                                  fields=FIELDS))
    workspace.RunOperatorOnce(core.CreateOperator("ComputeOffset", ["tr_cur"] + cols,
                                                  ["tr_off"]))
    np.testing.assert_array_equal(workspace.FetchBlob("tr_off"),
                                  [[0, 0], [1, 2], [2, 2], [3, 3]])
    workspace.FeedBlob("tr_idx", np.array([2, 0], np.int64))
    read = core.CreateOperator("ReadRandomBatch", ["tr_cur", "tr_idx", "tr_off"] + cols,
                               ["r0", "r1", "r2"], batch_size=2)
    workspace.RunOperatorOnce(read)
    assert [workspace.FetchBlob(b).tolist() for b in ("r0", "r1", "r2")] == [
        [1, 2], [30, 10, 11], [3.5, 1.5]]
    workspace.RunOperatorOnce(read)
    assert workspace.FetchBlob("r0").size == 0  # past the end
    workspace.RunOperatorOnce(core.CreateOperator("TrimDataset", cols, cols, fields=FIELDS,
                                                  multiple_of=2))
    assert [workspace.FetchBlob(c).tolist() for c in cols] == [[2, 0], [10, 11], [1.5, 2.5]]


def test_sort_and_shuffle_matches_cpp_default_engine() -> None:
    items = [1, 2]
    _std_shuffle(items)
    assert items == [2, 1]  # libstdc++ minstd_rand0(1) swaps a pair
    items = list(range(10))
    _std_shuffle(items)
    assert sorted(items) == list(range(10)) and items != list(range(10))
    cols = _feed("ss")
    workspace.RunOperatorOnce(core.CreateOperator("CreateTreeCursor", [], ["ss_cur"],
                                                  fields=FIELDS))
    workspace.RunOperatorOnce(core.CreateOperator(
        "SortAndShuffle", ["ss_cur"] + cols, ["ss_idx"], sort_by_field_idx=0,
        shuffle_size=1, batch_size=2))
    assert workspace.FetchBlob("ss_idx").tolist() == [2, 1, 0]
    with pytest.raises(RuntimeError, match="root level"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SortAndShuffle", ["ss_cur"] + cols, ["ss_bad"], sort_by_field_idx=1))


def test_last_n_window_ring_buffer() -> None:
    data = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    workspace.FeedBlob("ln_in", data)
    workspace.FeedBlob("ln_out", np.zeros((0, 2), np.float32))
    workspace.FeedBlob("ln_next", np.array(0, np.int32))
    op = core.CreateOperator("LastNWindowCollector", ["ln_out", "ln_next", "ln_in"],
                             ["ln_out", "ln_next"], num_to_collect=7)
    workspace.RunOperatorOnce(op)
    np.testing.assert_array_equal(workspace.FetchBlob("ln_out"), data)
    workspace.RunOperatorOnce(op)
    workspace.RunOperatorOnce(op)
    np.testing.assert_array_equal(workspace.FetchBlob("ln_out"), data[[1, 2, 2, 0, 1, 2, 0]])
    assert int(workspace.FetchBlob("ln_next")) == 2
    net = core.Net("ln_shapes")
    net.LastNWindowCollector(["ln_out", "ln_next", "ln_in"], ["ln_out", "ln_next"],
                             num_to_collect=7)
    shapes, _ = workspace.InferShapesAndTypes([net])
    assert list(shapes["ln_out"]) == [7, 2]


def test_tensor_vectors_and_reservoir() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateTensorVector", [], ["tv"]))
    net = core.Net("tv_net")
    net.CollectTensor(["tv", "tv_x"], ["tv"], num_to_collect=3)
    workspace.FeedBlob("tv_x", np.zeros((1, 2), np.float32))
    workspace.CreateNet(net)
    for i in range(3):  # the visit count belongs to the net's op instance
        workspace.FeedBlob("tv_x", np.full((1, 2), i, np.float32))
        workspace.RunNet(net)
    workspace.RunOperatorOnce(core.CreateOperator("ConcatTensorVector", ["tv"], ["tv_cat"]))
    workspace.RunOperatorOnce(core.CreateOperator("TensorVectorSize", ["tv"], ["tv_n"]))
    assert workspace.FetchBlob("tv_cat")[:, 0].tolist() == [0, 1, 2]
    assert workspace.FetchBlob("tv_n").shape == () and int(workspace.FetchBlob("tv_n")) == 3
    workspace.FeedBlob("tv_x", np.full((1, 2), 9, np.float32))
    workspace.RunNet(net, 200)  # keeps 3 of 203 visited tensors (reservoir sampling)
    workspace.RunOperatorOnce(core.CreateOperator("TensorVectorSize", ["tv"], ["tv_n"]))
    assert int(workspace.FetchBlob("tv_n")) == 3
    workspace.RunOperatorOnce(core.CreateOperator("ConcatTensorVector", ["tv"], ["tv_cat"]))
    assert 9 in workspace.FetchBlob("tv_cat")[:, 0].tolist()


def test_const_and_random_reader_of_a_dataset() -> None:
    net = core.Net("rr_init")
    blob = dataset.Const(net, [2, 0, 1], dtype=np.int64, name="order")
    assert workspace.FetchBlob(blob).tolist() == [2, 0, 1] and net.is_external_input(blob)
    ds = dataset.Dataset(FIELDS, name="rr")
    ds.init_empty(net)
    writer = ds.writer(init_net=net)
    cols = _feed("rr_src")
    writer.write(net, [core.BlobReference(c) for c in cols])
    workspace.RunNetOnce(net)
    read_init, read_next = core.Net("rr_ri"), core.Net("rr_rn")
    reader = ds.random_reader(read_init, blob)
    reader.computeoffset(read_init)
    should_stop, fields = reader.read_record(read_next)
    workspace.RunNetOnce(read_init)
    workspace.CreateNet(read_next)
    seen = []
    for _ in range(3):
        workspace.RunNet(read_next)
        seen.append(workspace.FetchBlob(fields.field_blobs()[2]).tolist())
    assert seen == [[3.5], [1.5], [2.5]]
    workspace.RunNet(read_next)
    assert bool(workspace.FetchBlob(should_stop))


def test_last_n_window_starts_from_a_created_but_empty_buffer() -> None:
    """Caffe2's dataset_ops_test creates the buffer blob without writing it."""
    from dpgraph import core, workspace

    workspace.CreateBlob("lnw_output")
    workspace.FeedBlob("lnw_next", np.array(0, dtype=np.int32))
    workspace.FeedBlob("lnw_x", np.arange(6, dtype=np.float32).reshape(3, 2))
    workspace.RunOperatorOnce(core.CreateOperator(
        "LastNWindowCollector", ["lnw_output", "lnw_next", "lnw_x"], ["lnw_output", "lnw_next"],
        num_to_collect=2))
    assert workspace.FetchBlob("lnw_output").tolist() == [[2.0, 3.0], [4.0, 5.0]]
