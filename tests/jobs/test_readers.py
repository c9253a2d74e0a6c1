"""dataio's composite, time-limited and delaying readers, reader builders, the Timer ops,
DBFileReader and CachedReader."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.cached_reader import CachedReader
from dpgraph.dataio import (
    CompositeReader,
    CompositeReaderBuilder,
    PipedReaderBuilder,
    ReaderBuilder,
    ReaderWithDelay,
    ReaderWithTimeLimit,
)
from dpgraph.dataset import Dataset
from dpgraph.db_file_reader import DBFileReader
from dpgraph.pipeline import pipe
from dpgraph.schema import FeedRecord, NewRecord, Scalar, Struct
from dpgraph.session import LocalSession
from dpgraph.task import TaskGroup, WorkspaceType


def _source(ws, name: str, offset: int, size: int = 10) -> Dataset:
    init = core.Net(f"{name}_init")
    with core.NameScope(name):
        values = Struct(("label", np.arange(offset, offset + size)))
        blobs = NewRecord(init, values)
        ds = Dataset(blobs, name=name)
        FeedRecord(blobs, values, ws)
    ws.run(init)
    return ds


def _destination(ws, schema, name: str = "rd_dst") -> Dataset:
    init = core.Net(f"{name}_init")
    with core.NameScope(name):
        ds = Dataset(schema, name=name)
        ds.init_empty(init)
    ws.run(init)
    return ds


class _Builder(ReaderBuilder):
    def __init__(self, ws, name: str, offset: int) -> None:
        self._ws, self._name, self._offset, self._ds = ws, name, offset, None
        self._schema = Struct(("label", Scalar()))

    def schema(self):
        return self._schema

    def setup(self, **kwargs):
        self._ds = _source(self._ws, self._name, self._offset)
        return {}

    def new_reader(self, **kwargs):
        return self._ds


def test_timer_ops_measure_nanoseconds() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("TimerBegin", [], ["rd_t"],
                                                  counter_name="epoch"))
    time.sleep(0.01)
    workspace.RunOperatorOnce(core.CreateOperator("TimerGet", ["rd_t"], ["rd_ns"]))
    first = int(workspace.FetchBlob("rd_ns"))
    assert first >= 10_000_000 and workspace.FetchBlob("rd_ns").dtype == np.int64
    workspace.RunOperatorOnce(core.CreateOperator("TimerGetAndEnd", ["rd_t"], ["rd_ns2"]))
    time.sleep(0.005)
    workspace.RunOperatorOnce(core.CreateOperator("TimerGet", ["rd_t"], ["rd_ns3"]))
    assert int(workspace.FetchBlob("rd_ns3")) == int(workspace.FetchBlob("rd_ns2")) >= first
    from dpgraph.ops.stats import GLOBAL_REGISTRY  # Caffe2's exported average stat

    stats = {key: value for key, value, _ in GLOBAL_REGISTRY.publish(reset=False)}
    assert stats[b"epoch/time_ns/count"] >= 1
    assert stats[b"epoch/time_ns/sum"] >= int(workspace.FetchBlob("rd_ns2"))
    with pytest.raises(RuntimeError, match="TimerBegin"):
        workspace.FeedBlob("rd_not_timer", np.zeros(1))
        workspace.RunOperatorOnce(core.CreateOperator("TimerEnd", ["rd_not_timer"], []))


@pytest.mark.parametrize("use_builder", [False, True])
def test_composite_reader_reads_all_sources(use_builder: bool) -> None:
    ws = workspace.C.Workspace()
    session = LocalSession(ws)
    names = ["rd_a", "rd_b"]
    if use_builder:
        builders = [_Builder(ws, n, 100 * i) for i, n in enumerate(names)]
        schema = Struct(*[(n, b.schema()) for n, b in zip(names, builders)])
        composite = CompositeReaderBuilder(names, builders)
        assert composite.setup(ws=ws) == {} and composite.schema() == schema
        piped = PipedReaderBuilder(composite, lambda reader, **kw: reader)
        reader = piped.new_reader()
    else:
        srcs = [_source(ws, n, 100 * i) for i, n in enumerate(names)]
        schema = Struct(*[(n, s.content().clone_schema()) for n, s in zip(names, srcs)])
        reader = CompositeReader(names, [s.reader() for s in srcs])
    dst = _destination(ws, schema)
    with TaskGroup() as tg:
        pipe(reader, dst.writer(), num_runtime_threads=1)
    session.run(tg)
    for i, name in enumerate(names):
        written = ws.fetch_blob(str(dst.content()[name].label()))
        assert sorted(written.tolist()) == list(range(100 * i, 100 * i + 10))


def test_time_limited_and_delayed_readers() -> None:
    ws = workspace.C.Workspace()
    session = LocalSession(ws)
    src = _source(ws, "rd_src", 0, size=100)
    dst = _destination(ws, src.content().clone_schema(), "rd_tl_dst")
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader = ReaderWithTimeLimit(ReaderWithDelay(src.reader(), 0.02), duration=0.1)
        pipe(reader, dst.writer(), num_runtime_threads=1)
    session.run(tg)
    read = len(ws.blobs[str(dst.content().label())].fetch())
    assert 1 <= read < 100  # stopped by the clock, not by the data
    assert not ws.blobs[str(reader.data_finished())].fetch()
    dst2 = _destination(ws, src.content().clone_schema(), "rd_tl_dst2")
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        unlimited = ReaderWithTimeLimit(src.reader(), duration=0)
        pipe(unlimited, dst2.writer(), num_runtime_threads=1)
    session.run(tg)
    assert len(ws.blobs[str(dst2.content().label())].fetch()) == 100
    assert ws.blobs[str(unlimited.data_finished())].fetch()


def test_cached_reader_builds_and_reads_a_db_file(tmp_path) -> None:
    ws = workspace.C.Workspace()
    session = LocalSession(ws)
    src = _source(ws, "rd_cache_src", 0, size=20)
    path = str(tmp_path / "cache.db")
    cached = CachedReader(src.reader(), db_path=path, db_type="minidb", batch_size=4)
    session.run(cached.build_cache_step())
    dst = _destination(ws, src.content().clone_schema(), "rd_cache_dst")
    with TaskGroup() as tg:
        pipe(cached, dst.writer(), num_runtime_threads=1)
    session.run(tg)
    assert sorted(ws.fetch_blob(str(dst.content().label())).tolist()) == list(range(20))
    reader = DBFileReader(db_path=path, db_type="minidb", batch_size=5)
    assert reader.schema().field_names() == ["label"] and reader.name == "cache_db_file_reader"
    with pytest.raises(Exception, match="not available"):
        DBFileReader(db_path=path, db_type="NoSuchDB")
