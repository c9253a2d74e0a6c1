"""Caffe2's job checkpointing (``checkpoint``): CheckpointManager, MultiNodeCheckpointManager,
JobRunner, UploadTaskGroupBuilder, epoch_limiter, db_name.

A checkpoint of a node for an epoch is one DB (``<db_prefix>/<node>.<epoch>``) holding
every blob of the node's global workspace that existed after the job's init group (or the
blobs named by the checkpoint being resumed).  JobRunner runs the init group, saves epoch 0,
then runs epochs (saving after each) until a stop condition holds.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from dpgraph.ir.net import Net
from dpgraph.jobs.net_builder import ops
from dpgraph.jobs.task import Node, Task, TaskGroup, WorkspaceType, final_output

logger = logging.getLogger("dpgraph.checkpoint")


def get_ckpt_filename(node_name: str, epoch: int) -> str:
    """``<node_name>.<epoch>``."""
    return f"{node_name}.{epoch}"


def db_name(epoch: int, node_name: str, db_prefix: str, path_prefix: str | None = None
            ) -> str:
    """The checkpoint DB of ``node_name`` for ``epoch``: ``path_prefix + file name`` when a
    path prefix is given, else ``db_prefix/file name``."""
    filename = get_ckpt_filename(node_name, epoch)
    return path_prefix + filename if path_prefix else os.path.join(db_prefix, filename)


class _MetadataHandling:
    """What both checkpoint managers do through their optional metadata handler."""

    _metadata_handler: Any
    _db_prefix: str
    _db_type: str
    _path_prefix: str | None
    _path_type: str | None

    def _set_paths(self, node_names: list[str], path_prefix: str | None,
                   path_type: str | None) -> None:
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        if self._metadata_handler:
            self._metadata_handler.set_params(
                db_prefix=self._db_prefix, db_type=self._db_type, node_names=node_names,
                path_prefix=self._path_prefix, path_type=self._path_type)

    def write_checkpoint_metadata(self, epoch: int) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from: ``user_epoch``, or the metadata handler's answer."""
        if self._metadata_handler is not None:
            return self._metadata_handler.last_epoch(user_epoch=user_epoch)
        return user_epoch

    def cp_accessible(self, epoch: int | None = None) -> bool:
        if self._metadata_handler is not None:
            return bool(self._metadata_handler.cp_accessible(epoch))
        return True


class CheckpointManager(_MetadataHandling):
    """Saves and loads one node's global workspace at epoch boundaries (single node)."""

    BLOB_NAMES = "blob_names"

    def __init__(self, db_prefix: str, node_name: str, db_type: str,
                 metadata_handler: Any = None) -> None:
        self._db_prefix = db_prefix
        self._node_name = node_name
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._net = Net("!!checkpoint_mngr")
        self._blob_names = self._net.AddExternalInput(self.BLOB_NAMES)
        self._names_output: Any = None
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._current_db_name: str | None = None
        self._current_checkpoint_duration: Any = None

    def init(self, nodes: Any = None, retrieve_from_epoch: int | None = None,
             path_prefix: str | None = None, path_type: str | None = None) -> Task:
        """A task finding the blobs to checkpoint: every (non-shared) blob of the
        workspace, or the names stored in the checkpoint of ``retrieve_from_epoch``."""
        if nodes is not None and len(nodes) != 1:
            raise ValueError("CheckpointManager only supports single node.")
        with Task(outputs=[self._blob_names]) as task:
            if retrieve_from_epoch is None:
                ops.GetAllBlobNames([], self._blob_names, include_shared=False)
            else:
                full_db_name = db_name(retrieve_from_epoch, self._node_name,
                                       self._db_prefix, path_prefix)
                logger.info("Initializing checkpoints from = %s", full_db_name)
                ops.Load([], self._blob_names, db=full_db_name,
                         db_type=path_type or self._db_type, absolute_path=True,
                         keep_device=True)
        self._names_output = task.outputs()[0]
        return task

    def blob_list(self) -> list[Any]:
        if self._names_output is None:
            raise ValueError("init must be run first.")
        return self._names_output.fetch().tolist()

    def _timed_task(self, cp_op_name: str, add_op: Any) -> Task:
        with Task(name=cp_op_name) as task:
            with ops.task_init():
                timer = ops.TimerBegin([], counter_name=self._node_name)
            add_op()
            with ops.task_exit():
                time_span_blob = ops.TimerGetAndEnd(timer)
            self._current_checkpoint_duration = final_output(time_span_blob)
        return task

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Add this node's last checkpoint duration (ns) to ``stats`` under its DB name."""
        if self._current_db_name and self._current_checkpoint_duration:
            duration = self._current_checkpoint_duration.fetch()
            stats[self._current_db_name] = duration.reshape(-1)[0] if hasattr(
                duration, "reshape") else duration
        else:
            logger.info("Failed to collect checkpoint stats: %s", self._current_db_name)

    def load(self, epoch: int, path_prefix: str | None = None,
             path_type: str | None = None) -> Task:
        """A task loading every checkpointed blob from ``epoch``'s checkpoint."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix, path_prefix)
        current, db_type = self._current_db_name, path_type or self._db_type
        logger.info("Loading checkpoints from = %s", current)

        def add_op() -> None:
            ops.Load([], self.blob_list(), db=current, db_type=db_type, absolute_path=True,
                     keep_device=True)
        return self._timed_task("checkpoint_load", add_op)

    def load_blobs_from_checkpoint(self, blob_names: list[str], epoch: int) -> Task:
        """A task loading only ``blob_names`` from ``epoch``'s checkpoint."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix)
        current = self._current_db_name
        logger.info("Load from %s", current)

        def add_op() -> None:
            ops.Load([], blob_names, db=current, db_type=self._db_type, absolute_path=True,
                     allow_incomplete=True)
        return self._timed_task("checkpoint_partial_load", add_op)

    def check_db_exists(self, epoch: int) -> Task:
        """A task whose output tells whether ``epoch``'s checkpoint DB exists."""
        name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Check existence of %s", name)
        with Task() as task:
            existence = ops.Const(False)
            ops.DBExists([], [existence], db_name=name, db_type=self._db_type,
                         absolute_path=True)
            task.add_output(existence)
        return task

    def report_checkpoint_stats(self, action_name: str) -> None:
        stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, stats)

    def save(self, epoch: int) -> Task:
        """A task saving the checkpointed blobs as ``epoch``'s checkpoint."""
        self._current_db_name = db_name(epoch, self._node_name, self._db_prefix)
        current = self._current_db_name
        logger.info("Saving to %s", current)

        def add_op() -> None:
            ops.Save(self.blob_list(), [], db=current, db_type=self._db_type,
                     absolute_path=True)
        return self._timed_task("checkpoint_save", add_op)

    def set_params(self, nodes: Any, path_prefix: str | None = None,
                   path_type: str | None = None) -> None:
        self._set_paths([str(self._node_name)], path_prefix, path_type)


class MultiNodeCheckpointManager(_MetadataHandling):
    """Checkpoints every node of a job: ``init``/``load``/``save`` build task groups with
    one CheckpointManager task per node."""

    def __init__(self, db_prefix: str, db_type: str, metadata_handler: Any = None) -> None:
        self._node_managers: list[tuple[Any, CheckpointManager]] | None = None
        self._db_prefix = db_prefix
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._node_names: list[str] = []

    def _managers(self) -> list[tuple[Any, CheckpointManager]]:
        if self._node_managers is None:
            raise ValueError("init must be called first.")
        return self._node_managers

    def _task_group(self, func: Any, *args: Any, **kwargs: Any) -> TaskGroup:
        with TaskGroup(WorkspaceType.GLOBAL) as task_group:
            for node, manager in self._managers():
                with Node(node):
                    func(manager, *args, **kwargs)
        return task_group

    def _make_managers(self, nodes: list[Any]) -> None:
        self._node_managers = []
        for node in nodes:
            with Node(node):
                self._node_managers.append((node, CheckpointManager(
                    db_prefix=self._db_prefix, node_name=str(node), db_type=self._db_type)))

    def _check_nodes(self, nodes: list[Any]) -> None:
        if [node for node, _ in self._managers()] != list(nodes):
            raise ValueError(f"the checkpoint manager was initialized for other nodes than "
                             f"{list(nodes)}.")

    def init(self, nodes: list[Any], retrieve_from_epoch: int | None = None,
             path_prefix: str | None = None, path_type: str | None = None) -> TaskGroup:
        if self._node_managers is not None:
            self._check_nodes(nodes)
            return TaskGroup(WorkspaceType.GLOBAL)
        self._make_managers(nodes)
        return self._task_group(CheckpointManager.init, nodes=[nodes[-1]] if nodes else None,
                                retrieve_from_epoch=retrieve_from_epoch,
                                path_prefix=path_prefix, path_type=path_type)

    def load(self, epoch: int, path_prefix: str | None = None,
             path_type: str | None = None) -> TaskGroup:
        return self._task_group(CheckpointManager.load, epoch, path_prefix=path_prefix,
                                path_type=path_type)

    def load_blobs_locally(self, nodes: list[Any], blob_names: list[str], epoch: int,
                           session: Any) -> bool:
        """Load ``blob_names`` from every node's ``epoch`` checkpoint into the current
        workspace; False (nothing loaded further) at the first missing checkpoint."""
        if self._node_managers is not None:
            self._check_nodes(nodes)
        else:
            self._make_managers(nodes)
        for _, manager in self._managers():
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
        for node, manager in self._managers():
            if str(node) == node_name:
                return db_name(epoch, manager._node_name, manager._db_prefix)
        return None

    def report_checkpoint_stats(self, action_name: str) -> None:
        stats: dict[str, Any] = {}
        for _, manager in self._managers():
            manager.collect_checkpoint_stats(stats)
        logger.debug("checkpoint stats: %s", stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, stats)

    def save(self, epoch: int) -> TaskGroup:
        return self._task_group(CheckpointManager.save, epoch)

    def set_params(self, nodes: list[Any], path_prefix: str | None = None,
                   path_type: str | None = None) -> None:
        self._node_names = [str(node) for node in nodes]
        self._set_paths(self._node_names, path_prefix, path_type)


class UploadTaskGroupBuilder:
    """Interface: ``build(epoch, checkpoint_manager)`` returns the task group uploading
    the checkpoints (subclasses implement it)."""

    def build(self, epoch: int, checkpoint_manager: Any) -> TaskGroup:
        raise ValueError(f"{type(self).__name__} must implement `build`.")


class JobRunner:
    """Runs a Job epoch by epoch with a session, checkpointing after init and after each
    epoch when a checkpoint manager is given, or resuming from ``resume_from_epoch``
    (then the init group is not run)."""

    def __init__(self, job: Any, checkpoint_manager: Any = None,
                 resume_from_epoch: int | None = None,
                 upload_task_group_builder: Any = None) -> None:
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder

    def train(self, session: Any) -> int:
        """Run the job; returns the last epoch run."""
        manager = self.checkpoint_manager
        if manager:
            manager.set_params(nodes=self.job.nodes_to_checkpoint())
            self.resume_from_epoch = manager.get_resume_from_epoch_id(self.resume_from_epoch)
            if self.resume_from_epoch is not None:
                logger.info("Resuming from epoch %s", self.resume_from_epoch)
        from_scratch = self.resume_from_epoch is None
        if from_scratch:
            session.run(self.job.init_group)
        if manager:
            session.run(manager.init(self.job.nodes_to_checkpoint(),
                                     retrieve_from_epoch=self.resume_from_epoch))
            if from_scratch:
                self.save_checkpoints(0, session)
            else:
                session.run(manager.load(self.resume_from_epoch))
                manager.report_checkpoint_stats("checkpoint_load")
        epoch = 1 if from_scratch else int(self.resume_from_epoch) + 1  # type: ignore[arg-type]
        while True:
            logger.info("Starting epoch %d", epoch)
            session.run(self.job.epoch_group)
            stop = [output.fetch() for output in self.job.stop_conditions]
            if manager:
                self.save_checkpoints(epoch, session)
            if any(stop):
                break
            epoch += 1
        if self.upload_task_group_builder:
            session.run(self.upload_task_group_builder.build(epoch, manager))
        session.run(self.job.download_group)
        session.run(self.job.exit_group)
        return epoch

    def load_blobs_from_checkpoints(self, blob_names: list[str], epoch: int,
                                    session: Any) -> bool:
        if not self.checkpoint_manager:
            raise ValueError("Checkpoint manager is None")
        result = self.checkpoint_manager.load_blobs_locally(
            self.job.nodes_to_checkpoint(), blob_names, epoch, session)
        self.checkpoint_manager.report_checkpoint_stats("checkpoint_partial_load")
        return bool(result)

    def save_checkpoints(self, epoch: int, session: Any) -> None:
        """Save ``epoch``'s checkpoints; a failure is logged, not raised (as Caffe2)."""
        if not self.checkpoint_manager:
            raise ValueError("Checkpoint manager is None")
        try:
            if self.checkpoint_manager.cp_accessible(epoch=None):
                session.run(self.checkpoint_manager.save(epoch))
                self.checkpoint_manager.write_checkpoint_metadata(epoch)
                self.checkpoint_manager.report_checkpoint_stats("checkpoint_save")
            else:
                logger.warning("Checkpoint files cannot be accessed!")
        except Exception as error:  # noqa: BLE001 - Caffe2 keeps training
            logger.warning("Unable to write checkpoint for epoch %s. Error=%s", epoch, error)


def epoch_limiter(job: Any, num_epochs: int) -> None:
    """Make ``job`` stop after ``num_epochs`` epochs (a counter counted down per epoch)."""
    with job.init_group:
        init_net = Net("epoch_counter_init")
        counter = init_net.CreateCounter([], init_count=num_epochs - 1)
        Task(step=init_net)
    with job.epoch_group:
        epoch_net = Net("epoch_countdown")
        finished = epoch_net.CountDown(counter)
        output = Task(step=epoch_net, outputs=finished).outputs()[0]
    job.add_stop_condition(output)


__all__ = ["CheckpointManager", "JobRunner", "MultiNodeCheckpointManager",
           "UploadTaskGroupBuilder", "db_name", "epoch_limiter", "get_ckpt_filename"]
