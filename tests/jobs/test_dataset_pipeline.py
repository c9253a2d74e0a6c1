"""dataset / dataio / queue_util / pipeline: records flow from a dataset through queued,
processed pipes into another dataset (Caffe2's session_test scenario), and tree cursors
read nested lists in batches."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.dataset import Dataset
from dpgraph.errors import NotSupportedError
from dpgraph.pipeline import pipe
from dpgraph.schema import FeedRecord, FetchRecord, InitEmptyRecord, List, NewRecord, Struct
from dpgraph.schema import Scalar as schema_scalar
from dpgraph.session import LocalSession
from dpgraph.task import TaskGroup


def _proc_double(rec):
    net = core.Net("dp_proc1")
    with core.NameScope("dp_proc1"):
        out = NewRecord(net, rec)
    net.Add([rec.uid(), rec.uid()], [out.uid()])
    out.value.set(blob=rec.value(), unsafe=True)
    return [net], out


def _proc_zero(rec):
    net = core.Net("dp_proc2")
    with core.NameScope("dp_proc2"):
        out = NewRecord(net, rec)
    out.uid.set(blob=rec.uid(), unsafe=True)
    net.Sub([rec.value(), rec.value()], [out.value()])
    return [net], out


def test_pipes_through_queues_between_datasets() -> None:
    init_net = core.Net("dp_init")
    src_values = Struct(("uid", np.array([1, 2, 6])), ("value", np.array([1.4, 1.6, 1.7])))
    with core.NameScope("dp_init"):
        src_blobs = NewRecord(init_net, src_values)
        dst_blobs = InitEmptyRecord(init_net, src_values.clone_schema())
    src_ds, dst_ds = Dataset(src_blobs), Dataset(dst_blobs)
    with TaskGroup() as tg:
        out1 = pipe(src_ds.reader(), processor=_proc_double)
        out2 = pipe(out1, processor=_proc_zero)
        pipe(out2, dst_ds.writer())
    ws = workspace.C.Workspace()
    FeedRecord(src_blobs, src_values, ws)
    session = LocalSession(ws)
    session.run(init_net)
    session.run(tg)
    output = FetchRecord(dst_blobs, ws=ws)
    np.testing.assert_array_equal(output.uid(), [2, 4, 12])
    np.testing.assert_array_equal(output.value(), [0.0, 0.0, 0.0])
    with pytest.raises(NotSupportedError):
        with TaskGroup():
            pipe(src_ds.reader(), processor=core.Net("dp_net_processor"))


def test_tree_cursor_reads_nested_lists_in_batches() -> None:
    schema = Struct(("id", np.int64), ("tags", List(np.int32)))
    init = core.Net("dp_tree_init")
    record = NewRecord(init, schema)
    values = [np.array([10, 11, 12]), np.array([2, 0, 3], np.int32),
              np.array([1, 2, 3, 4, 5], np.int32)]
    FeedRecord(record, values)
    ds = Dataset(record)
    read = core.Net("dp_tree_read")
    reader = ds.reader(init_net=init, batch_size=2)
    should_stop, fields = reader.read_record(read)
    workspace.RunNetOnce(init)
    workspace.CreateNet(read)
    workspace.RunNet(read)
    got = [workspace.FetchBlob(str(b)).tolist() for b in fields.field_blobs()]
    assert got == [[10, 11], [2, 0], [1, 2]] and not bool(workspace.FetchBlob(str(should_stop)))
    workspace.RunNet(read)
    got = [workspace.FetchBlob(str(b)).tolist() for b in fields.field_blobs()]
    assert got == [[12], [3], [3, 4, 5]]
    workspace.RunNet(read)
    assert bool(workspace.FetchBlob(str(should_stop)))
    reset = core.Net("dp_tree_reset")
    reader.reset(reset)
    workspace.RunNetOnce(reset)
    workspace.RunNet(read)
    assert workspace.FetchBlob(str(fields.field_blobs()[0])).tolist() == [10, 11]


def test_writer_appends_and_checks_consistency() -> None:
    schema = Struct(("x", np.float32))
    init = core.Net("dp_w_init")
    ds = Dataset(schema, name="dp_w")
    ds.init_empty(init)
    writer = ds.writer(init_net=init)
    write = core.Net("dp_w_write")
    batch = NewRecord(write, schema)
    writer.write_record(write, batch)
    workspace.RunNetOnce(init)
    FeedRecord(batch, [np.array([1.0, 2.0], np.float32)])
    workspace.RunNetOnce(write)
    FeedRecord(batch, [np.array([3.0], np.float32)])
    workspace.RunNetOnce(write)
    assert FetchRecord(ds.content()).x().tolist() == [1.0, 2.0, 3.0]
    bad = core.Net("dp_w_bad")
    bad.CheckDatasetConsistency(["dp_lengths", "dp_values"], [],
                                fields=["a:lengths", "a:values"])
    workspace.FeedBlob("dp_lengths", np.array([2, 2], np.int32))
    workspace.FeedBlob("dp_values", np.arange(3))
    with pytest.raises(RuntimeError, match="sums to 4"):
        workspace.RunNetOnce(bad)


@pytest.mark.parametrize("num_iter,expected,finished",
                         [(None, 100, True), (0, 0, False), (10, 10, False), (200, 100, True)])
def test_reader_with_limit(num_iter, expected, finished) -> None:
    from dpgraph.dataio import ReaderWithLimit
    from dpgraph.task import WorkspaceType

    ws = workspace.C.Workspace()
    session = LocalSession(ws)
    src_init = core.Net("dp_lim_src_init")
    with core.NameScope("dp_lim_src"):
        values = Struct(("label", np.arange(100)))
        src_blobs = NewRecord(src_init, values)
        src_ds = Dataset(src_blobs)
        FeedRecord(src_blobs, values, ws)
    ws.run(src_init)
    dst_init = core.Net("dp_lim_dst_init")
    with core.NameScope("dp_lim_dst"):
        dst_ds = Dataset(src_ds.content().clone_schema())
        dst_ds.init_empty(dst_init)
    ws.run(dst_init)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader = ReaderWithLimit(src_ds.reader(), num_iter=num_iter)
        pipe(reader, dst_ds.writer(), num_runtime_threads=1)
    session.run(tg)
    labels = ws.blobs[str(dst_ds.content().label())].fetch()
    assert len(labels) == expected
    assert bool(ws.blobs[str(reader.data_finished())].fetch()) is finished


def test_count_until() -> None:
    from dpgraph.dataio import CountUntil
    from dpgraph.task import WorkspaceType

    ws = workspace.C.Workspace()
    dst_init = core.Net("dp_cu_init")
    with core.NameScope("dp_cu"):
        dst_ds = Dataset(Struct(("iter", np.int64)))
        dst_ds.init_empty(dst_init)
    ws.run(dst_init)
    def as_rows(rec):
        net = core.Net("dp_cu_rows")
        row = net.ExpandDims([rec.iter()], ["dp_cu_row"], dims=[0])
        return [net], Struct(("iter", schema_scalar(np.int64, row)))

    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(CountUntil(5), dst_ds.writer(), processor=as_rows)
    LocalSession(ws).run(tg)
    assert ws.blobs[str(dst_ds.content().iter())].fetch().tolist() == [0, 1, 2, 3, 4]
