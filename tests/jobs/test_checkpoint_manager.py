"""Job checkpointing: JobRunner with (MultiNode)CheckpointManager saves after init and each
epoch, resumes from a saved epoch, loads chosen blobs; epoch_limiter; db_name."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dpgraph import workspace
from dpgraph.jobs.checkpoint_manager import (
    CheckpointManager,
    JobRunner,
    MultiNodeCheckpointManager,
    UploadTaskGroupBuilder,
    db_name,
    epoch_limiter,
)
from dpgraph.jobs.job import Job
from dpgraph.net_builder import ops
from dpgraph.session import LocalSession
from dpgraph.task import Cluster, Node, Task


def _job(node: str) -> tuple[Job, object]:
    with Node(node):
        with Job() as job:
            with job.init_group, Task():
                total = ops.Const(np.array([0], np.int64), blob_out=f"{node}_total")
            with Task():
                ops.Add([total, ops.Const(np.array([5], np.int64))], [total])
        epoch_limiter(job, 3)
    return job, total


def test_db_name_forms() -> None:
    assert db_name(3, "node", "/ckpt") == os.path.join("/ckpt", "node.3")
    assert db_name(3, "node", "/ckpt", path_prefix="hdfs://x/") == "hdfs://x/node.3"


def test_job_runner_checkpoints_every_epoch_and_resumes(tmp_path) -> None:
    with Cluster():
        ws = workspace.C.Workspace()
        session = LocalSession(ws)
        job, total = _job("ck_a")
        job.compile(LocalSession)
        manager = CheckpointManager(str(tmp_path), "ck_a", "minidb")
        assert JobRunner(job, manager).train(session) == 3
        assert ws.fetch_blob(str(total)).tolist() == [15]
        for epoch in range(4):
            assert os.path.exists(db_name(epoch, "ck_a", str(tmp_path)))
        assert b"ck_a_total" in manager.blob_list()  # string tensor: bytes, as Caffe2

        ws2 = workspace.C.Workspace()  # a fresh workspace: the same job resumes from epoch 1
        resumed = JobRunner(job, CheckpointManager(str(tmp_path), "ck_a", "minidb"),
                            resume_from_epoch=1)
        assert resumed.train(LocalSession(ws2)) == 3  # epochs 2 and 3 run after the load
        assert ws2.fetch_blob(str(total)).tolist() == [15]


def test_multi_node_manager_loads_chosen_blobs(tmp_path) -> None:
    with Cluster():
        ws = workspace.C.Workspace()
        session = LocalSession(ws)
        job, total = _job("ck_b")
        job.compile(LocalSession)
        manager = MultiNodeCheckpointManager(str(tmp_path), "minidb")
        JobRunner(job, manager).train(session)
        assert manager.get_ckpt_db_name("ck_b", 2) == db_name(2, "ck_b", str(tmp_path))
        fresh = workspace.C.Workspace()
        runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "minidb"))
        assert runner.load_blobs_from_checkpoints([str(total)], 2, LocalSession(fresh))
        assert fresh.fetch_blob(str(total)).tolist() == [10]
        assert not runner.load_blobs_from_checkpoints([str(total)], 9, LocalSession(fresh))
    with pytest.raises(ValueError, match="must implement"):
        UploadTaskGroupBuilder().build(1, manager)
