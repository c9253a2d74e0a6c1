"""The backward pass by cloning: the first device's gradients, renamed copies for the rest.

When the forward net is one block of ops per device (after any ops the model had before
Parallelize, which no device reads), the backward pass of the whole net is the backward
passes of the device blocks, last device first.  :func:`add_gradients_by_cloning` runs the
backward pass for the first device's block only and, when every other device's forward
block (and losses) is exactly the first's renamed, gives each the first's gradient ops and
gradient map renamed.  Gradient makers build a gradient op from its forward op alone, so a
renamed forward op has the renamed gradient; the first device's gradients must therefore
live in its own scope and name its blobs only as inputs, outputs and control inputs (not
in a string argument, a nested net or debug info, which renaming would miss).  It then
updates the model as ``ModelHelper.AddGradientOperators`` does.  It returns False, having
changed nothing, whenever any of that does not hold (the caller then runs the full pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpgraph.autodiff.backward import GetBackwardPass
from dpgraph.ir.blob import GradientSlice
from dpgraph.parallel.clone import OpPlan, Renamer, plans_of
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2

OpList = list[caffe2_pb2.OperatorDef]


def _device_of(op: caffe2_pb2.OperatorDef, prefix: str) -> str | None:
    """The ``<prefix>_<d>`` scope every output of ``op`` is in (None: unscoped or mixed)."""
    outputs = op.output[:]
    if not outputs:
        return None
    first = outputs[0]
    cut = first.find("/")
    if cut < 0 or not first.startswith(prefix + "_"):
        return None
    scope = first[:cut + 1]
    for out in outputs[1:]:
        if not out.startswith(scope):
            return None
    return scope[:-1]


def device_blocks(ops: Sequence[caffe2_pb2.OperatorDef], state: ParallelState
                  ) -> list[OpList] | None:
    """One contiguous block of forward ops per device, in device order, after a head of
    unscoped ops no device reads; None otherwise."""
    prefix = state.config.device_prefix
    scopes = [_device_of(op, prefix) for op in ops]
    start = 0
    while start < len(ops) and scopes[start] is None:
        start += 1
    head_outputs = {out for op in ops[:start] for out in op.output}
    blocks: list[OpList] = []
    index = start
    for device in state.devices:
        scope = state.namescope(device)
        begin = index
        while index < len(ops) and scopes[index] == scope:
            index += 1
        block: OpList = list(ops[begin:index])
        if not block or (head_outputs and any(b in head_outputs for op in block
                                              for b in op.input)):
            return None
        blocks.append(block)
    return blocks if index == len(ops) else None


def _renamed_value(value: Any, renamer: Renamer) -> Any:
    if isinstance(value, GradientSlice):
        return GradientSlice(indices=renamer.ref(value.indices),
                             values=renamer.ref(value.values))
    return renamer.ref(value)


def _value_names(value: Any) -> tuple[str, ...]:
    if isinstance(value, GradientSlice):
        return ("slice", str(value.indices), str(value.values))
    return ("dense", str(value))


def _scoped(grad_map: dict[Any, Any], ops: OpList, scope: str) -> bool:
    """Every gradient blob (map and op outputs) is in the device's scope."""
    names = [str(k) for k in grad_map]
    names += [n for v in grad_map.values() for n in _value_names(v)[1:]]
    names += [out for op in ops for out in op.output]
    return all(n.startswith(scope) or n.startswith("_" + scope) for n in names)


def _renamable(compiled: list[OpPlan], scope: str) -> bool:
    """No name of ``scope`` outside the ops' inputs, outputs and control inputs (renaming
    moves only those): no string argument, nested net, op name or debug info holds one.
    Counted in each op's bytes: ``scope`` cannot overlap itself, so the count there is
    the names' count plus any other occurrence."""
    marker = scope.encode()
    for op, ins, outs, ctrl, _ in compiled:
        expected = 0
        for names in (ins, outs, ctrl):
            for name in names:
                expected += name.count(scope)
        if op.SerializeToString().count(marker) != expected:
            return False
    return True


def _ys(state: ParallelState, device: int, loss_grad: dict[str, str]) -> dict[str, str]:
    return {str(loss): loss_grad[str(loss)] for loss in state.losses_by_device[device]}


def _renamer(state: ParallelState, device: int) -> Renamer:
    config = state.config
    return Renamer(config.device_prefix, config.devices[0], device, config.device_type)


def _is_renamed(compiled: list[OpPlan], renamer: Renamer, block: OpList) -> bool:
    """Whether ``block`` is exactly the first device's block (as plans) renamed."""
    if len(compiled) != len(block):
        return False
    renamed = [caffe2_pb2.OperatorDef() for _ in compiled]
    renamer.ops_into(compiled, renamed)
    return all(a == b for a, b in zip(renamed, block))


def _renamed_map(grad_map: dict[Any, Any], renamer: Renamer) -> dict[Any, Any]:
    """Device 0's gradient map, renamed for ``renamer``'s device."""
    return {renamer.ref(k): _renamed_value(v, renamer) for k, v in grad_map.items()}


def add_gradients_by_cloning(state: ParallelState, forward_ops: int,
                             loss_grad: dict[str, str]) -> bool:
    """The backward pass of the net's first ``forward_ops`` ops for ``loss_grad`` (loss ->
    its gradient blob), by cloning; False (nothing changed) when it does not apply."""
    model, devices = state.model, state.devices
    if len(devices) < 2 or model.gradient_ops_added:
        return False
    proto = model.net.proto_for_reading()
    blocks = device_blocks(proto.op[:forward_ops], state)
    if blocks is None:
        return False
    # the loss-gradient fills come after the forward ops; the full pass sees them too
    prefix = state.config.device_prefix
    by_scope: dict[str | None, OpList] = {}
    for op in proto.op[forward_ops:]:
        by_scope.setdefault(_device_of(op, prefix), []).append(op)
    for block, device in zip(blocks, devices):
        block.extend(by_scope.get(state.namescope(device), ()))
    ys0 = _ys(state, devices[0], loss_grad)
    first_option = _renamer(state, devices[0]).first_option
    forward0 = plans_of(blocks[0], first_option)
    renamers = {device: _renamer(state, device) for device in devices[1:]}
    for device, block in zip(devices[1:], blocks[1:]):
        renamer = renamers[device]
        expected_ys = {renamer.name(k): renamer.name(v) for k, v in ys0.items()}
        if (list(_ys(state, device, loss_grad).items()) != list(expected_ys.items())
                or not _is_renamed(forward0, renamer, block)):
            return False
    scope = state.namescope(devices[0]) + "/"
    ops0, map0 = GetBackwardPass(blocks[0], ys0)
    if not _scoped(map0, ops0, scope):
        return False
    compiled = plans_of(ops0, first_option)
    if not _renamable(compiled, scope):
        return False
    maps = {devices[0]: map0}
    for device in devices[1:]:
        maps[device] = _renamed_map(map0, renamers[device])
    _publish_gradients(model, ops0, compiled, devices, renamers,
                       _merged(maps, devices, loss_grad))
    return True


def _merged(maps: dict[int, dict[Any, Any]], devices: Sequence[int],
            loss_grad: dict[str, str]) -> dict[Any, Any]:
    """The full pass's map: the losses first (in ``loss_grad`` order), then each device's
    blobs, last device first."""
    grad_map: dict[Any, Any] = {}
    for device in devices:
        grad_map.update((k, v) for k, v in maps[device].items() if str(k) in loss_grad)
    for device in reversed(devices):
        grad_map.update((k, v) for k, v in maps[device].items() if str(k) not in loss_grad)
    return grad_map


def _publish_gradients(model: Any, ops0: OpList, compiled: list[OpPlan],
                       devices: Sequence[int], renamers: dict[int, Renamer],
                       grad_map: dict[Any, Any]) -> None:
    """What ``ModelHelper.AddGradientOperators`` does after its backward pass, with the
    full pass's op order (the gradient ops of the last device first): the first device's
    ops copied in, the others' written in place as renamed plans."""
    model.Validate()
    outputs0 = list(dict.fromkeys(out for plan in compiled for out in plan[2]))

    def fill(ops: Any) -> None:
        for device in reversed(devices):
            if device == devices[0]:
                ops.extend(ops0)
            else:
                renamers[device].ops_into(compiled, (ops.add() for _ in compiled))

    outputs = list(outputs0)
    for device in devices[1:]:
        outputs += renamers[device].names(outputs0)
    model.net.extend_ops_in_place(fill, outputs)
    model.gradient_ops_added = True
    model.record_gradients(grad_map)
