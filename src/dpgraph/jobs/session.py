"""Caffe2's ``session``: run Tasks, TaskGroups, steps, plans and nets, and fetch the
tasks' outputs.  :class:`LocalSession` runs them in this process on a workspace."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.plan import ExecutionStep, Plan, execution_step
from dpgraph.jobs.task import Cluster, Task, TaskGroup, WorkspaceType
from dpgraph.runtime import c_api


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise NetError(message)


class CompiledRunnable:
    """A runnable compiled for one Session class."""

    def __init__(self, obj: Any, session_class: type) -> None:
        self.obj = obj
        self.session_class = session_class


class Session:
    """Runs runnables (compiled once per runnable and session class); a context manager
    that closes the session on a clean exit."""

    _compiled_cache: dict[Any, CompiledRunnable] = {}

    def __init__(self) -> None:
        self._open = True

    def is_open(self) -> bool:
        return self._open

    @classmethod
    def compile(cls, runnable: Any, workspace_type: str | None = None,
                setup_net_list: Any = None) -> CompiledRunnable:
        """Wrap a Task, TaskGroup, ExecutionStep, Plan or nets into a TaskGroup (GLOBAL
        workspace unless it is a TaskGroup) and compile it."""
        if isinstance(runnable, CompiledRunnable):
            _check(cls == runnable.session_class,
                   "Runnable was compiled for different session type. Need: "
                   f"{cls.__name__}, got: {runnable.session_class.__name__}")
            return runnable
        if runnable in cls._compiled_cache:
            return cls._compiled_cache[runnable]
        if isinstance(runnable, TaskGroup):
            if workspace_type:
                if runnable.workspace_type():
                    _check(runnable.workspace_type() == workspace_type,
                           f"Require {workspace_type} but already have "
                           f"{runnable.workspace_type()}")
                else:
                    runnable._workspace_type = workspace_type
            tg = runnable
        else:
            tg = TaskGroup(workspace_type=workspace_type or WorkspaceType.GLOBAL)
            tg.add(_as_task(runnable))
        compiled = CompiledRunnable(cls._compile_task_group(tg, setup_net_list),
                                    session_class=cls)
        cls._compiled_cache[runnable] = compiled
        return compiled

    def run(self, runnable: Any, workspace_type: str | None = None,
            setup_net_list: Any = None) -> None:
        _check(self.is_open(), "Session is closed.")
        _check(runnable is not None, "Got a none runnable.")
        self._run_compiled(self.compile(runnable, workspace_type, setup_net_list).obj)

    def close(self) -> None:
        if self.is_open():
            self._do_close()
            self._open = False

    def fetch_output(self, output: Any) -> Any:
        """The value of a task output (sessions that keep outputs elsewhere override)."""
        return output.fetch()

    def _run_compiled(self, compiled: Any) -> None:
        raise NetError(f"{type(self).__name__} cannot run task groups; use LocalSession.")

    @classmethod
    def _compile_task_group(cls, task_group: TaskGroup, setup_net_list: Any = None) -> Any:
        return task_group

    def _do_close(self) -> None:
        """Nothing to release by default."""

    def __enter__(self) -> Session:
        _check(self._open, "Session already closed.")
        return self

    def __exit__(self, ex_type: Any, value: Any, traceback: Any) -> None:
        if ex_type is None:
            self.close()


def _as_task(runnable: Any) -> Task:
    if isinstance(runnable, Task):
        return runnable
    if isinstance(runnable, ExecutionStep):
        return Task(step=runnable)
    if isinstance(runnable, Plan):
        steps = runnable.Steps()
        _check(len(steps) > 0, "Plan has no execution steps")
        return Task(step=steps[0] if len(steps) == 1 else steps)
    return Task(step=execution_step("runnable", runnable))


class LocalSession(Session):
    """Runs task groups in this process on ``ws`` (default: the current workspace); a
    PRIVATE task group runs in a child workspace of ``ws``."""

    def __init__(self, ws: Any = None) -> None:
        Session.__init__(self)
        self._ws = ws or c_api.Workspace.current

    @classmethod
    def _compile_task_group(cls, task_group: TaskGroup, setup_net_list: Any = None) -> Any:
        with Cluster():
            task = task_group.to_task()
        plan = Plan("task_group_plan")
        plan.AddStep(task.get_step())
        return plan, task.output_list(), task.workspace_type()

    def _run_compiled(self, compiled: Any) -> None:
        plan, output_list, workspace_type = compiled
        outputs = []
        for name in output_list.names():
            self._ws.create_blob(str(name))
            outputs.append(BlobReference(str(name)))
        output_list.set_values(outputs, _fetch_func=self._fetch_output)
        task_ws = (c_api.Workspace(self._ws) if workspace_type == WorkspaceType.PRIVATE
                   else self._ws)
        with c_api.WorkspaceGuard(task_ws):
            task_ws.run(plan)

    def _fetch_output(self, output: Any) -> Any:
        return self._ws.blobs[str(output)].fetch()


__all__ = ["CompiledRunnable", "LocalSession", "Session"]
