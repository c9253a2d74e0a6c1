"""Caffe2's ``task``: Task, TaskGroup, Node, Cluster, TaskOutput and final_output."""

from dpgraph.jobs.task import (
    Cluster,
    Node,
    SetupNets,
    Task,
    TaskGroup,
    TaskOutput,
    TaskOutputList,
    WorkspaceType,
    add_setup_steps,
    final_output,
    get_setup_nets,
)

__all__ = ["Cluster", "Node", "SetupNets", "Task", "TaskGroup", "TaskOutput",
           "TaskOutputList", "WorkspaceType", "add_setup_steps", "final_output",
           "get_setup_nets"]
