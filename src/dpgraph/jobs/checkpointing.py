"""Caffe2's job checkpointing (``checkpoint.py``): CheckpointManager, its multi-node form,
JobRunner and epoch_limiter.

A checkpoint of node ``N`` at epoch ``E`` is the DB ``<db_prefix>/N.E`` (or
``<path_prefix>N.E``) holding every blob of the node's global workspace, written by ``Save``
and read back by ``Load`` (``absolute_path``, ``keep_device``).  The blob list is taken once
by ``GetAllBlobNames`` after the job's init group ran, or read from a checkpoint when
resuming (its ``blob_names`` blob is checkpointed with the rest).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from dpgraph.ir.net import Net
from dpgraph.jobs.net_builder import ops
from dpgraph.jobs.task import Node, Task, TaskGroup, TaskOutput, WorkspaceType, final_output

logger = logging.getLogger(__name__)


def get_ckpt_filename(node_name: str, epoch: int) -> str:
    """``<node_name>.<epoch>``."""
    return f"{node_name}.{epoch}"


def db_name(epoch: int, node_name: str, db_prefix: str, path_prefix: str | None = None) -> str:
    """The full DB path of a node's checkpoint at ``epoch``."""
    if path_prefix:
        return path_prefix + get_ckpt_filename(node_name, epoch)
    return os.path.join(db_prefix, get_ckpt_filename(node_name, epoch))


class CheckpointManager:
    """Saves and loads the blobs of one node's global workspace at each epoch."""

    BLOB_NAMES = "blob_names"

    def __init__(self, db_prefix: str, node_name: str, db_type: str,
                 metadata_handler: Any = None) -> None:
        self._db_prefix = db_prefix
        self._node_name = node_name
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._net = Net("!!checkpoint_mngr")  # makes blob_names the first blob saved
        self._blob_names = self._net.AddExternalInput(self.BLOB_NAMES)
        self._names_output: TaskOutput | None = None
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._current_db_name: str | None = None
        self._current_checkpoint_duration: TaskOutput | None = None

    def init(self, nodes: list[Any] | None = None, retrieve_from_epoch: int | None = None,
             path_prefix: str | None = None, path_type: str | None = None) -> Task:
        """A Task that lists the blobs to checkpoint (or reads the list from the checkpoint
        of ``retrieve_from_epoch``)."""
        assert nodes is None or len(nodes) == 1, "CheckpointManager only supports single node."
        with Task(outputs=[self._blob_names]) as task:
            if retrieve_from_epoch is None:
                ops.GetAllBlobNames([], self._blob_names, include_shared=False)
            else:
                full_db_name = db_name(retrieve_from_epoch, self._node_name, self._db_prefix,
                                       path_prefix)
                logger.info("Initializing checkpoints from = %s", full_db_name)
                ops.Load([], self._blob_names, db=full_db_name,
                         db_type=path_type or self._db_type, absolute_path=True,
                         keep_device=True)
        self._names_output = task.outputs()[0]
        return task

    def blob_list(self) -> list[Any]:
        assert self._names_output, "init must be run first."
        return [n.decode("utf-8") if isinstance(n, bytes) else n
                for n in self._names_output.fetch().tolist()]

    def _timed_task(self, cp_op_name: str, add_op: Any) -> Task:
        """A Task running ``add_op``'s ops whose duration lands in
        ``_current_checkpoint_duration``."""
        with Task(name=cp_op_name) as task:
            with ops.task_init():
                timer = ops.TimerBegin([], counter_name=self._node_name)
            add_op()
            with ops.task_exit():
                time_span_blob = ops.TimerGetAndEnd(timer)
            self._current_checkpoint_duration = final_output(time_span_blob)
        return task

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        if self._current_db_name and self._current_checkpoint_duration:
            duration = np.asarray(self._current_checkpoint_duration.fetch()).reshape(-1)
            stats[self._current_db_name] = duration[0]
        else:
            logger.info("Failed to collect checkpoint stats: %s", self._current_db_name)

    def load(self, epoch: int, path_prefix: str | None = None,
             path_type: str | None = None) -> Task:
        """A Task loading every checkpointed blob from the checkpoint of ``epoch``."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info("Loading checkpoints from = %s", self._current_db_name)

        def add_op() -> None:
            ops.Load([], self.blob_list(), db=self._current_db_name, db_type=db_type,
                     absolute_path=True, keep_device=True)

        return self._timed_task("checkpoint_load", add_op)

    def load_blobs_from_checkpoint(self, blob_names: list[str], epoch: int) -> Task:
        """A Task loading the ``blob_names`` found in the checkpoint of ``epoch``."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Load from %s", self._current_db_name)

        def add_op() -> None:
            ops.Load([], blob_names, db=self._current_db_name, db_type=self._db_type,
                     absolute_path=True, allow_incomplete=True)

        return self._timed_task("checkpoint_partial_load", add_op)

    def check_db_exists(self, epoch: int) -> Task:
        """A Task whose output says whether the checkpoint of ``epoch`` exists."""
        name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Check existence of %s", name)
        with Task() as task:
            existence = ops.Const(False)
            ops.DBExists([], [existence], db_name=name, db_type=self._db_type,
                         absolute_path=True)
            task.add_output(existence)
        return task

    def report_checkpoint_stats(self, action_name: str) -> None:
        all_stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch: int) -> Task:
        """A Task saving every checkpointed blob to the checkpoint of ``epoch``."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Saving to %s", self._current_db_name)

        def add_op() -> None:
            ops.Save(self.blob_list(), [], db=self._current_db_name, db_type=self._db_type,
                     absolute_path=True)

        return self._timed_task("checkpoint_save", add_op)

    def write_checkpoint_metadata(self, epoch: int) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        if self._metadata_handler is not None:
            return self._metadata_handler.last_epoch(user_epoch=user_epoch)
        return user_epoch

    def set_params(self, nodes: Any, path_prefix: str | None = None,
                   path_type: str | None = None) -> None:
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        if self._metadata_handler:
            self._metadata_handler.set_params(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=[str(self._node_name)], path_prefix=self._path_prefix,
                path_type=self._path_type)

    def cp_accessible(self, epoch: int | None = None) -> bool:
        if self._metadata_handler is not None:
            return bool(self._metadata_handler.cp_accessible(epoch))
        return True


class MultiNodeCheckpointManager:
    """One CheckpointManager per node; every method returns a TaskGroup over the nodes."""

    def __init__(self, db_prefix: str, db_type: str, metadata_handler: Any = None) -> None:
        self._node_managers: list[tuple[Any, CheckpointManager]] | None = None
        self._db_prefix = db_prefix
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._path_prefix: str | None = None
        self._path_type: str | None = None

    def _task_group(self, func: Any, *args: Any, **kw: Any) -> TaskGroup:
        assert self._node_managers is not None, "init must be called first."
        with TaskGroup(WorkspaceType.GLOBAL) as task_group:
            for node, manager in self._node_managers:
                with Node(node):
                    func(manager, *args, **kw)
        return task_group

    def _make_managers(self, nodes: list[Any]) -> None:
        self._node_managers = []
        for node in nodes:
            with Node(node):
                manager = CheckpointManager(db_prefix=self._db_prefix, node_name=str(node),
                                            db_type=self._db_type)
                self._node_managers.append((node, manager))

    def init(self, nodes: list[Any], retrieve_from_epoch: int | None = None,
             path_prefix: str | None = None, path_type: str | None = None) -> TaskGroup:
        if self._node_managers is not None:
            assert [node for node, _ in self._node_managers] == nodes
            return TaskGroup(WorkspaceType.GLOBAL)
        self._make_managers(nodes)
        return self._task_group(CheckpointManager.init, nodes=None,
                                retrieve_from_epoch=retrieve_from_epoch,
                                path_prefix=path_prefix, path_type=path_type)

    def load(self, epoch: int, path_prefix: str | None = None,
             path_type: str | None = None) -> TaskGroup:
        return self._task_group(CheckpointManager.load, epoch, path_prefix=path_prefix,
                                path_type=path_type)

    def load_blobs_locally(self, nodes: list[Any], blob_names: list[str], epoch: int,
                           session: Any) -> bool:
        """Load ``blob_names`` from every node's checkpoint of ``epoch`` into the session's
        workspace; False (nothing loaded from there on) when a checkpoint is missing."""
        if self._node_managers is not None:
            assert [node for node, _ in self._node_managers] == nodes
        else:
            self._make_managers(nodes)
        assert self._node_managers is not None
        for _, manager in self._node_managers:
            existence_task = manager.check_db_exists(epoch)
            session.run(existence_task)
            if not existence_task.outputs()[0].fetch():
                logger.info("DB %s does not exist!",
                            db_name(epoch, manager._node_name, manager._db_prefix))
                return False
            session.run(manager.load_blobs_from_checkpoint(blob_names, epoch))
        logger.info("Successfully loaded from checkpoints.")
        return True

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str | None:
        """The checkpoint DB of ``node_name`` at ``epoch``."""
        for node, manager in self._node_managers or []:
            if str(node) == node_name:
                return db_name(epoch, manager._node_name, manager._db_prefix)
        return None

    def report_checkpoint_stats(self, action_name: str) -> None:
        all_stats: dict[str, Any] = {}
        for _, manager in self._node_managers or []:
            manager.collect_checkpoint_stats(all_stats)
        logger.debug("checkpoint stats: %s", all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch: int) -> TaskGroup:
        return self._task_group(CheckpointManager.save, epoch)

    def write_checkpoint_metadata(self, epoch: int) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        if self._metadata_handler is not None:
            return self._metadata_handler.last_epoch(user_epoch=user_epoch)
        return user_epoch

    def set_params(self, nodes: list[Any], path_prefix: str | None = None,
                   path_type: str | None = None) -> None:
        self._path_prefix = path_prefix
        self._path_type = path_type
        if self._metadata_handler:
            self._metadata_handler.set_params(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=[str(node) for node in nodes], path_prefix=self._path_prefix,
                path_type=self._path_type)

    def cp_accessible(self, epoch: int | None = None) -> bool:
        if self._metadata_handler is not None:
            return bool(self._metadata_handler.cp_accessible(epoch))
        return True


class UploadTaskGroupBuilder(ABC):
    """Builds the TaskGroup that uploads the checkpoints after training."""

    @abstractmethod
    def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
        """The upload TaskGroup for the checkpoints of ``epoch``."""


class JobRunner:
    """Runs a Job: init group (or resume from a checkpoint), epochs until a stop condition,
    a checkpoint after each epoch, then upload, download and exit groups."""

    def __init__(self, job: Any, checkpoint_manager: Any = None,
                 resume_from_epoch: int | None = None,
                 upload_task_group_builder: UploadTaskGroupBuilder | None = None) -> None:
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder

    def _prepare_checkpoints(self, session: Any, from_scratch: bool) -> None:
        logger.info("Preparing checkpoints ...")
        session.run(self.checkpoint_manager.init(
            self.job.nodes_to_checkpoint(), retrieve_from_epoch=self.resume_from_epoch))
        if from_scratch:
            self.save_checkpoints(0, session)
            return
        logger.info("Loading checkpoints for epoch %s ...", self.resume_from_epoch)
        session.run(self.checkpoint_manager.load(self.resume_from_epoch))
        self.checkpoint_manager.report_checkpoint_stats("checkpoint_load")
        logger.info("Checkpoint loaded")

    def train(self, session: Any) -> int:
        """Run the job in ``session``; returns the last epoch run."""
        from_scratch = self.resume_from_epoch is None
        if from_scratch:
            session.run(self.job.init_group)
        if self.checkpoint_manager:
            self._prepare_checkpoints(session, from_scratch)
        logger.info("Finished initializing")
        epoch = 1 if from_scratch else int(self.resume_from_epoch) + 1  # type: ignore[arg-type]
        while True:
            logger.info("Starting epoch %d", epoch)
            session.run(self.job.epoch_group)
            logger.info("Finished epoch %d", epoch)
            stop_conditions = [o.fetch() for o in self.job.stop_conditions]
            if self.checkpoint_manager:
                self.save_checkpoints(epoch, session)
            if any(stop_conditions):
                logger.info("Stopping")
                break
            epoch += 1
        logger.info("Finished training")
        if self.upload_task_group_builder:
            session.run(self.upload_task_group_builder.build(epoch, self.checkpoint_manager))
            logger.info("Finished uploading the checkpoints")
        session.run(self.job.download_group)
        logger.info("Finished downloading the parameters")
        session.run(self.job.exit_group)
        logger.info("Finished running the exit group")
        return epoch

    def load_blobs_from_checkpoints(self, blob_names: list[str], epoch: int,
                                    session: Any) -> bool:
        """Load ``blob_names`` from the checkpoints of ``epoch`` (MultiNodeCheckpointManager
        only); False when a checkpoint does not exist."""
        if not self.checkpoint_manager:
            raise ValueError("Checkpoint manager is None")
        logger.info("Load blobs from checkpoints with epoch %d", epoch)
        if not hasattr(self.checkpoint_manager, "load_blobs_locally"):
            raise ValueError("Checkpoint manager does not have load_blobs_locally")
        return bool(self.checkpoint_manager.load_blobs_locally(
            self.job.nodes_to_checkpoint(), blob_names, epoch, session))

    def save_checkpoints(self, epoch: int, session: Any) -> None:
        """Save the checkpoint of ``epoch``; a failure is logged, not raised (as Caffe2)."""
        try:
            if self.checkpoint_manager.cp_accessible(epoch=None):
                logger.info("Save checkpoint %s", epoch)
                session.run(self.checkpoint_manager.save(epoch))
                self.checkpoint_manager.write_checkpoint_metadata(epoch)
                logger.info("Checkpoint %s saved", epoch)
            else:
                logger.warning("Checkpoint files cannot be accessed!")
        except Exception as ex:  # noqa: BLE001  (Caffe2: a failed save never stops training)
            logger.warning("Unable to write checkpoint for epoch %s. Error=%s", epoch, ex)


def epoch_limiter(job: Any, num_epochs: int) -> None:
    """Stop ``job`` after ``num_epochs`` epochs (a CountDown counter in the epoch group)."""
    with job.init_group:
        init_net = Net("epoch_counter_init")
        counter = init_net.CreateCounter([], init_count=num_epochs - 1)
        Task(step=init_net)
    with job.epoch_group:
        epoch_net = Net("epoch_countdown")
        finished = epoch_net.CountDown(counter)
        output = Task(step=epoch_net, outputs=finished).outputs()[0]
    job.stop_conditions.append(output)


__all__ = ["CheckpointManager", "JobRunner", "MultiNodeCheckpointManager",
           "UploadTaskGroupBuilder", "db_name", "epoch_limiter", "get_ckpt_filename"]
