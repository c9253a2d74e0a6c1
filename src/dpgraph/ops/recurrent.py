"""The RecurrentNetwork operator and its gradient.

``RecurrentNetwork`` runs its ``step_net`` once per timestep of input 0 (T x N x ...), each
step in its own child workspace (see :mod:`dpgraph.ops._rnn_steps`).  *Links* make a step
blob a window of rows of an outer tensor (``hidden_t_prev`` = state[t], the cell output =
state[t+1], ``input_t`` = input[t]); recurrent states are (T+k, N, D) tensors seeded from
their initial inputs; *aliases* expose them as outputs (``<out>_all`` = state[1:],
``<out>_last`` = state[T:]).  The last output is the opaque ``step_workspaces`` scratch.

``RecurrentNetworkGradient`` runs the ``backward_step_net`` for t = T-1..0 in the same step
workspaces, summing parameter gradients over the steps and passing state gradients through
``<state>_grad`` tensors.  Links are applied natively before each step (views into the outer
tensors); a linked blob a step op replaces is copied into its rows right after that op, so a
later op reading another window of the same tensor sees it, as with Caffe2's shared memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import text_format

from dpgraph.errors import ArgumentError, GradientError, ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.device import device_key
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, host
from dpgraph.ops._rnn_steps import (
    BlobChain,
    ScratchWorkspaces,
    StepWorkspace,
    compile_net,
    parent_blobs,
    run_step_ops,
)
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.proto import caffe2_pb2

_MAX_CACHED = 16


@dataclass(frozen=True)
class Link:
    internal: str
    external: str
    offset: int
    window: int = 1


@dataclass
class StepPlan:
    """What one RecurrentNetwork(-Gradient) op runs, decoded once from its arguments."""

    net_name: str
    ops: list[caffe2_pb2.OperatorDef]
    links: list[Link]
    aliases: list[tuple[str, str, int]]
    states: list[str]
    initial_ids: list[int]
    timestep: str
    recompute: list[str]
    has_backward: bool
    num_workspaces: int
    renames: dict[str, str] = field(default_factory=dict)
    # gradient only: per param, its step gradient (``<grad>_tmpstep``) and accumulator
    accumulators: list[str] = field(default_factory=list)
    step_grads: list[str] = field(default_factory=list)

    def remap(self, name: str) -> str:
        return self.renames.get(name, name)

    def links_by_internal(self) -> dict[str, list[Link]]:
        """``{internal blob: its links}`` (cached; the plan's links never change)."""
        cached: dict[str, list[Link]] | None = getattr(self, "_by_internal", None)
        if cached is None:
            cached = {}
            for link in self.links:
                cached.setdefault(link.internal, []).append(link)
            self._by_internal = cached
        return cached


# --- argument decoding -------------------------------------------------------------------
def _raw_arg(op: caffe2_pb2.OperatorDef, name: str) -> caffe2_pb2.Argument | None:
    found = None
    for argument in op.arg:
        if argument.name == name:
            found = argument
    return found


def net_argument(op: caffe2_pb2.OperatorDef, name: str) -> caffe2_pb2.NetDef | None:
    """The NetDef of argument ``name`` (in ``n``, or text format in ``s``); ``None`` when the
    argument is absent or holds an empty net."""
    argument = _raw_arg(op, name)
    if argument is None:
        return None
    if argument.HasField("n") and argument.n.ByteSize() > 0:
        return argument.n
    if argument.HasField("s") and argument.s:
        net = caffe2_pb2.NetDef()
        try:
            text_format.Parse(argument.s.decode("utf-8"), net)
        except text_format.ParseError as error:
            raise ArgumentError(f"{op.type}: argument {name!r} is not a text-format NetDef: "
                                f"{error}") from None
        return net
    return None


def _equal_lengths(ctx: OpContext, *names: str) -> list[list[Any]]:
    values = [list(ctx.arg(n, []) or []) for n in names]
    if len({len(v) for v in values}) > 1:
        raise ArgumentError(ctx.describe(
            f"arguments {', '.join(names)} must have the same length, got "
            f"{[len(v) for v in values]}"))
    return values


def _links(ctx: OpContext, prefix: str, with_window: bool) -> list[Link]:
    internal, external, offset = _equal_lengths(
        ctx, f"{prefix}link_internal", f"{prefix}link_external", f"{prefix}link_offset")
    windows = list(ctx.arg(f"{prefix}link_window", []) or []) if with_window else []
    if not windows:
        windows = [1] * len(internal)
    if len(windows) != len(internal):
        raise ArgumentError(ctx.describe(f"{prefix}link_window has {len(windows)} entries for "
                                         f"{len(internal)} links"))
    return [Link(str(i), str(e), int(o), int(w))
            for i, e, o, w in zip(internal, external, offset, windows)]


def _forward_plan(ctx: OpContext) -> StepPlan:
    step_net = net_argument(ctx.op, "step_net")
    if step_net is None:
        raise ArgumentError(ctx.describe("the step_net argument (a NetDef) is required"))
    states, initial_ids = _equal_lengths(ctx, "recurrent_states", "initial_recurrent_state_ids")
    src, dst, offsets = _equal_lengths(ctx, "alias_src", "alias_dst", "alias_offset")
    renames = {a.name[:-len(".rename")]: a.s.decode() for a in ctx.op.arg
               if a.name.endswith(".rename") and a.HasField("s")}
    return StepPlan(
        net_name=step_net.name, ops=list(step_net.op), links=_links(ctx, "", True),
        aliases=[(str(s), str(d), int(o)) for s, d, o in zip(src, dst, offsets)],
        states=[str(s) for s in states], initial_ids=[int(i) for i in initial_ids],
        timestep=ctx.str_arg("timestep", "timestep") or "timestep",
        recompute=[str(b) for b in ctx.arg("recompute_blobs_on_backward", []) or []],
        has_backward=net_argument(ctx.op, "backward_step_net") is not None,
        num_workspaces=max(1, ctx.int_arg("num_workspaces", 2)), renames=renames)


def _cached_plan(scratch: ScratchWorkspaces, ctx: OpContext, kind: str, build: Any) -> StepPlan:
    key = (kind, id(ctx.op))
    entry = scratch.plans.get(key)
    if entry is None or entry[0] is not ctx.op:
        if len(scratch.plans) >= _MAX_CACHED:
            scratch.plans.clear()
        entry = (ctx.op, build(ctx))
        scratch.plans[key] = entry
    plan: StepPlan = entry[1]
    return plan


def _step_ops(ws: StepWorkspace, plan: StepPlan, ctx: OpContext) -> Any:
    key = id(plan)
    entry = ws.nets.get(key)
    if entry is None or entry[0] is not plan:
        if len(ws.nets) >= _MAX_CACHED:
            ws.nets.clear()
        entry = (plan, compile_net(plan.ops, ws, ctx.xp, ctx.device))
        ws.nets[key] = entry
    return entry[1]


# --- the scratch and the state tensors -----------------------------------------------------
def _scratch(ctx: OpContext, index: int, create: bool) -> ScratchWorkspaces:
    parent, _ = parent_blobs(ctx.workspace)
    value = ctx.inputs[index] if not create else ctx.prev_output(index)
    if isinstance(value, ScratchWorkspaces):
        if value.parent is not parent:
            value.parent = parent
            for step in value.steps:
                step._blobs.levels[2] = parent
        return value
    if not create:
        raise ShapeError(ctx.describe(
            f"input {ctx.input_name(index)!r} must be the step_workspaces blob of the forward "
            f"RecurrentNetwork, got {type(value).__name__}; run the forward op first."))
    rng = getattr(ctx.workspace, "rng", None) or np.random.default_rng()
    return ScratchWorkspaces(parent, rng)


def _store(ctx: OpContext, name: str, value: Any) -> None:
    """Put ``value`` into the op's workspace (states, gradient accumulators)."""
    blobs, placement = parent_blobs(ctx.workspace)
    blobs[name] = value
    placement[name] = device_key(ctx.device)


def _initial_states(ctx: OpContext, plan: StepPlan, t: int, n: int) -> None:
    xp = ctx.xp
    for state, index in zip(plan.states, plan.initial_ids):
        if not 0 <= index < ctx.num_inputs:
            raise ArgumentError(ctx.describe(f"initial_recurrent_state_ids entry {index} is not "
                                             f"an input index"))
        init = xp.asarray(ctx.inputs[index], dtype=np.float32)
        if not 1 <= init.ndim <= 3:
            raise ctx.fail(f"initial state {ctx.input_name(index)!r} must have 1 to 3 dims, "
                           f"got shape {tuple(init.shape)}")
        d = init.shape[-1]
        k = init.shape[0] if init.ndim == 3 else 1
        value = xp.zeros((t + k, n, d), dtype=np.float32)
        if init.ndim == 1:
            value[0] = init
        else:
            if init.shape[-2] != n:
                raise ctx.fail(f"initial state {ctx.input_name(index)!r} has shape "
                               f"{tuple(init.shape)} but the batch size (dim 1 of "
                               f"{ctx.input_name(0)!r}) is {n}")
            value[:k] = init.reshape(k, n, d)
        _store(ctx, state, value)


# --- links ---------------------------------------------------------------------------------
def _link_rows(blobs: BlobChain, link: Link, t: int, where: str) -> Any:
    try:
        external = blobs[link.external]
    except KeyError:
        raise ShapeError(f"{where}: link external {link.external!r} (for {link.internal!r}) "
                         "does not exist") from None
    start = t + link.offset
    if link.offset < 0 or link.window < 0 or external is None or \
            start + link.window > external.shape[0]:
        shape = None if external is None else tuple(external.shape)
        raise ShapeError(f"{where}: link {link.internal!r} -> rows [{start}, "
                         f"{start + link.window}) of {link.external!r} {shape} is out of range "
                         "(offset and window must be >= 0 and fit the tensor)")
    return external, start


def _apply_links(blobs: BlobChain, links: list[Link], t: int, where: str) -> None:
    for link in links:
        external, start = _link_rows(blobs, link, t, where)
        blobs[link.internal] = external[start:start + link.window]


def _run_linked(ws: StepWorkspace, plan: StepPlan, ctx: OpContext, t: int, where: str) -> None:
    """Run the step ops; a linked blob an op writes is copied into its rows of the outer
    tensor at once, so later ops reading another window of that tensor see it."""
    blobs = ws._blobs
    by_internal = plan.links_by_internal()

    def write_through(name: str) -> None:
        _write_through(blobs, by_internal[name], t, where)

    run_step_ops(_step_ops(ws, plan, ctx), blobs, where, by_internal, write_through)


def _write_through(blobs: BlobChain, links: list[Link], t: int, where: str) -> None:
    """Copy linked step blobs an op replaced back into their rows of the outer tensor."""
    for link in links:
        value = blobs.get(link.internal)
        if value is None or not hasattr(value, "shape"):
            continue
        external, start = _link_rows(blobs, link, t, where)
        if _shares(value, external):
            continue
        rows = external[start:start + link.window]
        if value.size != rows.size:
            raise ShapeError(f"{where}: step blob {link.internal!r} has shape "
                             f"{tuple(value.shape)} but its link covers {tuple(rows.shape)} of "
                             f"{link.external!r}")
        rows[...] = value.reshape(rows.shape)


def _shares(value: Any, external: Any) -> bool:
    try:
        return bool(np.may_share_memory(value, external))
    except TypeError:  # CuPy arrays
        base = getattr(value, "base", None)
        return base is external or value is external


# --- the forward op ----------------------------------------------------------------------
def _where(ctx: OpContext, t: int) -> str:
    return f"RecurrentNetwork {ctx.output_name(ctx.num_outputs - 1)!r} at timestep {t}"


def _forward_shapes(op: caffe2_pb2.OperatorDef, shapes: Sequence[Any],
                    types: Sequence[Any]) -> list[Any]:
    """Alias outputs: rows [start, T+k) of a (T+k, N, D) state; the scratch has none."""
    args = arguments_dict(op.arg)
    states = dict(zip(args.get("recurrent_states", []) or [],
                      args.get("initial_recurrent_state_ids", []) or []))
    by_dst = {d: (s, o) for s, d, o in zip(args.get("alias_src", []) or [],
                                           args.get("alias_dst", []) or [],
                                           args.get("alias_offset", []) or [])}
    result: list[Any] = []
    for name in op.output[:-1]:
        src, offset = by_dst.get(name, (None, 0))
        index = states.get(src)
        init = shapes[index] if index is not None and index < len(shapes) else None
        if init is None or shapes[0] is None or len(shapes[0]) < 2 or not init:
            result.append(None)
            continue
        rows = shapes[0][0] + (init[0] if len(init) == 3 else 1)
        start = offset if offset >= 0 else rows + offset
        result.append(((max(rows - start, 0), shapes[0][1], init[-1]), FLOAT))
    return result + [None]


def _gradient_shapes(op: caffe2_pb2.OperatorDef, shapes: Sequence[Any],
                     types: Sequence[Any]) -> list[Any]:
    """Input 0's, the params' and the initial states' shapes (forward inputs follow the
    output gradients)."""
    args = arguments_dict(op.arg)
    base = len(args.get("outputs_with_grads", []) or [])
    indices = [0, *(args.get("param", []) or []),
               *(args.get("initial_recurrent_state_ids", []) or [])]
    return [None if base + i >= len(shapes) or shapes[base + i] is None
            else (tuple(shapes[base + i]), FLOAT) for i in indices[:len(op.output)]]


@register_op("RecurrentNetwork", inputs=(1, None), outputs=(2, None), shape=_forward_shapes)
def recurrent_network(ctx: OpContext) -> Outputs:
    """Run ``step_net`` once per timestep of input 0; outputs are the alias destinations,
    then the ``step_workspaces`` scratch."""
    scratch = _scratch(ctx, ctx.num_outputs - 1, create=True)
    plan = _cached_plan(scratch, ctx, "forward", _forward_plan)
    x = ctx.inputs[0]
    if getattr(x, "ndim", 0) < 2:
        raise ctx.fail(f"input {ctx.input_name(0)!r} must be T x N x ..., got shape "
                       f"{tuple(getattr(x, 'shape', ()))}")
    steps, batch = int(x.shape[0]), int(x.shape[1])
    _initial_states(ctx, plan, steps, batch)
    scratch.ensure(steps if plan.has_backward else plan.num_workspaces)
    for name in plan.recompute:
        scratch.shared.setdefault(name, None)
    for t in range(steps):
        ws = scratch.steps[t if plan.has_backward else t % plan.num_workspaces]
        where = _where(ctx, t)
        ws.local[plan.timestep] = np.array([t], dtype=np.int32)
        _apply_links(ws._blobs, plan.links, t, where)
        _run_linked(ws, plan, ctx, t, where)
    return [*_alias_outputs(ctx, plan, scratch), scratch]


def _alias_value(ctx: OpContext, blobs: BlobChain, src: str, offset: int) -> Any:
    value = blobs.get(src)
    if value is None:
        raise ctx.fail(f"alias source {src!r} does not exist")
    start = offset if offset >= 0 else value.shape[0] + offset
    if value.shape[0] - start < 0:
        raise ctx.fail(f"Invalid number of timesteps: alias of {src!r} {tuple(value.shape)} "
                       f"at offset {offset}")
    return value[start:]


def _alias_outputs(ctx: OpContext, plan: StepPlan, scratch: ScratchWorkspaces) -> list[Any]:
    blobs = BlobChain([scratch.shared, scratch.parent])
    by_dst = {dst: (src, offset) for src, dst, offset in plan.aliases}
    states = set(ctx.arg("recurrent_states", []) or [])
    outputs = []
    for name in ctx.op.output[:-1]:
        if name in by_dst:
            outputs.append(_alias_value(ctx, blobs, *by_dst[name]))
        elif name in states:  # a recurrent state's whole [T + 1, ...] tensor
            outputs.append(_alias_value(ctx, blobs, name, 0))
        else:
            raise ArgumentError(ctx.describe(
                f"output {name!r} is neither an alias destination (alias_dst "
                f"{list(by_dst)}) nor a recurrent state ({sorted(states)}); every output but "
                "the last (step_workspaces) must be one"))
    return outputs


# --- the gradient op ---------------------------------------------------------------------
def _backward_plan(ctx: OpContext) -> StepPlan:
    plan = _forward_plan(ctx)
    backward = net_argument(ctx.op, "backward_step_net")
    if backward is None:
        raise ArgumentError(ctx.describe("backward_step_net is missing or empty: the recurrent "
                                         "net was built forward_only"))
    params = [int(p) for p in ctx.arg("param", []) or []]
    param_grads = [str(g) for g in ctx.arg("param_grads", []) or []]
    if param_grads and len(param_grads) != len(params):
        raise ArgumentError(ctx.describe(f"param_grads has {len(param_grads)} entries for "
                                         f"{len(params)} params"))
    ops = [caffe2_pb2.OperatorDef() for _ in backward.op]
    for copy, op in zip(ops, backward.op):
        copy.CopyFrom(op)
    accumulators = [ctx.output_name(i + 1) for i in range(len(params))]
    written = {name for op in ops for name in op.output}
    for i, accumulator in enumerate(accumulators):
        grad = plan.remap(param_grads[i]) if param_grads else accumulator
        if grad not in written and accumulator in written:
            grad = accumulator  # renamed in the step net without a '.rename' argument
        _rename_blob(ops, grad, grad + "_tmpstep")
        plan.step_grads.append(grad + "_tmpstep")
    links = [Link(plan.remap(link.internal), plan.remap(link.external), link.offset,
                  link.window) for link in plan.links]
    links += [Link(plan.remap(link.internal), plan.remap(link.external), link.offset)
              for link in _links(ctx, "backward_", False)]
    plan.net_name, plan.ops, plan.links = backward.name, ops, links
    plan.accumulators = accumulators  # Caffe2 appends Sum([acc, tmp]) -> acc; added in place
    return plan


def _rename_blob(ops: list[caffe2_pb2.OperatorDef], old: str, new: str) -> None:
    for op in ops:
        for field_name in ("input", "output"):
            names = getattr(op, field_name)
            for k, name in enumerate(names):
                if name == old:
                    names[k] = new


@dataclass
class _StateGrad:
    name: str
    value: Any
    all_grad: Any = None


def _state_grads(ctx: OpContext, plan: StepPlan, owg: list[int]) -> list[_StateGrad]:
    blobs, _ = parent_blobs(ctx.workspace)
    result = []
    for state in plan.states:
        value = blobs.get(state)
        if value is None or getattr(value, "ndim", 0) != 3:
            raise ctx.fail(f"recurrent state {state!r} is missing or not 3-D; run the forward "
                           "RecurrentNetwork (not forward_only) first")
        grad = _StateGrad(plan.remap(state + "_grad"), ctx.xp.zeros_like(value))
        for j, (src, _dst, offset) in enumerate(plan.aliases):
            if src != state or j not in owg:
                continue
            go = ctx.xp.asarray(ctx.inputs[owg.index(j)], dtype=np.float32)
            if offset == 1:
                grad.all_grad = go
            elif offset == -1:
                if go.size != value.shape[1] * value.shape[2] or go.shape[-2:] != \
                        value.shape[1:]:
                    raise ctx.fail(f"gradient {ctx.input_name(owg.index(j))!r} of the last "
                                   f"state has shape {tuple(go.shape)}; expected one row "
                                   f"{tuple(value.shape[1:])}")
                grad.value[-1] += go.reshape(value.shape[1:])
            else:
                raise ArgumentError(ctx.describe(
                    f"alias {j} of {state!r} has offset {offset}; only aliases with offset 1 "
                    "or -1 can take gradients"))
        _store(ctx, grad.name, grad.value)
        result.append(grad)
    return result


def _create_shared_blobs(scratch: ScratchWorkspaces, plan: StepPlan) -> None:
    visible = scratch.steps[0]._blobs
    names = [name for op in plan.ops for name in op.output]
    names += [link.internal for link in plan.links]
    for name in names:
        if name not in visible:
            scratch.shared[name] = None


def _accumulate_params(blobs: BlobChain, plan: StepPlan, sums: list[Any], where: str) -> None:
    """``sum += <grad>_tmpstep`` for every param, in place (Caffe2's appended Sum ops)."""
    for name, total in zip(plan.step_grads, sums):
        step = blobs.get(name)
        if step is None:
            continue
        if step.size != total.size:
            raise ShapeError(f"{where}: step gradient {name!r} has shape {tuple(step.shape)} "
                             f"but its parameter has {tuple(total.shape)}")
        total += step.reshape(total.shape)


def _backward_step(ctx: OpContext, ws: StepWorkspace, plan: StepPlan,
                   grads: list[_StateGrad], sums: list[Any], t: int) -> None:
    where = f"RecurrentNetworkGradient {ctx.input_name(ctx.num_inputs - 1)!r} at timestep {t}"
    blobs = ws._blobs
    _apply_links(blobs, plan.links, t, where)
    for grad in grads:
        if grad.all_grad is not None:
            if grad.all_grad.shape[0] <= t or grad.all_grad.shape[1:] != grad.value.shape[1:]:
                raise ShapeError(f"{where}: the gradient of the sequence output has shape "
                                 f"{tuple(grad.all_grad.shape)}; expected "
                                 f"(T, {grad.value.shape[1]}, {grad.value.shape[2]})")
            grad.value[t + 1] += grad.all_grad[t]
    _run_linked(ws, plan, ctx, t, where)
    _accumulate_params(blobs, plan, sums, where)


@register_op("RecurrentNetworkGradient", inputs=(2, None), outputs=(1, None),
             shape=_gradient_shapes)
def recurrent_network_gradient(ctx: OpContext) -> Outputs:
    """Inputs: output grads (per outputs_with_grads), forward inputs, forward outputs with the
    scratch last.  Outputs: input 0's grad, param grads, initial-state grads."""
    scratch = _scratch(ctx, ctx.num_inputs - 1, create=False)
    plan = _cached_plan(scratch, ctx, "backward", _backward_plan)
    owg = [int(i) for i in ctx.arg("outputs_with_grads", []) or []]
    n_go = len(owg)
    x = ctx.inputs[n_go]
    steps = int(x.shape[0])
    if len(scratch.steps) < steps:
        raise ctx.fail(f"the forward RecurrentNetwork kept {len(scratch.steps)} step workspaces "
                       f"for {steps} timesteps: it ran forward-only (no backward_step_net), so "
                       "there is nothing to back-propagate through")
    grads = _state_grads(ctx, plan, owg)
    input_grad = ctx.xp.zeros(x.shape, dtype=np.float32)
    _store(ctx, plan.remap(ctx.input_name(n_go) + "_grad"), input_grad)
    params = [int(p) for p in ctx.arg("param", []) or []]
    sums = [ctx.xp.zeros(np.shape(ctx.inputs[n_go + index]), dtype=np.float32)
            for index in params]
    for accumulator, total in zip(plan.accumulators, sums):
        _store(ctx, accumulator, total)
    if steps > 0:
        _create_shared_blobs(scratch, plan)
    for t in range(steps - 1, -1, -1):
        _backward_step(ctx, scratch.steps[t], plan, grads, sums, t)
    outputs = [input_grad, *sums]
    for grad, index in zip(grads, plan.initial_ids):
        init = ctx.inputs[n_go + index]
        if np.ndim(init) >= 2:
            outputs.append(grad.value.reshape(-1)[:init.size].reshape(np.shape(init)).copy())
        else:
            outputs.append(grad.value[0].sum(axis=0))
    if len(outputs) != ctx.num_outputs:
        raise ArgumentError(ctx.describe(
            f"has {ctx.num_outputs} outputs but computes {len(outputs)} gradients (input 0, "
            f"{len(params)} params, {len(plan.states)} initial states)"))
    return outputs


@register_gradient("RecurrentNetwork")
def _recurrent_network_gradient_maker(g: GradientBuilder) -> None:
    owg = [int(i) for i in g.arg("outputs_with_grads", []) or []]
    if not owg:
        raise GradientError(f"RecurrentNetwork {list(g.op.output)}: outputs_with_grads is empty,"
                            " so no output gradient can flow back; set it (recurrent_net "
                            "defaults to (0,))")
    for index in owg:
        if not g.has_go(index) or g.go_is_sparse(index):
            raise GradientError(f"Gradient of output {g.O(index)} is not provided! "
                                f"(RecurrentNetwork outputs_with_grads={owg})")
    inputs = [g.GO(i) for i in owg] + list(g.op.input) + list(g.op.output)
    outputs = [g.GI(0)] + [g.GI(int(p)) for p in g.arg("param", []) or []]
    outputs += [g.GI(int(s)) for s in g.arg("initial_recurrent_state_ids", []) or []]
    g.add("RecurrentNetworkGradient", inputs, outputs)


# --- private link ops and the blob fetcher -------------------------------------------------
def _timestep(ctx: OpContext) -> int:
    return int(host(ctx.inputs[0]).reshape(-1)[0])


@register_op("rnn_internal_apply_link", inputs=2, outputs=2, inplace=[(1, 1)])
def rnn_internal_apply_link(ctx: OpContext) -> Outputs:
    """[timestep, external] -> [internal, external]: internal = rows [t+offset,
    t+offset+window) of external (a view)."""
    offset, window = ctx.int_arg("offset", 0), ctx.int_arg("window", 1)
    external = ctx.inputs[1]
    start = _timestep(ctx) + offset
    if offset < 0 or window < 0 or external.size == 0 or start + window > external.shape[0]:
        raise ctx.fail(f"rows [{start}, {start + window}) of {tuple(external.shape)} are out of "
                       "range (offset and window must be >= 0, the external non-empty)")
    return external[start:start + window], external


@register_op("rnn_internal_accumulate_gradient_input", inputs=3, outputs=1, inplace=[(2, 0)])
def rnn_internal_accumulate_gradient_input(ctx: OpContext) -> Outputs:
    """[timestep, og, g] -> g with g[t + offset] += og[t] (in place)."""
    t = _timestep(ctx)
    og, g = ctx.inputs[1], ctx.inputs[2]
    row = t + ctx.int_arg("offset", 1)
    if t >= og.shape[0] or row >= g.shape[0] or og[t].size != g[row].size:
        raise ctx.fail(f"cannot add row {t} of {tuple(og.shape)} into row {row} of "
                       f"{tuple(g.shape)}")
    g[row] += og[t].reshape(g[row].shape)
    return (g,)


@register_op("RecurrentNetworkBlobFetcher", inputs=1, outputs=1)
def recurrent_network_blob_fetcher(ctx: OpContext) -> Outputs:
    """Copy every step workspace's local blobs into the op's workspace as
    ``<prefix>_<blob><step>``; output their names (a string tensor)."""
    scratch = _scratch(ctx, 0, create=False)
    prefix = ctx.str_arg("prefix", "rnn") or "rnn"
    names = []
    for i, step in enumerate(scratch.steps):
        for blob, value in step.local.items():
            if value is None or not hasattr(value, "shape"):
                continue
            name = f"{prefix}_{blob}{i}"
            _store(ctx, name, ctx.xp.array(value, copy=True))
            names.append(name.encode("utf-8"))
    result = np.empty(len(names), dtype=object)
    result[:] = names
    return (result,)
