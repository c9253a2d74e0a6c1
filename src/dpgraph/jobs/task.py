"""Caffe2's ``task``: Tasks (an execution step with setup and outputs), TaskGroups, Nodes
and Clusters.  A Session runs a TaskGroup; ``final_output`` marks blobs to fetch after."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.net import Net
from dpgraph.ir.plan import ExecutionStep, execution_step, to_execution_step
from dpgraph.jobs.context import DefaultManaged, Managed
from dpgraph.jobs.schema import Field, from_blob_list
from dpgraph.proto import caffe2_pb2


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise NetError(message)


def _merge_node_kwargs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    if not a:
        return dict(b or {})
    if not b:
        return dict(a)
    merged = dict(a)
    merged.update(b)
    return merged


class Cluster(DefaultManaged):
    """The nodes used by the tasks created in this context (in first-use order)."""

    def __init__(self) -> None:
        self._nodes: list[str] = []
        self._node_kwargs: dict[str, dict[str, Any]] = {}

    def add_node(self, node: Node) -> None:
        if str(node) not in self._nodes:
            self._nodes.append(str(node))
        self._node_kwargs[str(node)] = _merge_node_kwargs(node.kwargs(),
                                                          self._node_kwargs.get(str(node)))

    def nodes(self) -> list[str]:
        return self._nodes

    def node_kwargs(self) -> dict[str, dict[str, Any]]:
        return self._node_kwargs

    def __repr__(self) -> str:
        return f"Cluster(nodes={self.nodes()}, node_kwargs={self.node_kwargs()})"


class Node(DefaultManaged):
    """A named node tasks run on (``'local'`` by default); registers with the Cluster."""

    def __init__(self, node: Any = "local", **kwargs: Any) -> None:
        self._name = str(node)
        self._kwargs = kwargs
        Cluster.current().add_node(self)

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Node(name={self._name}, kwargs={self._kwargs})"

    def kwargs(self) -> dict[str, Any]:
        return self._kwargs


class WorkspaceType:
    """PRIVATE tasks run in a child workspace; GLOBAL tasks in the session's."""

    PRIVATE = "private"
    GLOBAL = "global"


def get_setup_nets(key: str, steps_or_nets: list[Any], target: Any
                   ) -> tuple[list[Any], list[Any]]:
    """The init and exit nets/steps of the setup objects attached under ``key``."""
    init_net = Net(key + "/init")
    exit_net = Net(key + "/exit")
    init_nets: list[Any] = []
    exit_nets: list[Any] = []
    objs: list[Any] = []
    for step_or_net in steps_or_nets:
        if hasattr(step_or_net, "get_all_attributes"):
            objs += step_or_net.get_all_attributes(key)
        elif hasattr(step_or_net, "get_attributes"):
            objs += step_or_net.get_attributes(key)
    for obj in objs:
        if getattr(obj, "_setup_used", False):
            continue
        if hasattr(obj, "_setup_target") and obj._setup_target != target:
            continue
        for method, net, result in (("setup", init_net, init_nets),
                                    ("exit", exit_net, exit_nets)):
            if hasattr(obj, method):
                _extend_setup(result, getattr(obj, method)(net))
                obj._setup_used = True
    if init_net.Proto().op:
        init_nets.insert(0, init_net)
    if exit_net.Proto().op:
        exit_nets.insert(0, exit_net)
    return init_nets, exit_nets


def _extend_setup(result: list[Any], nets: Any) -> None:
    if isinstance(nets, (list, tuple)):
        result += nets
    elif isinstance(nets, (Net, ExecutionStep)):
        result.append(nets)
    elif nets is not None:
        raise TypeError(f"Unsupported type for setup: {type(nets)}")


def add_setup_steps(step: ExecutionStep, init_nets: list[Any], exit_nets: list[Any],
                    name: str) -> ExecutionStep:
    """``step`` between ``<name>:init`` and ``<name>:exit`` steps (if any)."""
    if not init_nets and not exit_nets:
        return step
    steps = []
    if init_nets:
        steps.append(execution_step(f"{name}:init", init_nets))
    steps.append(step)
    if exit_nets:
        steps.append(execution_step(f"{name}:exit", exit_nets))
    return execution_step(name, steps)


class TaskGroup(Managed):
    """Tasks run together (concurrently per node) by a Session."""

    LOCAL_SETUP = "local_setup"

    def __init__(self, workspace_type: str | None = None) -> None:
        self._plan_cache = None
        self._tasks: list[Task] = []
        self._already_used = False
        self._prev_active = None
        self._tasks_to_add: list[Task] = []
        self._report_nets: dict[str, tuple[Any, int]] = {}
        self._report_steps: list[tuple[str, ExecutionStep]] = []
        self._workspace_type = workspace_type
        self._tasks_by_node: tuple[TaskGroup, dict[str, str]] | None = None
        self._remote_nets: list[Any] = []

    def add_remote_net(self, net: Any) -> None:
        self._remote_nets.append(net)

    def remote_nets(self) -> list[Any]:
        return self._remote_nets

    def add(self, task: Task) -> None:
        _check(not self._already_used, "Cannot add Task to an already used TaskGroup.")
        _check(self._workspace_type is None or task._workspace_type is None
               or self._workspace_type == task._workspace_type,
               f"Task {task.name} has workspace type {task._workspace_type}, the group "
               f"{self._workspace_type}")
        if task._workspace_type is None:
            task._workspace_type = self._workspace_type or WorkspaceType.PRIVATE
        if self._workspace_type is None:
            self._workspace_type = task._workspace_type
        task._notify_used()
        self._tasks.append(task)

    def tasks(self) -> list[Task]:
        for task in self._tasks_to_add:
            self.add(task)
        self._tasks_to_add = []
        self._already_used = True
        return self._tasks

    def num_registered_tasks(self) -> int:
        return len(self._tasks_to_add) + len(self._tasks)

    def used_nodes(self) -> list[str]:
        used: list[str] = []
        for task in self._tasks + self._tasks_to_add:
            if task.node not in used:
                used.append(task.node)
        return used

    def report_step(self, step: Any = None, node: Any = None, interval_ms: int = 1000) -> None:
        """Run ``step`` every ``interval_ms`` on each node while the group runs (and at
        least once after the node's tasks finish)."""
        step = to_execution_step(step)
        step.RunEveryMillis(interval_ms)
        self._report_steps.append((str(node or Node.current(node)), step))

    def report_net(self, net: Any = None, node: Any = None, report_interval: int = 5) -> Any:
        """Deprecated: use report_step."""
        node = str(node or Node.current(node))
        _check(net is None or node not in self._report_nets,
               f"node {node} already has a report net")
        if node not in self._report_nets:
            self._report_nets[node] = (net if net else Net(f"{node}/reporter"),
                                       report_interval)
        return self._report_nets[node][0]

    def tasks_by_node(self, node_remap: Any = None) -> TaskGroup:
        """One task per node ('grouped_by_node') running that node's tasks concurrently,
        between the node's LOCAL_SETUP init and exit nets."""
        node_map = {}
        for task in self.tasks():
            node_map[task.node] = node_remap(task.node) if node_remap else task.node
        if self._tasks_by_node is not None:
            grouped, previous_map = self._tasks_by_node
            _check(previous_map == node_map, "Cannot call tasks_by_node multiple times.")
            return grouped
        for node, (net, interval) in self._report_nets.items():
            self.report_step(net, node=node, interval_ms=interval * 1000)
        self._report_nets = {}
        by_node: defaultdict[str, list[Task]] = defaultdict(list)
        for task in self.tasks():
            by_node[node_map[task.node]].append(task)
        reports: defaultdict[str, list[ExecutionStep]] = defaultdict(list)
        for original, step in self._report_steps:
            reports[node_map.get(original, original)].append(step)
        grouped = TaskGroup()
        for node, tasks in by_node.items():
            self._group_node(grouped, node, tasks, reports[node])
        self._tasks_by_node = (grouped, node_map)
        return grouped

    def _group_node(self, grouped: TaskGroup, node: str, tasks: list[Task],
                    report_steps: list[ExecutionStep]) -> None:
        inits, exits = get_setup_nets(TaskGroup.LOCAL_SETUP,
                                      [t.get_step() for t in tasks] + report_steps, self)
        steps = list(report_steps)
        outputs: list[TaskOutput] = []
        workspace_type = WorkspaceType.PRIVATE
        for task in tasks:
            step = task.get_step()
            step.SetCreateWorkspace(task.workspace_type() == WorkspaceType.PRIVATE)
            steps.append(step)
            outputs += task.outputs()
            if task.workspace_type() == WorkspaceType.GLOBAL:
                workspace_type = WorkspaceType.GLOBAL
        if not steps:
            steps.append(execution_step("empty", []))
        body = steps[0] if len(steps) == 1 else execution_step(
            f"{node}:body", steps, concurrent_substeps=True)
        if inits or exits:
            parts = []
            if inits:
                parts.append(execution_step(f"{node}:init", inits))
            parts.append(body)
            if exits:
                parts.append(execution_step(f"{node}:exit", exits))
            body = execution_step(node, parts)
        Task(node=node, step=body, outputs=outputs, name="grouped_by_node", group=grouped,
             workspace_type=workspace_type)

    def to_task(self, node: Any = None) -> Task:
        """All the group's tasks as one Task on ``node``."""
        node = str(Node.current(node))
        tasks = self.tasks_by_node(lambda x: node).tasks()
        if not tasks:
            return Task()
        return tasks[0]

    def workspace_type(self) -> str | None:
        return self._workspace_type

    def __repr__(self) -> str:
        return (f"TaskGroup(tasks={self._tasks + self._tasks_to_add}, "
                f"workspace_type={self.workspace_type()}, remote_nets={self.remote_nets()})")


class TaskOutput:
    """A blob, list of blobs or record a task returns; its value after a run."""

    def __init__(self, names: Any) -> None:
        self._schema: Field | None = None
        if isinstance(names, Field):
            self._schema = names
            names = names.field_blobs()
        self._is_scalar = type(names) not in (tuple, list)
        self.names = [names] if self._is_scalar else list(names)
        self._values: Any = None
        self._fetch_func: Any = None

    def set(self, values: Any, _fetch_func: Any = None) -> None:
        _check(len(values) == len(self.names), "wrong number of output values")
        self._values = values
        self._fetch_func = _fetch_func

    def _shape(self, values: list[Any]) -> Any:
        if self._is_scalar:
            return values[0]
        if self._schema is not None:
            return from_blob_list(self._schema, values)
        return values

    def get(self) -> Any:
        _check(self._values is not None, "Output value not set yet.")
        return self._shape(self._values)

    def fetch(self) -> Any:
        """The output's value(s), fetched from the session's workspace."""
        _check(self._fetch_func is not None, "Cannot fetch value for this output.")
        return self._shape([self._fetch_func(v) for v in self._values])

    def __repr__(self) -> str:
        return f"TaskOutput(names={self.names}, values={self._values})"


def final_output(blob_or_record: Any) -> TaskOutput:
    """Return ``blob_or_record`` from the current Task (or a new Task) to the client."""
    task = Task.current(required=False) or Task()
    return task.add_output(blob_or_record)


class TaskOutputList:
    """The outputs of a task, set from one flat list of values."""

    def __init__(self, outputs: list[TaskOutput] | None = None) -> None:
        self.outputs = outputs or []

    def names(self) -> list[Any]:
        names: list[Any] = []
        for output in self.outputs:
            names += output.names
        return names

    def set_values(self, values: list[Any], _fetch_func: Any = None) -> None:
        offset = 0
        for output in self.outputs:
            count = len(output.names)
            output.set(values[offset:offset + count], _fetch_func)
            offset += count
        _check(offset == len(values), "Wrong number of output values.")

    def __repr__(self) -> str:
        return f"TaskOutputList(outputs={self.outputs})"


class Task(Managed):
    """An execution step (built in a ``with Task():`` block or given) with task-level and
    instance-level setup, outputs, a node and a workspace type."""

    TASK_SETUP = "task_setup"
    TASK_INSTANCE_SETUP = "task_instance_setup"
    REPORT_STEP = "report_step"
    _global_names_used: set[str] = set()

    @staticmethod
    def _get_next_name(node: str, group: TaskGroup | None, name: str) -> str:
        basename = f"{node}/{name}"
        used = Task._global_names_used if group is None else {
            t.name for t in group._tasks_to_add}
        current, index = basename, 0
        while current in used:
            index += 1
            current = f"{basename}:{index}"
        return current

    def __init__(self, step: Any = None, outputs: Any = None, workspace_type: str | None = None,
                 group: TaskGroup | None = None, node: Any = None, name: str | None = None,
                 num_instances: int | None = None) -> None:
        if not name and isinstance(step, ExecutionStep):
            name = step.Proto().name
        if not name:
            name = "task"
        self.node = str(Node.current(None if node is None else Node(node)))
        self.group = TaskGroup.current(group, required=False)
        self.name = Task._get_next_name(self.node, self.group, name)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._already_used = False
        self._step: ExecutionStep | None = None
        self._step_with_setup: ExecutionStep | None = None
        self._outputs: list[TaskOutput] = []
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)
        self._pipeline = None
        self._is_pipeline_context = False
        self._workspace_type = workspace_type
        self._report_net = None
        self._num_instances = num_instances
        self._net_builder: Any = None

    def __enter__(self) -> Task:
        super().__enter__()
        if self.group is not None:
            self.group._tasks_to_add.remove(self)
        self._assert_not_used()
        _check(self._step is None, "This Task already has an execution step.")
        from dpgraph.jobs.net_builder import NetBuilder

        self._net_builder = NetBuilder(_fullname=self.name)
        self._net_builder.__enter__()
        return self

    def __exit__(self, etype: Any, value: Any, traceback: Any) -> None:
        super().__exit__(etype, value, traceback)
        self._net_builder.__exit__(etype, value, traceback)
        if etype is None:
            self.set_step(self._net_builder)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._net_builder = None

    def workspace_type(self) -> str | None:
        return self._workspace_type

    def _assert_not_used(self) -> None:
        _check(not self._already_used, "Cannot modify task since it is already been used.")

    def add_output(self, output: Any) -> TaskOutput:
        self._assert_not_used()
        output = output if isinstance(output, TaskOutput) else TaskOutput(output)
        self._outputs.append(output)
        return output

    def add_outputs(self, outputs: Any) -> Any:
        self._assert_not_used()
        if type(outputs) not in (list, tuple):
            return self.add_output(outputs)
        return [self.add_output(output) for output in outputs]

    def set_step(self, step: Any) -> None:
        self._assert_not_used()
        self._step = to_execution_step(step)

    def get_step(self) -> ExecutionStep:
        """The task's full step (report steps, setup and output nets, instances); cached."""
        if self._step_with_setup is not None:
            return self._step_with_setup
        if self._step is None:
            self._step_with_setup = execution_step(self.name, [])
            return self._step_with_setup
        report_steps = [s for s in self._step.get_all_attributes(Task.REPORT_STEP)
                        if not hasattr(s, "_report_step_used")]
        for step in report_steps:
            step._report_step_used = True
            if not step.Proto().run_every_ms:
                step.RunEveryMillis(1000)
        task_init, task_exit = get_setup_nets(Task.TASK_SETUP, [self._step] + report_steps,
                                              self)
        inst_init, inst_exit = get_setup_nets(Task.TASK_INSTANCE_SETUP,
                                              [self._step] + report_steps, self)
        if not self._outputs:
            output_net = Net(f"{self.name}:output")
            self.add_output(output_net.ConstantFill([], 1, dtype=caffe2_pb2.TensorProto.INT32,
                                                    value=0))
            task_exit.append(output_net)
        body = self._step if not report_steps else execution_step(
            f"{self.name}:body", report_steps + [self._step])
        with_instance = add_setup_steps(body, inst_init, inst_exit, self.name + ":instance")
        if self._num_instances and self._num_instances > 1:
            with_instance.SetCreateWorkspace(True)
            with_instance = execution_step("%s:parallel", [with_instance],
                                           num_concurrent_instances=self._num_instances)
        self._step_with_setup = add_setup_steps(with_instance, task_init, task_exit, self.name)
        return self._step_with_setup

    def output_list(self) -> TaskOutputList:
        return TaskOutputList(self._outputs)

    def outputs(self) -> list[TaskOutput]:
        return self._outputs

    def _notify_used(self) -> None:
        self.get_step()
        self._already_used = True

    def __repr__(self) -> str:
        return f"Task(name={self.name}, node={self.node}, outputs={self.outputs()})"


class SetupNets:
    """Nets run once at the start (``init_nets``) and end (``exit_nets``) of the Task or
    TaskGroup whose nets carry this object as a TASK_SETUP / LOCAL_SETUP attribute."""

    def __init__(self, init_nets: Any = None, exit_nets: Any = None) -> None:
        self.init_nets = init_nets
        self.exit_nets = exit_nets

    def setup(self, init_net: Any) -> Any:
        return self.init_nets

    def exit(self, exit_net: Any) -> Any:
        return self.exit_nets

    def __repr__(self) -> str:
        return f"SetupNets(init_nets={self.init_nets}, exit_nets={self.exit_nets})"


__all__ = ["Cluster", "Node", "SetupNets", "Task", "TaskGroup", "TaskOutput",
           "TaskOutputList", "WorkspaceType", "add_setup_steps", "final_output",
           "get_setup_nets"]
