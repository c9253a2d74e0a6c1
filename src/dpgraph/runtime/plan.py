"""RunPlan: execution steps over the nets of a PlanDef.

Supported ExecutionStep fields: ``substep`` / ``network`` (one or the other), ``num_iter``
(absent: once, or until ``should_stop_blob`` when that is set), ``should_stop_blob`` (checked
before every iteration), ``concurrent_substeps`` (substeps of one iteration run in threads),
``only_once`` (a substep runs only in its parent's first iteration), ``run_every_ms`` (sleep
between iterations) and ``report_net`` (run after the step).  ``create_workspace`` and
``num_concurrent_instances > 1`` raise NotSupportedError.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from dpgraph.errors import NotSupportedError, WorkspaceError
from dpgraph.proto import caffe2_pb2


def as_plan(plan: Any) -> caffe2_pb2.PlanDef:
    """A PlanDef from a PlanDef, an ExecutionStep, an object with ``Proto()`` or bytes."""
    if hasattr(plan, "Proto") and not isinstance(plan, (caffe2_pb2.PlanDef,
                                                        caffe2_pb2.ExecutionStep)):
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
    for net in proto.network:
        workspace.create_net(net, overwrite=True)
    for step in proto.execution_step:
        _StepRunner(workspace, step).run()


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


class _StepRunner:
    """One ExecutionStep and its substeps, remembering which ``only_once`` steps ran."""

    def __init__(self, workspace: Any, step: caffe2_pb2.ExecutionStep) -> None:
        if step.substep and step.network:
            raise WorkspaceError(f"ExecutionStep {step.name!r} has both substeps and networks; "
                                 "use one or the other.")
        if step.create_workspace:
            raise NotSupportedError(f"ExecutionStep {step.name!r}: create_workspace is not "
                                    "supported by dpgraph; run the step in a WorkspaceGuard.")
        if step.num_concurrent_instances > 1:
            raise NotSupportedError(f"ExecutionStep {step.name!r}: num_concurrent_instances > 1 "
                                    "is not supported; use concurrent_substeps.")
        self.workspace, self.step = workspace, step
        self.substeps = [_StepRunner(workspace, s) for s in step.substep]
        self.ran_once = False

    def _iterations(self) -> float:
        if self.step.HasField("num_iter"):
            return self.step.num_iter
        return float("inf") if self.step.should_stop_blob else 1

    def run(self) -> None:
        step, iteration = self.step, 0
        total = self._iterations()
        while iteration < total:
            if _should_stop(self.workspace, step.should_stop_blob):
                break
            self._run_iteration(first=iteration == 0)
            iteration += 1
            if step.run_every_ms and iteration < total:
                time.sleep(step.run_every_ms / 1000.0)
        if step.report_net:
            self.workspace.run_net(step.report_net)

    def _run_iteration(self, first: bool) -> None:
        for name in self.step.network:
            self.workspace.run_net(name)
        runnable = [s for s in self.substeps if not (s.step.only_once and not first)]
        if self.step.concurrent_substeps and len(runnable) > 1:
            _run_concurrently(runnable)
        else:
            for sub in runnable:
                sub.run()


def _run_concurrently(steps: list[_StepRunner]) -> None:
    errors: list[tuple[int, BaseException]] = []

    def target(index: int, runner: _StepRunner) -> None:
        try:
            runner.run()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append((index, error))

    threads = [threading.Thread(target=target, args=(i, s), daemon=True)
               for i, s in enumerate(steps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
