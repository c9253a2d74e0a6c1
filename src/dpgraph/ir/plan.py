"""Execution plans: Caffe2's ``ExecutionStep``, ``Plan``, ``execution_step`` and
``to_execution_step``.

A step holds nets or substeps (not both).  Once a step is added to a plan or to another
step it is "used" and can no longer be changed.  Nets are kept by name: two different Net
objects with one name in the same step or plan are an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import BlobReference, ScopedName
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2


def _net_name(net: Any) -> str:
    return net if isinstance(net, str) else proto_of(net).name


def _add_net_to_dict(net_dict: OrderedDict[str, Any], net: Any) -> bool:
    """Record ``net`` under its name; False if that name is already there (the same net)."""
    name = _net_name(net)
    if name in net_dict:
        if net_dict[name] is not None and net is not net_dict[name]:
            raise NetError(f"Different nets with same name: {name}")
        return False
    net_dict[name] = None if isinstance(net, str) else net
    return True


def _is_net(item: Any) -> bool:
    return isinstance(item, caffe2_pb2.NetDef) or (
        hasattr(item, "Proto") and isinstance(item.Proto(), caffe2_pb2.NetDef))


class ExecutionStep:
    """A step of a plan: nets run ``num_iter`` times (or until ``should_stop_blob``), or
    substeps, possibly concurrent."""

    _step_names_used: set[str] = set()

    @staticmethod
    def _get_next_step_name(basename: str) -> str:
        name, index = basename, 1
        while name in ExecutionStep._step_names_used:
            name, index = f"{basename}_{index}", index + 1
        ExecutionStep._step_names_used.add(name)
        return name

    def __init__(self, name: str | None = None, nets: Any = None,
                 num_iter: int | None = None) -> None:
        self._step = caffe2_pb2.ExecutionStep()
        self._step.name = name or ExecutionStep._get_next_step_name("step")
        self._net_dict: OrderedDict[str, Any] = OrderedDict()
        self._is_used = False
        self._substeps: list[ExecutionStep] = []
        if nets is not None:
            for net in nets if isinstance(nets, (list, tuple)) else [nets]:
                if _add_net_to_dict(self._net_dict, net):
                    self._step.network.append(_net_name(net))
        if num_iter is not None:
            self._step.num_iter = num_iter

    def get_net(self, name: str) -> Any:
        return self._net_dict[name]

    def Name(self) -> str:
        return self._step.name

    def __str__(self) -> str:
        return self._step.name

    def _assert_can_mutate(self) -> None:
        if self._is_used:
            raise NetError(f"Cannot mutate a step that has already been added to a plan/step "
                           f"(step {self._step.name!r}); build a new step instead.")

    def _notify_is_used(self) -> None:
        self._is_used = True

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def HasNets(self) -> bool:
        return len(self._step.network) > 0

    def HasSubsteps(self) -> bool:
        return len(self._step.substep) > 0

    def Nets(self) -> list[Any]:
        """The nets of this step and of its substeps, in order of addition."""
        return list(self._net_dict.values())

    def Substeps(self) -> list[ExecutionStep]:
        return self._substeps

    def SetIter(self, num_iter: int) -> None:
        self._assert_can_mutate()
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._assert_can_mutate()
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._assert_can_mutate()
        self._step.num_concurrent_instances = num_concurrent_instances

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._assert_can_mutate()
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob: Any) -> None:
        if not isinstance(should_stop_blob, (BlobReference, str)):
            raise NetError(f"expects BlobReference here, got {type(should_stop_blob)}")
        self._assert_can_mutate()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        """Run this step every ``interval`` ms while its siblings run, and once more after
        they finish (ignored for top-level steps)."""
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net: Any, report_interval: int) -> None:
        """Deprecated: use RunEveryMillis."""
        self._assert_can_mutate()
        _add_net_to_dict(self._net_dict, report_net)
        self._step.report_net = _net_name(report_net)
        self._step.report_interval = report_interval

    def AddSubstep(self, substep: Any) -> ExecutionStep:
        self._assert_can_mutate()
        if self.HasNets():
            raise NetError(f"Cannot have both network and substeps (step "
                           f"{self._step.name!r}).")
        if isinstance(substep, ExecutionStep):
            substep._notify_is_used()
            if not substep.HasNets() and not substep.HasSubsteps():
                return self
            for net in substep.Nets():
                _add_net_to_dict(self._net_dict, net)
            self._substeps.append(substep)
            proto = substep.Proto()
        else:
            proto = substep
        self._step.substep.add().CopyFrom(proto)
        return self

    def SetConcurrentSubSteps(self, concurrent_substeps: bool) -> None:
        self._assert_can_mutate()
        if self.HasNets():
            raise NetError("Cannot have both network and substeps.")
        self._step.concurrent_substeps = concurrent_substeps

    SetConcurrentSubsteps = SetConcurrentSubSteps

    def AddNet(self, net: Any) -> ExecutionStep:
        self._assert_can_mutate()
        if self.HasSubsteps():
            raise NetError(f"Cannot have both network and substeps (step "
                           f"{self._step.name!r}).")
        if not _is_net(net):
            raise NetError(f"AddNet takes a Net, got {type(net).__name__}")
        _add_net_to_dict(self._net_dict, net)
        self._step.network.append(_net_name(net))
        return self

    def get_all_attributes(self, name: str) -> list[Any]:
        """Every attribute ``name`` of the nets used by this step and its substeps."""
        return [attr for net in self._net_dict.values()
                if hasattr(net, "get_attributes") for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, step_proto: caffe2_pb2.ExecutionStep,
                          net_obj_dict: dict[str, Any],
                          net_proto_dict: dict[str, caffe2_pb2.NetDef]) -> ExecutionStep:
        """An ExecutionStep (recursively) from its proto and the plan's nets."""
        from dpgraph.ir.net import Net

        if bool(step_proto.network) == bool(step_proto.substep):
            raise NetError(f"step {step_proto.name!r} must have either nets or substeps")
        steps_or_nets: list[Any] = []
        if step_proto.substep:
            steps_or_nets = [cls.create_from_proto(s, net_obj_dict, net_proto_dict)
                             for s in step_proto.substep]
        else:
            for net_name in step_proto.network:
                if net_name not in net_obj_dict:
                    if net_name not in net_proto_dict:
                        raise NetError(f"step {step_proto.name!r} uses net {net_name!r}, "
                                       "which the plan does not hold")
                    net_obj_dict[net_name] = Net(net_proto_dict[net_name])
                steps_or_nets.append(net_obj_dict[net_name])

        def opt(field: str) -> Any:
            return getattr(step_proto, field) if step_proto.HasField(field) else None

        stop = opt("should_stop_blob")
        return execution_step(
            step_proto.name, steps_or_nets, num_iter=opt("num_iter"),
            concurrent_substeps=opt("concurrent_substeps"),
            should_stop_blob=BlobReference(stop) if stop is not None else None,
            only_once=opt("only_once"), num_concurrent_instances=opt("num_concurrent_instances"),
            create_workspace=opt("create_workspace"), run_every_ms=opt("run_every_ms"))


def add_nets_in_order(step: ExecutionStep, net_list: list[str]) -> None:
    """Net names in order of use: substeps first (recursively), then the step's own nets,
    then its report net."""
    proto = step.Proto()
    for substep in step.Substeps():
        add_nets_in_order(substep, net_list)
    for net in proto.network:
        if net not in net_list:
            net_list.append(net)
    if proto.report_net and proto.report_net not in net_list:
        net_list.append(proto.report_net)


class Plan:
    """A PlanDef under construction: its nets and execution steps."""

    def __init__(self, name_or_step: str | ExecutionStep) -> None:
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict: OrderedDict[str, Any] = OrderedDict()
        self._steps: list[ExecutionStep] = []
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, str):
            self._plan.name = name_or_step
        else:
            raise NetError(f"name_or_step must be a string or ExecutionStep, got "
                           f"{type(name_or_step).__name__}")

    def __str__(self) -> str:
        return self._plan.name

    def Proto(self) -> caffe2_pb2.PlanDef:
        return self._plan

    def AddNets(self, nets: Sequence[Any]) -> None:
        for net in nets:
            if net is None:
                continue
            if _add_net_to_dict(self._net_dict, net):
                self._plan.network.add().CopyFrom(proto_of(net))

    def Nets(self) -> list[Any]:
        return list(self._net_dict.values())

    def AddStep(self, step: ExecutionStep) -> None:
        if not isinstance(step, ExecutionStep):
            raise NetError(f"AddStep takes an ExecutionStep, got {type(step).__name__}")
        step._notify_is_used()
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        net_list: list[str] = []
        add_nets_in_order(step, net_list)
        self.AddNets([step.get_net(n) for n in net_list])

    def Steps(self) -> list[ExecutionStep]:
        return self._steps

    def get_all_attributes(self, name: str) -> list[Any]:
        return [attr for step in self.Steps() for attr in step.get_all_attributes(name)]

    @classmethod
    def create_from_proto(cls, plan_proto: caffe2_pb2.PlanDef) -> Plan:
        if not isinstance(plan_proto, caffe2_pb2.PlanDef):
            raise NetError("Plan.create_from_proto takes a PlanDef")
        plan = Plan(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]
        net_obj_dict: dict[str, Any] = {}
        net_proto_dict: dict[str, caffe2_pb2.NetDef] = {}
        for net_proto in plan_proto.network:
            if net_proto.name in net_proto_dict:
                raise NetError(f"plan {plan_proto.name!r} holds two nets named "
                               f"{net_proto.name!r}")
            net_proto_dict[net_proto.name] = net_proto
        for step_proto in plan_proto.execution_step:
            plan.AddStep(ExecutionStep.create_from_proto(step_proto, net_obj_dict,
                                                         net_proto_dict))
        return plan


def execution_step(default_name: str | None, steps_or_nets: Any, num_iter: int | None = None,
                   report_net: Any = None, report_interval: int | None = None,
                   concurrent_substeps: bool | None = None, should_stop_blob: Any = None,
                   only_once: bool | None = None, num_concurrent_instances: int | None = None,
                   create_workspace: bool = False, run_every_ms: int | None = None
                   ) -> ExecutionStep:
    """An ExecutionStep over a step, a net, a list of nets, or a mixed list (each item then
    becomes a substep); ``num_iter`` defaults to 1 unless a ``should_stop_blob`` is set."""
    if should_stop_blob is not None and num_iter is not None:
        raise NetError("Cannot set both should_stop_blob and num_iter.")
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
        if report_interval is None:
            raise NetError("execution_step: report_net needs a report_interval")
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)
    _add_children(step, default_name, steps_or_nets)
    return step


def _add_children(step: ExecutionStep, name: Any, steps_or_nets: Any) -> None:
    if isinstance(steps_or_nets, ExecutionStep):
        step.AddSubstep(steps_or_nets)
    elif _is_net(steps_or_nets):
        step.AddNet(steps_or_nets)
    elif isinstance(steps_or_nets, (list, tuple)):
        if all(_is_net(x) for x in steps_or_nets):
            for net in steps_or_nets:
                step.AddNet(net)
        else:
            for item in steps_or_nets:
                step.AddSubstep(to_execution_step(item))
    elif steps_or_nets:
        raise NetError(f"execution_step {name!r}: steps_or_nets must be a step, a net, or a "
                       f"list of nets or steps, got {type(steps_or_nets).__name__}")


def scoped_execution_step(name: str, *args: Any, **kwargs: Any) -> ExecutionStep:
    """``execution_step`` whose name carries the current name scope."""
    return execution_step(ScopedName(name) if name else name, *args, **kwargs)


def to_execution_step(step_or_nets: Any, default_name: str | None = None) -> ExecutionStep:
    """An ExecutionStep from a step (as is), a NetBuilder (its children, stopping on its
    stop blob), a net or a list of nets/steps."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets
    stop_blob = None
    if not default_name and hasattr(step_or_nets, "name"):
        default_name = step_or_nets.name
    if hasattr(step_or_nets, "_stop_blob") and hasattr(step_or_nets, "get"):
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    if not (_is_net(step_or_nets) or isinstance(step_or_nets, (list, tuple))):
        raise NetError(f"to_execution_step: cannot make a step from "
                       f"{type(step_or_nets).__name__} {step_or_nets!r}")
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)
