"""Caffe2's ``checkpoint.Job``: the task groups of a training job.

``init_group`` runs once (GLOBAL workspace), ``epoch_group`` runs every epoch (the tasks
created inside ``with job:`` go there), ``download_group`` and ``exit_group`` run at the
end; ``stop_conditions`` are task outputs that end the epochs.
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import BlobReference
from dpgraph.jobs.context import Managed
from dpgraph.jobs.task import Task, TaskGroup, TaskOutput, WorkspaceType


class Job(Managed):
    """A training job as task groups (see module docstring)."""

    def __init__(self, init_group: TaskGroup | None = None,
                 epoch_group: TaskGroup | None = None,
                 download_group: TaskGroup | None = None,
                 exit_group: TaskGroup | None = None,
                 stop_conditions: list[TaskOutput] | None = None,
                 nodes_to_checkpoint: list[str] | None = None) -> None:
        self.init_group = init_group or TaskGroup(workspace_type=WorkspaceType.GLOBAL)
        self.epoch_group = epoch_group or TaskGroup()
        self.download_group = download_group or TaskGroup()
        self.exit_group = exit_group or TaskGroup()
        self.stop_conditions = stop_conditions or []
        self._nodes_to_checkpoint = nodes_to_checkpoint

    def nodes_to_checkpoint(self) -> list[str]:
        return self._nodes_to_checkpoint or self.init_group.used_nodes()

    def compile(self, session_class: Any) -> None:
        """Compile every group with ``session_class``."""
        self._nodes_to_checkpoint = self.nodes_to_checkpoint()
        self.init_group = session_class.compile(self.init_group)
        self.epoch_group = session_class.compile(self.epoch_group)
        self.download_group = session_class.compile(self.download_group)
        self.exit_group = session_class.compile(self.exit_group)

    def __enter__(self) -> Job:
        super().__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.epoch_group.__exit__()
        super().__exit__(*args)

    def add_stop_condition(self, output: Any) -> None:
        """Stop the epochs once ``output`` (a bool blob or a TaskOutput) is true."""
        if isinstance(output, BlobReference):
            output = Task(outputs=[output], group=self.epoch_group).outputs()[0]
        if not isinstance(output, TaskOutput):
            raise NetError(f"add_stop_condition takes a BlobReference or a TaskOutput, got "
                           f"{type(output).__name__}")
        self.stop_conditions.append(output)


__all__ = ["Job"]
