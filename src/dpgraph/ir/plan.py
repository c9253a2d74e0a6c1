"""Execution plans: Caffe2's ``ExecutionStep``, ``Plan`` and ``execution_step`` builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import ScopedName
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2


class ExecutionStep:
    """A step of a plan: nets run ``num_iter`` times, or substeps (possibly concurrent)."""

    def __init__(self, name: str, nets: Any = None, num_iter: int | None = None) -> None:
        self._step = caffe2_pb2.ExecutionStep(name=name or "")
        self._nets: list[Any] = []
        self._substeps: list[ExecutionStep] = []
        if nets is not None:
            for net in nets if isinstance(nets, (list, tuple)) else [nets]:
                self.AddNet(net)
        if num_iter is not None:
            self.SetIter(num_iter)

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def get_all_attributes(self, name: str) -> list[Any]:
        return [a for net in self.Nets() if hasattr(net, "get_attributes")
                for a in net.get_attributes(name)]

    def Nets(self) -> list[Any]:
        """Every net of this step and its substeps."""
        return self._nets + [n for sub in self._substeps for n in sub.Nets()]

    def Substeps(self) -> list[ExecutionStep]:
        return list(self._substeps)

    def HasNets(self) -> bool:
        return bool(self._nets)

    def HasSubsteps(self) -> bool:
        return bool(self._substeps)

    def SetIter(self, num_iter: int) -> None:
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._step.num_concurrent_instances = num_concurrent_instances

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob: Any) -> None:
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net: Any, report_interval: int) -> None:
        self._nets.append(report_net)
        self._step.report_net = proto_of(report_net).name
        self._step.report_interval = report_interval

    def AddSubstep(self, substep: ExecutionStep) -> None:
        if self._step.network:
            raise NetError(f"step {self._step.name!r} already has nets; a step holds nets or "
                           "substeps, not both")
        self._substeps.append(substep)
        self._step.substep.add().CopyFrom(substep.Proto())

    def SetConcurrentSubSteps(self, concurrent_substeps: bool) -> None:
        self._step.concurrent_substeps = concurrent_substeps

    def AddNet(self, net: Any) -> None:
        if self._step.substep:
            raise NetError(f"step {self._step.name!r} already has substeps; a step holds nets "
                           "or substeps, not both")
        self._nets.append(net)
        self._step.network.append(proto_of(net).name)


class Plan:
    """A PlanDef under construction: its nets and execution steps."""

    def __init__(self, name_or_step: str | ExecutionStep) -> None:
        self._plan = caffe2_pb2.PlanDef()
        self._net_names: set[str] = set()
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Proto().name
            self.AddStep(name_or_step)
        else:
            self._plan.name = name_or_step

    def __str__(self) -> str:
        return self._plan.name

    def Proto(self) -> caffe2_pb2.PlanDef:
        return self._plan

    def AddNets(self, nets: Sequence[Any]) -> None:
        for net in nets:
            proto = proto_of(net)
            if proto.name not in self._net_names:
                self._net_names.add(proto.name)
                self._plan.network.add().CopyFrom(proto)

    def Nets(self) -> list[caffe2_pb2.NetDef]:
        return list(self._plan.network)

    def AddStep(self, step: ExecutionStep) -> None:
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self.AddNets(step.Nets())

    def Steps(self) -> list[caffe2_pb2.ExecutionStep]:
        return list(self._plan.execution_step)


def execution_step(default_name: str, steps_or_nets: Any, num_iter: int | None = None,
                   report_net: Any = None, report_interval: int | None = None,
                   concurrent_substeps: bool | None = None, should_stop_blob: Any = None,
                   only_once: bool | None = None, num_concurrent_instances: int | None = None,
                   create_workspace: bool = False, run_every_ms: int | None = None
                   ) -> ExecutionStep:
    """An ExecutionStep over nets or substeps; ``num_iter`` defaults to 1 unless a
    ``should_stop_blob`` ends the loop."""
    if num_iter is None and should_stop_blob is None:
        num_iter = 1
    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubSteps(concurrent_substeps)
    if report_net is not None:
        step.SetReportNet(report_net, report_interval or 1)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)
    items = steps_or_nets if isinstance(steps_or_nets, (list, tuple)) else [steps_or_nets]
    for item in items:
        if isinstance(item, ExecutionStep):
            step.AddSubstep(item)
        elif hasattr(item, "Proto") or isinstance(item, caffe2_pb2.NetDef):
            step.AddNet(item)
        else:
            raise NetError(f"execution_step {default_name!r}: expected nets or execution "
                           f"steps, got {type(item).__name__}")
    return step


def scoped_execution_step(name: str, *args: Any, **kwargs: Any) -> ExecutionStep:
    """``execution_step`` whose name carries the current name scope."""
    return execution_step(ScopedName(name) if name else name, *args, **kwargs)
