"""Caffe2's ``control``: control flow between nets as execution steps (Do, DoParallel,
For, While, Until, DoWhile, DoUntil, Switch, If, IfNot) and condition-net helpers.

A condition is a bool blob, or a net whose last external output is that blob (the net
then runs before the condition is read).  Loops stop through ``should_stop_blob``.
"""

from __future__ import annotations

import itertools
from typing import Any

from dpgraph.errors import NetError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.net import Net
from dpgraph.ir.plan import ExecutionStep, scoped_execution_step
from dpgraph.proto import caffe2_pb2

_index = itertools.count(1)
_used_step_names: set[str] = set()


def _get_next_step_name(control_name: str, base_name: str) -> str:
    """``<base>/<control>``, made unique with ``_<n>``."""
    concat = f"{base_name}/{control_name}"
    name = concat
    while name in _used_step_names:
        name = f"{concat}_{next(_index)}"
    _used_step_names.add(name)
    return name


def _MakeList(items: tuple[Any, ...]) -> list[Any]:
    """``(a, b)`` -> [a, b]; ``(a,)`` -> [a]; ``([a, b],)`` -> [a, b]."""
    if not items:
        raise ValueError("input cannot be empty.")
    if len(items) == 1:
        return items[0] if isinstance(items[0], list) else [items[0]]
    return list(items)


def _IsNets(nets_or_steps: Any) -> bool:
    if isinstance(nets_or_steps, list):
        return all(isinstance(n, Net) for n in nets_or_steps)
    return isinstance(nets_or_steps, Net)


def _PrependNets(nets_or_steps: Any, *nets: Any) -> list[Any]:
    items = _MakeList((nets_or_steps,))
    extra = _MakeList(nets)
    return extra + items if _IsNets(items) else [Do("prepend", extra)] + items


def _AppendNets(nets_or_steps: Any, *nets: Any) -> list[Any]:
    items = _MakeList((nets_or_steps,))
    extra = _MakeList(nets)
    return items + extra if _IsNets(items) else items + [Do("append", extra)]


def GetConditionBlobFromNet(condition_net: Net) -> BlobReference:
    """The condition of a condition net: its last external output (a single bool)."""
    outputs = condition_net.Proto().external_output
    if not outputs:
        raise NetError(f"Condition net {condition_net.Proto().name} must has at least one "
                       "external output")
    return BlobReference(outputs[-1])


def BoolNet(*blobs_with_bool_value: Any) -> Net:
    """A net ``bool_net`` setting each ``(blob, value)`` to a bool scalar."""
    bool_net = Net("bool_net")
    for blob, value in _MakeList(blobs_with_bool_value):
        out = bool_net.ConstantFill([], [blob], shape=[], value=value,
                                    dtype=caffe2_pb2.TensorProto.BOOL)
        bool_net.AddExternalOutput(out)
    return bool_net


def NotNet(condition_blob_or_net: Any) -> tuple[Net, BlobReference]:
    """``(not_net, out)``: a net computing ``out = Not(condition)``."""
    condition = (GetConditionBlobFromNet(condition_blob_or_net)
                 if isinstance(condition_blob_or_net, Net) else condition_blob_or_net)
    not_net = Net("not_net")
    out = not_net.Not(condition)
    not_net.AddExternalOutput(out)
    return not_net, out


def Not(condition_blob_or_net: Any) -> tuple[Net, BlobReference]:
    return NotNet(condition_blob_or_net)


def _CopyConditionBlobNet(condition_blob: Any) -> tuple[Net, BlobReference]:
    net = Net("copy_condition_blob_net")
    out = net.Copy(condition_blob)
    net.AddExternalOutput(out)
    return net, out


def MergeConditionNets(name: str, condition_nets: Any, relation: str) -> Any:
    """One net running all ``condition_nets`` and combining their conditions with
    ``relation`` ('And' or 'Or') into its last external output."""
    if not isinstance(condition_nets, list):
        return condition_nets
    if len(condition_nets) <= 1:
        return condition_nets[0] if condition_nets else None
    merged = Net(name)
    last = None
    for i, net in enumerate(condition_nets):
        proto = net.Proto()
        if proto.device_option != merged.Proto().device_option or \
                proto.type != merged.Proto().type:
            raise NetError(f"MergeConditionNets({name}): net {proto.name} has another "
                           "device option or net type.")
        merged.Proto().op.extend(proto.op)
        merged.Proto().external_input.extend(proto.external_input)
        current = GetConditionBlobFromNet(net)
        last = current if i == 0 else getattr(merged, relation)([last, current])
    for key, values in condition_nets[-1]._attr_dict.items():
        merged._attr_dict[key] += values
    merged.AddExternalOutput(last)
    return merged


def CombineConditions(name: str, condition_nets: Any, relation: str) -> Any:
    """A net combining the conditions of ``condition_nets`` (without running them)."""
    if not condition_nets:
        return None
    if not isinstance(condition_nets, list):
        raise ValueError("condition_nets must be a list of nets.")
    if len(condition_nets) == 1:
        return _CopyConditionBlobNet(GetConditionBlobFromNet(condition_nets[0]))[0]
    combined = Net(name)
    last = None
    for i, net in enumerate(condition_nets):
        current = GetConditionBlobFromNet(net)
        last = current if i == 0 else getattr(combined, relation)([last, current])
    combined.AddExternalOutput(last)
    return combined


def Do(name: str, *nets_or_steps: Any) -> ExecutionStep:
    """Run the nets or steps once, in order."""
    items = _MakeList(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], ExecutionStep):
        return items[0]
    return scoped_execution_step(_get_next_step_name("Do", name), items)


def DoParallel(name: str, *nets_or_steps: Any) -> ExecutionStep:
    """Run the nets or steps once, concurrently."""
    items = _MakeList(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], ExecutionStep):
        return items[0]
    return scoped_execution_step(_get_next_step_name("DoParallel", name), items,
                                 concurrent_substeps=True)


def _RunOnceIf(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps`` once if the condition is true."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, Net):
        items = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        items = _PrependNets(nets_or_steps, not_net)

    def if_step(control_name: str) -> ExecutionStep:
        return scoped_execution_step(_get_next_step_name(control_name, name), items,
                                     should_stop_blob=stop_blob, only_once=True)

    if _IsNets(items):
        return Do(name + "/_RunOnceIf", BoolNet((stop_blob, False)),
                  if_step("_RunOnceIf-inner"))
    return if_step("_RunOnceIf")


def _RunOnceIfNot(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps`` once if the condition is false."""
    if isinstance(condition_blob_or_net, Net):
        condition = GetConditionBlobFromNet(condition_blob_or_net)
        items = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        copy_net, condition = _CopyConditionBlobNet(condition_blob_or_net)
        items = _PrependNets(nets_or_steps, copy_net)
    return scoped_execution_step(_get_next_step_name("_RunOnceIfNot", name), items,
                                 should_stop_blob=condition, only_once=True)


def For(name: str, nets_or_steps: Any, iter_num: int) -> ExecutionStep:
    """Run ``nets_or_steps`` ``iter_num`` times (a counter counts down)."""
    init_net = Net("init-net")
    counter = init_net.CreateCounter([], init_count=iter_num)
    iter_net = Net("For-iter")
    done = iter_net.CountDown([counter])
    for_step = scoped_execution_step(_get_next_step_name("For-inner", name),
                                     _PrependNets(nets_or_steps, iter_net),
                                     should_stop_blob=done)
    return Do(name + "/For", Do(name + "/For-init-net", init_net), for_step)


def While(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps`` while the condition (evaluated first) is true."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, Net):
        items = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        items = _PrependNets(nets_or_steps, not_net)

    def while_step(control_name: str) -> ExecutionStep:
        return scoped_execution_step(_get_next_step_name(control_name, name), items,
                                     should_stop_blob=stop_blob)

    if _IsNets(items):
        return Do(name + "/While", BoolNet((stop_blob, False)), while_step("While-inner"))
    return while_step("While")


def Until(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps`` until the condition (evaluated first) is true."""
    if isinstance(condition_blob_or_net, Net):
        stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
        nets_or_steps = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        stop_blob = BlobReference(str(condition_blob_or_net))
    return scoped_execution_step(_get_next_step_name("Until", name), nets_or_steps,
                                 should_stop_blob=stop_blob)


def DoWhile(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps``, then again while the condition (evaluated after) is true."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, Net):
        items = _AppendNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        items = _AppendNets(nets_or_steps, not_net)
    return Do(name + "/DoWhile", BoolNet((stop_blob, False)),
              scoped_execution_step(_get_next_step_name("DoWhile-inner", name), items,
                                    should_stop_blob=stop_blob))


def DoUntil(name: str, condition_blob_or_net: Any, nets_or_steps: Any) -> ExecutionStep:
    """Run ``nets_or_steps``, then again until the condition (evaluated after) is true."""
    if not isinstance(condition_blob_or_net, Net):
        return scoped_execution_step(_get_next_step_name("DoUntil", name), nets_or_steps,
                                     should_stop_blob=BlobReference(str(condition_blob_or_net)))
    items = _AppendNets(nets_or_steps, condition_blob_or_net)
    stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
    return Do(name + "/DoUntil", BoolNet((stop_blob, False)),
              scoped_execution_step(_get_next_step_name("DoUntil-inner", name), items,
                                    should_stop_blob=stop_blob))


def Switch(name: str, *conditions: Any) -> ExecutionStep:
    """Run the body of every ``(condition, nets_or_steps)`` whose condition is true."""
    return scoped_execution_step(
        _get_next_step_name("Switch", name),
        [_RunOnceIf(name + "/Switch", cond, step) for cond, step in _MakeList(conditions)])


def SwitchNot(name: str, *conditions: Any) -> ExecutionStep:
    """Run the body of every ``(condition, nets_or_steps)`` whose condition is false."""
    return scoped_execution_step(
        _get_next_step_name("SwitchNot", name),
        [_RunOnceIfNot(name + "/SwitchNot", cond, step)
         for cond, step in _MakeList(conditions)])


def If(name: str, condition_blob_or_net: Any, true_nets_or_steps: Any,
       false_nets_or_steps: Any = None) -> ExecutionStep:
    """Run ``true_nets_or_steps`` if the condition is true, else ``false_nets_or_steps``."""
    if not false_nets_or_steps:
        return _RunOnceIf(name + "/If", condition_blob_or_net, true_nets_or_steps)
    condition = (GetConditionBlobFromNet(condition_blob_or_net)
                 if isinstance(condition_blob_or_net, Net) else condition_blob_or_net)
    return Do(name + "/If",
              _RunOnceIf(name + "/If-true", condition_blob_or_net, true_nets_or_steps),
              _RunOnceIfNot(name + "/If-false", condition, false_nets_or_steps))


def IfNot(name: str, condition_blob_or_net: Any, true_nets_or_steps: Any,
          false_nets_or_steps: Any = None) -> ExecutionStep:
    """Run ``true_nets_or_steps`` if the condition is false, else ``false_nets_or_steps``."""
    if not false_nets_or_steps:
        return _RunOnceIfNot(name + "/IfNot", condition_blob_or_net, true_nets_or_steps)
    condition = (GetConditionBlobFromNet(condition_blob_or_net)
                 if isinstance(condition_blob_or_net, Net) else condition_blob_or_net)
    return Do(name + "/IfNot",
              _RunOnceIfNot(name + "/IfNot-true", condition_blob_or_net, true_nets_or_steps),
              _RunOnceIf(name + "/IfNot-false", condition, false_nets_or_steps))


__all__ = ["BoolNet", "CombineConditions", "Do", "DoParallel", "DoUntil", "DoWhile", "For",
           "GetConditionBlobFromNet", "If", "IfNot", "MergeConditionNets", "Not", "NotNet",
           "Switch", "SwitchNot", "Until", "While"]
