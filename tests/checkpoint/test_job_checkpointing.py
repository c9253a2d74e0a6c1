"""Caffe2's job checkpointing as ``dpgraph.checkpoint`` exports it (CheckpointManager,
MultiNodeCheckpointManager, JobRunner, epoch_limiter, db_name; implemented in
jobs/checkpoint_manager.py) over a LocalSession with real Save/Load files, and the pieces of
the persistence layer it relies on (TreeCursor blobs, GetAllBlobNames)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.checkpoint import (
    CheckpointManager,
    JobRunner,
    MultiNodeCheckpointManager,
    UploadTaskGroupBuilder,
    db_name,
    epoch_limiter,
)
from dpgraph.ir.blob_serde import deserialize_blob, serialize_blob
from dpgraph.jobs.job import Job
from dpgraph.jobs.session import LocalSession
from dpgraph.jobs.task import Node, Task
from dpgraph.ops.dataset import TreeCursor
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import c_api


@pytest.fixture(autouse=True)
def _fresh() -> None:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _counting_job(node: str, epochs: int) -> tuple[Job, str]:
    """A job adding 1 to ``total`` every epoch, stopping after ``epochs``."""
    with Job() as job, Node(node):
        with job.init_group:
            init = core.Net("init_total")
            init.ConstantFill([], "total", shape=[1], value=100, dtype=core.DataType.INT64)
            Task(step=init)
        with job.epoch_group:
            step = core.Net("add_one")
            one = step.ConstantFill([], "one", shape=[1], value=1, dtype=core.DataType.INT64)
            step.Add(["total", one], "total")
            Task(step=step)
        epoch_limiter(job, epochs)
    return job, "total"


def test_db_name() -> None:
    assert db_name(5, "trainer_0", "/ckpt") == "/ckpt/trainer_0.5"
    assert db_name(5, "trainer_0", "/ckpt", path_prefix="hdfs://x/") == "hdfs://x/trainer_0.5"


def test_train_saves_each_epoch_and_resumes(tmp_path: Path) -> None:
    job, total = _counting_job("trainer_0", 3)
    ws = c_api.Workspace()
    manager = CheckpointManager(str(tmp_path), "trainer_0", "minidb")
    assert JobRunner(job, manager).train(LocalSession(ws)) == 3
    assert ws.fetch_blob(total).tolist() == [103]
    assert sorted(os.listdir(tmp_path)) == [f"trainer_0.{e}" for e in range(4)]
    # the blob list is saved with the blobs and read back when resuming
    ws2 = c_api.Workspace()
    resumed = CheckpointManager(str(tmp_path), "trainer_0", "minidb")
    JobRunner(job, resumed, resume_from_epoch=1).train(LocalSession(ws2))
    assert ws2.fetch_blob(total).tolist() == [103]
    names = [n.decode() if isinstance(n, bytes) else n for n in resumed.blob_list()]
    assert "blob_names" in names and total in names
    session = LocalSession(ws2)
    session.run(resumed.load(2))
    assert ws2.fetch_blob(total).tolist() == [102]


def test_failed_save_does_not_stop_training(caplog: pytest.LogCaptureFixture) -> None:
    job, total = _counting_job("trainer_0", 2)
    ws = c_api.Workspace()
    manager = MultiNodeCheckpointManager("/nonexistent/dpgraph/ckpt", "minidb")
    assert JobRunner(job, manager).train(LocalSession(ws)) == 2
    assert ws.fetch_blob(total).tolist() == [102]
    assert "Unable to write checkpoint" in caplog.text


def test_multi_node_names_load_locally_and_upload(tmp_path: Path) -> None:
    for node in ("trainer_0", "trainer_1"):
        job, _ = _counting_job(node, 2)
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "minidb")).train(
            LocalSession(c_api.Workspace()))
    manager = MultiNodeCheckpointManager(str(tmp_path), "minidb")
    manager.init(["trainer_0", "trainer_1"])
    assert manager.get_ckpt_db_name("trainer_1", 7) == str(tmp_path / "trainer_1.7")
    ws = c_api.Workspace()
    session = LocalSession(ws)
    loader = MultiNodeCheckpointManager(str(tmp_path), "minidb")
    assert loader.load_blobs_locally(["trainer_0", "trainer_1"], ["total"], 1, session)
    assert ws.fetch_blob("total").tolist() == [101]
    assert not loader.load_blobs_locally(["trainer_0", "trainer_1"], ["total"], 9, session)

    class Recorder(UploadTaskGroupBuilder):
        def __init__(self) -> None:
            self.calls: list[int] = []

        def build(self, epoch: int, checkpoint_manager: object) -> object:
            self.calls.append(epoch)
            return Task(step=core.Net("upload_noop"))

    recorder = Recorder()
    job, _ = _counting_job("trainer_0", 2)
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path / "b"), "minidb"),
              upload_task_group_builder=recorder).train(LocalSession(c_api.Workspace()))
    assert recorder.calls == [2]


def test_tree_cursor_blob_round_trip_and_wire_layout() -> None:
    cursor = TreeCursor(["a", "b:lengths", "b:values"])
    empty = caffe2_pb2.BlobProto.FromString(serialize_blob("cur", cursor))
    assert empty.type == "std::unique_ptr<TreeCursor>"
    assert empty.content == b"a b:lengths b:values " and not empty.HasField("tensor")
    cursor.offsets = [3, 7]
    proto = caffe2_pb2.BlobProto.FromString(serialize_blob("cur", cursor))
    assert list(proto.tensor.int64_data) == [3, 7] and list(proto.tensor.dims) == [2]
    assert proto.tensor.data_type == caffe2_pb2.TensorProto.INT64
    name, back = deserialize_blob(proto.SerializeToString())
    assert name == "cur" and isinstance(back, TreeCursor)
    assert back.it.fields == ["a", "b:lengths", "b:values"] and back.offsets == [3, 7]


def test_get_all_blob_names() -> None:
    workspace.FeedBlob("b", np.zeros(2))
    workspace.FeedBlob("a", b"text")
    workspace.RunOperatorOnce(core.CreateOperator("GetAllBlobNames", [], ["names"]))
    assert workspace.FetchBlob("names").tolist() == [b"a", b"b", b"names"]
    parent = c_api.Workspace()
    parent.feed_blob("outer", np.ones(1))
    child = c_api.Workspace(parent)
    child.run(core.CreateOperator("GetAllBlobNames", [], ["local"], include_shared=0))
    child.run(core.CreateOperator("GetAllBlobNames", [], ["all"]))
    assert child.fetch_blob("local").tolist() == [b"local"]
    assert child.fetch_blob("all").tolist() == [b"all", b"local", b"outer"]
