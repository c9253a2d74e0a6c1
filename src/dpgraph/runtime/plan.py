"""RunPlan: execution steps over the nets of a PlanDef, with Caffe2's step semantics.

* A step runs its nets (or substeps) ``num_iter`` times; with ``should_stop_blob`` it runs
  until that bool blob is true, checked after every net or sequential substep (with
  ``num_iter`` as well, also before each iteration); ``only_once`` with a stop blob runs at
  most one iteration, and an ``only_once`` substep runs only in its parent's first
  iteration.
* ``concurrent_substeps`` runs the substeps of an iteration in threads.
* A substep with ``run_every_ms`` is a reporter: it runs every ``run_every_ms`` while its
  siblings run, and once more after they finish.  ``report_net`` runs every
  ``report_interval`` seconds while the step runs, and once at its end.
* ``create_workspace`` runs the step in a child workspace (new blobs are local, existing
  ones shared); ``num_concurrent_instances`` runs that many copies of the step at once.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.errors import WorkspaceError
from dpgraph.ops.control import shared_child_workspace
from dpgraph.proto import caffe2_pb2

_child_ids = itertools.count()


def as_plan(plan: Any) -> caffe2_pb2.PlanDef:
    """A PlanDef from a PlanDef, an ExecutionStep, an object with ``Proto()`` or bytes."""
    if hasattr(plan, "Proto") and not isinstance(plan, (caffe2_pb2.PlanDef,
                                                        caffe2_pb2.ExecutionStep)):
        if not isinstance(plan.Proto(), caffe2_pb2.PlanDef):
            from dpgraph.ir.plan import Plan

            plan = Plan(plan) if hasattr(plan, "Substeps") else plan
        plan = plan.Proto()
    if isinstance(plan, caffe2_pb2.PlanDef):
        return plan
    if isinstance(plan, caffe2_pb2.ExecutionStep):
        result = caffe2_pb2.PlanDef(name=plan.name)
        result.execution_step.add().CopyFrom(plan)
        return result
    if isinstance(plan, (bytes, str)):
        result = caffe2_pb2.PlanDef()
        result.ParseFromString(plan.encode("latin-1") if isinstance(plan, str) else plan)
        return result
    raise WorkspaceError(f"RunPlan takes a PlanDef, an ExecutionStep or a Plan, got "
                         f"{type(plan).__name__}.")


def run_plan(workspace: Any, plan: Any) -> None:
    """Create the plan's networks (replacing nets of the same name) and run its steps."""
    proto = as_plan(plan)
    net_defs = {net.name: net for net in proto.network}
    for net in proto.network:
        workspace.create_net(net, overwrite=True)
    for step in proto.execution_step:
        _StepRunner(step, net_defs).run(workspace, lambda: True)


def _should_stop(workspace: Any, blob: str) -> bool:
    if not blob or not workspace.has_blob(blob):
        return False
    value = workspace.get_blob(blob)
    if value is None:
        return False
    array = np.asarray(value)
    if array.size != 1:
        raise WorkspaceError(f"should_stop_blob {blob!r} must hold one bool, got shape "
                             f"{list(array.shape)}.")
    return bool(array.reshape(-1)[0])


def _run_net(workspace: Any, name: str, net_defs: dict[str, caffe2_pb2.NetDef]) -> None:
    """Run net ``name`` in ``workspace``, instantiating it there first if needed (a child
    workspace starts without nets)."""
    if not workspace.has_net(name):
        proto = net_defs.get(name)
        if proto is None:
            root = getattr(workspace, "_plan_root", None)
            if root is None or not root.has_net(name):
                raise WorkspaceError(f"Can't find net {name}; create it with CreateNet first "
                                     "or add it to the plan.")
            proto = root.net(name).proto
        workspace.create_net(proto, overwrite=True)
    workspace.run_net(name)


class _StepRunner:
    """One ExecutionStep and its substeps."""

    def __init__(self, step: caffe2_pb2.ExecutionStep,
                 net_defs: dict[str, caffe2_pb2.NetDef]) -> None:
        if step.substep and step.network:
            raise WorkspaceError(f"ExecutionStep {step.name!r} has both substeps and networks; "
                                 "use one or the other.")
        self.step, self.net_defs = step, net_defs
        self.substeps = [_StepRunner(s, net_defs) for s in step.substep]

    def run(self, workspace: Any, parent_continue: Callable[[], bool],
            first_parent_iteration: bool = True) -> None:
        """Run the step (all its concurrent instances) in ``workspace``."""
        if self.step.only_once and not self.step.should_stop_blob \
                and not first_parent_iteration:
            return
        instances = max(1, self.step.num_concurrent_instances)
        if instances == 1:
            self._run_instance(workspace, parent_continue)
            return
        _run_threads([functools.partial(self._run_instance, workspace, parent_continue)
                      for _ in range(instances)])

    def _run_instance(self, workspace: Any, parent_continue: Callable[[], bool]) -> None:
        if self.step.create_workspace:
            child = shared_child_workspace(workspace)
            child.name = f"{workspace.name}/{self.step.name}:{next(_child_ids)}"
            child._plan_root = getattr(workspace, "_plan_root", None) or workspace
            workspace = child
        reporter = _Reporter(self.step, workspace, self.net_defs)
        try:
            self._iterate(workspace, parent_continue)
        finally:
            reporter.stop()

    def _continue(self, workspace: Any, iteration: int,
                  parent_continue: Callable[[], bool]) -> bool:
        """Whether iteration ``iteration`` runs.  A stop blob alone is checked after each
        net or substep (as Caffe2 does), not here; with ``num_iter`` too (a dpgraph
        extension) it is also checked before each iteration."""
        if not parent_continue():
            return False
        step = self.step
        if step.should_stop_blob:
            if step.only_once and iteration > 0:
                return False
            if step.HasField("num_iter"):
                return iteration < step.num_iter and not self._stopped(workspace)
            return True
        total = step.num_iter if step.HasField("num_iter") else 1
        return iteration < total

    def _stopped(self, workspace: Any) -> bool:
        return bool(self.step.should_stop_blob) and _should_stop(workspace,
                                                                 self.step.should_stop_blob)

    def _iterate(self, workspace: Any, parent_continue: Callable[[], bool]) -> None:
        iteration = 0
        recurring = [s for s in self.substeps if not s.step.run_every_ms]
        reporters = [s for s in self.substeps if s.step.run_every_ms]
        background = _SubstepReporters(reporters, workspace)
        try:
            while self._continue(workspace, iteration, parent_continue):
                if self._run_iteration(workspace, recurring, parent_continue,
                                       first=iteration == 0):
                    break
                iteration += 1
        finally:
            background.stop()

    def _run_iteration(self, workspace: Any, recurring: list[_StepRunner],
                       parent_continue: Callable[[], bool], first: bool) -> bool:
        """One iteration; True when the stop blob ended the step."""
        for name in self.step.network:
            _run_net(workspace, name, self.net_defs)
            if self._stopped(workspace):
                return True
        if self.step.concurrent_substeps and len(recurring) > 1:
            _run_threads([functools.partial(s.run, workspace, parent_continue, first)
                          for s in recurring])
            return self._stopped(workspace)
        for sub in recurring:
            sub.run(workspace, parent_continue, first)
            if self._stopped(workspace):
                return True
        return False


class _Reporter:
    """Runs a step's ``report_net`` every ``report_interval`` seconds, and once at the end."""

    def __init__(self, step: caffe2_pb2.ExecutionStep, workspace: Any,
                 net_defs: dict[str, caffe2_pb2.NetDef]) -> None:
        self.step, self.workspace, self.net_defs = step, workspace, net_defs
        self.done = threading.Event()
        self.thread = None
        if step.report_net and step.report_interval > 0:
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(self.step.report_interval):
            _run_net(self.workspace, self.step.report_net, self.net_defs)

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        if self.step.report_net:
            _run_net(self.workspace, self.step.report_net, self.net_defs)


class _SubstepReporters:
    """Substeps with ``run_every_ms``: run periodically in threads while the siblings run,
    and once more after they finish."""

    def __init__(self, runners: list[_StepRunner], workspace: Any) -> None:
        self.runners, self.workspace = runners, workspace
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, args=(r,), daemon=True)
                        for r in runners]
        for thread in self.threads:
            thread.start()

    def _loop(self, runner: _StepRunner) -> None:
        try:
            while not self.done.wait(runner.step.run_every_ms / 1000.0):
                runner.run(self.workspace, lambda: True)
        except BaseException as error:  # noqa: BLE001 - re-raised in stop()
            self.errors.append(error)

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]
        for runner in self.runners:
            runner.run(self.workspace, lambda: True)


def _run_threads(targets: list[Callable[[], None]]) -> None:
    """Run the callables in threads; re-raise the first failure (by position)."""
    errors: list[tuple[int, BaseException]] = []

    def wrap(index: int, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append((index, error))

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True)
               for i, fn in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
