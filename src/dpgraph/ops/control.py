"""Control-flow operators: If, While, ONNXWhile, Do, CreateScope/HasScope, and the counter
ops.

``If`` and ``While`` run their NetDef arguments in the op's own workspace.  ``Do`` runs its
``net`` in a child scope: a new set of local blobs in which only the bound names
(``inner_blobs[i]`` -> the op's blob ``outer_blobs_idx[i]`` of its inputs then its outputs,
both without the last, workspace blob) reach
the outer workspace.  Each forward Do pushes its scope onto the ``WorkspaceStack`` held by its
last input/output blob (made by ``CreateScope``); a gradient Do (``is_gradient_op``) pops the
most recent one, so the backward net reads the forward net's intermediate blobs.

Counter ops (CreateCounter, CountDown, CountUp, CheckCounterDone, ResetCounter,
RetrieveCount) hold a thread-safe integer in a blob, as Caffe2's counter ops do.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, OperatorError
from dpgraph.ir.blob_serde import TypeSerializer, register_type
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.proto import caffe2_pb2

_MISSING = object()


class ScopedBlobs(MutableMapping):  # type: ignore[type-arg]
    """The blobs of a child scope: its own ``local`` dict, plus names that reach a parent
    mapping, either all of them (``forward=None``, Caffe2's shared child workspace) or only
    the bound ones (``forward={inner: outer}``, the Do op's scope)."""

    def __init__(self, local: dict[str, Any], parent: Any,
                 forward: dict[str, str] | None = None) -> None:
        self.local, self.parent, self.forward = local, parent, forward

    def _outer(self, name: str) -> str | None:
        if self.forward is None:
            return name if name in self.parent and name not in self.local else None
        return self.forward.get(name)

    def __getitem__(self, name: str) -> Any:
        outer = self._outer(name)
        if outer is not None:
            return self.parent[outer]
        return self.local[name]

    def __setitem__(self, name: str, value: Any) -> None:
        outer = self._outer(name)
        if outer is not None:
            self.parent[outer] = value
        else:
            self.local[name] = value

    def __delitem__(self, name: str) -> None:
        outer = self._outer(name)
        if outer is not None:
            del self.parent[outer]
        else:
            del self.local[name]

    def __contains__(self, name: object) -> bool:
        return name in self.local or (isinstance(name, str) and self._outer(name) is not None
                                      and self._outer(name) in self.parent)

    def __iter__(self) -> Iterator[str]:
        seen = set(self.local)
        yield from self.local
        names = self.parent if self.forward is None else [
            inner for inner, outer in self.forward.items() if outer in self.parent]
        for name in names:
            if name not in seen:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Scope:
    """The saved blobs (values and placements) of one Do scope."""

    def __init__(self) -> None:
        self.blobs: dict[str, Any] = {}
        self.placement: dict[str, Any] = {}


class WorkspaceStack:
    """The scopes pushed by forward Do ops, popped (last first) by gradient Do ops."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.grad_index = -1
        self.lock = threading.Lock()

    def push_forward(self, reuse: bool) -> Scope:
        with self.lock:
            if reuse and self.scopes:
                return self.scopes[-1]
            self.scopes.append(Scope())
            self.grad_index = len(self.scopes) - 1
            return self.scopes[-1]

    def pop_gradient(self) -> Scope:
        with self.lock:
            if self.grad_index < 0:
                raise OperatorError("Do (gradient): no forward workspace is left in the "
                                    "workspace stack; run the forward Do before its gradient.")
            scope = self.scopes[self.grad_index]
            self.grad_index -= 1
            return scope

    def has_scopes(self) -> bool:
        return self.grad_index >= 0

    def clear(self) -> None:
        with self.lock:
            self.scopes.clear()
            self.grad_index = -1


def child_workspace(workspace: Any, blobs: MutableMapping, placement: MutableMapping) -> Any:
    """A workspace object sharing ``workspace``'s settings but with its own blob maps and
    no nets (a shallow copy: the random generator and lock are shared)."""
    child = copy.copy(workspace)
    child._blobs, child._placement, child._nets = blobs, placement, {}
    return child


def shared_child_workspace(workspace: Any) -> Any:
    """Caffe2's ``Workspace(parent)``: new blobs are local, existing ones are the parent's."""
    return child_workspace(workspace, ScopedBlobs({}, workspace._blobs),
                           ScopedBlobs({}, workspace._placement))


# --- If / While --------------------------------------------------------------------------
def _net_arg(ctx: OpContext, name: str, required: bool) -> Any:
    net = ctx.arg(name)
    if net is None and required:
        raise ArgumentError(ctx.describe(f"argument {name!r} (a NetDef) is required"))
    return net


def _workspace(ctx: OpContext) -> Any:
    if ctx.workspace is None:
        raise OperatorError(ctx.describe("control-flow ops need a workspace to run subnets"))
    return ctx.workspace


def _condition(ctx: OpContext) -> bool:
    """The current value of the one-element bool condition blob (input 0)."""
    value = _workspace(ctx).get_blob_or_none(ctx.input_name(0))
    if value is None:
        value = ctx.inputs[0]
    host = np.asarray(to_host(value))
    if host.size != 1:
        raise ArgumentError(ctx.describe(
            f"condition blob {ctx.input_name(0)!r} must have one element, got shape "
            f"{list(host.shape)}"))
    return bool(host.reshape(-1)[0])


def _current_outputs(ctx: OpContext) -> Outputs:
    """Outputs as the subnets left them in the workspace (the executor re-stores them)."""
    ws = _workspace(ctx)
    return tuple(ws.get_blob_or_none(name) for name in ctx.op.output)


@register_op("If", inputs=(1, None), outputs=(0, None), inplace="any", side_effects=True)
def if_op(ctx: OpContext) -> Outputs:
    """Run ``then_net`` when the bool input 0 is true, else ``else_net`` (if given)."""
    then_net = _net_arg(ctx, "then_net", required=True)
    else_net = _net_arg(ctx, "else_net", required=False)
    if _condition(ctx):
        _workspace(ctx).run_net_once(then_net)
    elif else_net is not None:
        _workspace(ctx).run_net_once(else_net)
    return _current_outputs(ctx)


@register_op("While", inputs=(1, None), outputs=(0, None), inplace="any", side_effects=True)
def while_op(ctx: OpContext) -> Outputs:
    """Run ``cond_net`` (if given), then ``loop_net`` while the bool input 0 is true,
    re-running ``cond_net`` after each iteration."""
    loop_net = _net_arg(ctx, "loop_net", required=True)
    cond_net = _net_arg(ctx, "cond_net", required=False)
    ws = _workspace(ctx)
    if cond_net is not None:
        ws.run_net_once(cond_net)
    while _condition(ctx):
        ws.run_net_once(loop_net)
        if cond_net is not None:
            ws.run_net_once(cond_net)
    return _current_outputs(ctx)


# --- ONNXWhile ----------------------------------------------------------------------------
def _scalar(value: Any) -> Any:
    return np.asarray(to_host(value)).reshape(-1)[0]


@register_op("ONNXWhile", inputs=(2, None), outputs=(0, None), side_effects=True)
def onnx_while(ctx: OpContext) -> Outputs:
    """ONNX Loop: inputs ``[max_trip_count, first_condition, *loop_carried]``; ``body``
    reads ``(iteration, condition, *loop_carried)`` (its external inputs) and writes
    ``(condition, *loop_carried, *scan_outputs)`` (its external outputs).  Outputs the
    final loop-carried values, then each scan output joined over the iterations.
    ``has_trip_count`` / ``has_cond`` enable the two stop tests; the body runs in a child
    scope (a new one per iteration with ``save_scopes``) unless ``disable_scopes``."""
    body = _net_arg(ctx, "body", required=True)
    ws = _workspace(ctx)
    has_trip, has_cond = ctx.int_arg("has_trip_count", 0), ctx.int_arg("has_cond", 0)
    max_trip = int(_scalar(ctx.inputs[0]))
    first_condition = np.asarray(to_host(ctx.inputs[1]))
    carried = [np.array(to_host(v), copy=True) for v in ctx.inputs[2:]]
    ext_in, ext_out = list(body.external_input), list(body.external_output)
    num_scan = len(ext_out) - len(carried) - 1
    if num_scan < 0 or len(ext_in) < 2 + len(carried):
        raise ArgumentError(ctx.describe(
            f"body must read (iteration, condition, {len(carried)} loop-carried) external "
            f"inputs and write 1+N+K external outputs; it has {len(ext_in)} and "
            f"{len(ext_out)}"))
    if ctx.num_outputs != len(carried) + num_scan:
        raise ArgumentError(ctx.describe(f"expects {len(carried) + num_scan} outputs "
                                         f"({len(carried)} loop-carried, {num_scan} scan)"))
    disable, save = ctx.int_arg("disable_scopes", 0), ctx.int_arg("save_scopes", 0)
    scope: Any = None
    scans: list[list[np.ndarray]] = [[] for _ in range(num_scan)]
    iteration, condition = 0, bool(first_condition.reshape(-1)[0])
    while (not has_trip or iteration < max_trip) and (not has_cond or condition):
        if scope is None:
            scope = ws if disable else shared_child_workspace(ws)
        scope.set_blob(ext_in[0], np.array(iteration, np.int64))
        scope.set_blob(ext_in[1], np.array(condition, first_condition.dtype))
        for name, value in zip(ext_in[2:], carried):
            scope.set_blob(name, value)
        scope.run_net_once(body)
        condition = bool(_scalar(scope.get_blob(ext_out[0])))
        carried = [np.array(to_host(scope.get_blob(n)), copy=True)
                   for n in ext_out[1:1 + len(carried)]]
        for values, name in zip(scans, ext_out[1 + len(carried):]):
            value = np.array(to_host(scope.get_blob(name)), copy=True)
            if values and value.shape != values[0].shape:
                raise ctx.fail("Size of scan output changed across iterations")
            values.append(value)
        if save:
            scope = None
        iteration += 1
    return tuple(carried + [_join_scans(v) for v in scans])


def _join_scans(values: list[np.ndarray]) -> np.ndarray:
    """Scan outputs joined as Caffe2 does: along the first dimension (0-d values are
    stacked); an empty int32 vector when the body never ran."""
    if not values:
        return np.zeros(0, np.int32)
    if values[0].ndim == 0:
        return np.stack(values)
    return np.concatenate(values, axis=0)


register_gradient("ONNXWhile")(no_gradient)


# --- scopes and Do -------------------------------------------------------------------------
@register_op("CreateScope", inputs=0, outputs=1, side_effects=True)
def create_scope(ctx: OpContext) -> Outputs:
    """An empty WorkspaceStack (an existing one is cleared, as Caffe2 resets it)."""
    previous = ctx.prev_output(0)
    if isinstance(previous, WorkspaceStack):
        previous.clear()
        return (previous,)
    return (WorkspaceStack(),)


@register_op("HasScope", inputs=1, outputs=1)
def has_scope(ctx: OpContext) -> Outputs:
    """True while the WorkspaceStack input has forward scopes left for gradients."""
    return (np.array(_stack(ctx, ctx.inputs[0]).has_scopes()),)


register_gradient("CreateScope")(no_gradient)
register_gradient("HasScope")(no_gradient)


def _stack(ctx: OpContext, value: Any) -> WorkspaceStack:
    if not isinstance(value, WorkspaceStack):
        raise ArgumentError(ctx.describe(
            f"blob {ctx.op.input[-1]!r} must hold a workspace stack made by CreateScope, got "
            f"{type(value).__name__}"))
    return value


def _bindings(ctx: OpContext) -> dict[str, str]:
    """``{inner name: outer name}`` from ``inner_blobs`` and ``outer_blobs_idx`` (indices
    into the op's inputs then outputs, each without the workspace blob)."""
    inner = [b.decode() if isinstance(b, bytes) else str(b)
             for b in ctx.arg("inner_blobs", []) or []]
    idx = [int(i) for i in ctx.arg("outer_blobs_idx", []) or []]
    if len(inner) != len(idx):
        raise ArgumentError(ctx.describe(
            f"inner_blobs ({len(inner)}) and outer_blobs_idx ({len(idx)}) differ in length"))
    outer = list(ctx.op.input[:-1]) + list(ctx.op.output[:-1])
    bad = [i for i in idx if not 0 <= i < len(outer)]
    if bad:
        raise ArgumentError(ctx.describe(f"outer_blobs_idx {bad} out of range of the "
                                         f"{len(outer)} inputs and outputs (without the "
                                         "workspace blob)"))
    return {name: outer[i] for name, i in zip(inner, idx)}


@register_op("Do", inputs=(1, None), outputs=(1, None), inplace="any", side_effects=True)
def do_op(ctx: OpContext) -> Outputs:
    """Run ``net`` in a scope of the WorkspaceStack in the last input (see module doc)."""
    net = _net_arg(ctx, "net", required=True)
    ws = _workspace(ctx)
    stack = _stack(ctx, ctx.inputs[-1])
    if ctx.op.is_gradient_op:
        scope = stack.pop_gradient()
    else:
        scope = stack.push_forward(bool(ctx.int_arg("reuse_workspace", 0)))
    bindings = _bindings(ctx)
    if ctx.op.is_gradient_op:
        # forward blobs of the saved scope (a copying Do keeps the bound ones there too)
        # are read from the scope: they hold the values of that forward run
        bindings = {k: v for k, v in bindings.items() if k not in scope.blobs}
    if ctx.int_arg("copy_external_blobs", 0):
        _run_copying(ws, scope, bindings, net, set(ctx.op.output))
    else:
        blobs = ScopedBlobs(scope.blobs, ws._blobs, bindings)
        placement = ScopedBlobs(scope.placement, ws._placement, bindings)
        child_workspace(ws, blobs, placement).run_net_once(net)
    return _current_outputs(ctx)


def _run_copying(ws: Any, scope: Scope, bindings: dict[str, str], net: Any,
                 outputs: set[str]) -> None:
    """Copy the bound blobs into the scope, run, and copy the bound outputs back out, so
    the scope keeps its own values (a While body's per-iteration state)."""
    for inner, outer in bindings.items():
        if outer in ws._blobs:
            value = ws._blobs[outer]
            scope.blobs[inner] = value.copy() if hasattr(value, "copy") else value
            scope.placement[inner] = ws._placement.get(outer)
    child_workspace(ws, scope.blobs, scope.placement).run_net_once(net)
    for inner, outer in bindings.items():
        if outer in outputs and inner in scope.blobs:
            ws._blobs[outer] = scope.blobs[inner]
            ws._placement[outer] = scope.placement.get(inner)


# --- counters ---------------------------------------------------------------------------
class Counter:
    """A thread-safe count (Caffe2's ``Counter<int64_t>``)."""

    def __init__(self, count: int) -> None:
        self.init_count = count
        self.count = count
        self.lock = threading.Lock()


def _counter(ctx: OpContext) -> Counter:
    value = ctx.inputs[0]
    if not isinstance(value, Counter):
        raise ArgumentError(ctx.describe(f"blob {ctx.op.input[0]!r} must hold a counter made "
                                         f"by CreateCounter, got {type(value).__name__}"))
    return value


@register_op("CreateCounter", inputs=0, outputs=1)
def create_counter(ctx: OpContext) -> Outputs:
    """A counter starting at ``init_count`` (default 0)."""
    return (Counter(ctx.int_arg("init_count", 0)),)


@register_op("ResetCounter", inputs=1, outputs=(0, 1))
def reset_counter(ctx: OpContext) -> Outputs:
    """Set the count to ``init_count`` (default 0); optionally output the previous count."""
    counter = _counter(ctx)
    with counter.lock:
        previous, counter.count = counter.count, ctx.int_arg("init_count", 0)
    return (np.array(previous, np.int64),)[:ctx.num_outputs]


@register_op("CountDown", inputs=1, outputs=1)
def count_down(ctx: OpContext) -> Outputs:
    """Decrement; output True when the count was already <= 0 (done)."""
    counter = _counter(ctx)
    with counter.lock:
        done = counter.count <= 0
        counter.count -= 1
    return (np.array(done),)


@register_op("CheckCounterDone", inputs=1, outputs=1)
def check_counter_done(ctx: OpContext) -> Outputs:
    counter = _counter(ctx)
    with counter.lock:
        return (np.array(counter.count <= 0),)


@register_op("CountUp", inputs=1, outputs=1)
def count_up(ctx: OpContext) -> Outputs:
    """Increment; output the count before the increment."""
    counter = _counter(ctx)
    with counter.lock:
        previous = counter.count
        counter.count += 1
    return (np.array(previous, np.int64),)


@register_op("RetrieveCount", inputs=1, outputs=1)
def retrieve_count(ctx: OpContext) -> Outputs:
    counter = _counter(ctx)
    with counter.lock:
        return (np.array(counter.count, np.int64),)


COUNTER_TYPE = "std::unique_ptr<Counter<int64_t>>"


def _serialize_counter(name: str, counter: Counter) -> bytes:
    """The count as an INT64 [1] TensorProto (Caffe2 puts that tensor in the BlobProto's
    ``tensor`` field; dpgraph's type serializers write ``content``)."""
    proto = caffe2_pb2.TensorProto(name=name, data_type=caffe2_pb2.TensorProto.INT64,
                                   dims=[1])
    with counter.lock:
        proto.int64_data.append(counter.count)
    return proto.SerializeToString()


def _deserialize_counter(content: bytes) -> Counter:
    proto = caffe2_pb2.TensorProto.FromString(content)
    return Counter(int(proto.int64_data[0]) if proto.int64_data else 0)


register_type(TypeSerializer(COUNTER_TYPE, lambda v: isinstance(v, Counter),
                             _serialize_counter, _deserialize_counter))

for _type in ("CreateCounter", "ResetCounter", "CountDown", "CheckCounterDone", "CountUp",
              "RetrieveCount"):
    register_gradient(_type)(no_gradient)
