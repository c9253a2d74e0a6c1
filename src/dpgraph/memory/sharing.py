"""Blob recycling passes: gradient/activation sharing, inference recycling, Free insertion.

Every pass renames blobs whose live ranges (first write .. last touch, in the net's op
order) do not overlap, so the renamed net computes exactly the same values; the DAG
executor orders ops by read/write hazards, so a renaming valid in op order stays valid in
parallel.  The DAG-aware passes only let a blob reuse a buffer whose every user is already
an ancestor of the blob's producer, so they add no new ordering between ops.

Never shared: external inputs and outputs, blobs read before they are written (inputs such
as params), blobs an op with side effects (collectives, Iter, queues, Print) or an Alias
touches, blobs of ops that hold step nets, and blobs the caller keeps.

Before (``share_grad_blobs(net, ["x/loss"], param_grads, "x/")``)::

    FCGradient(x/fc2, x/fc3_w, x/fc3_grad) -> x/fc3_w_grad, x/fc3_b_grad, x/fc2_grad
    FCGradient(x/fc1, x/fc2_w, x/fc2_grad) -> x/fc2_w_grad, x/fc2_b_grad, x/fc1_grad

After (``x/fc3_grad`` is dead when ``x/fc1_grad`` is written)::

    FCGradient(x/fc2, x/fc3_w, x/__m0_shared) -> x/fc3_w_grad, x/fc3_b_grad, x/__m1_shared
    FCGradient(x/fc1, x/fc2_w, x/__m1_shared) -> x/fc2_w_grad, x/fc2_b_grad, x/__m0_shared
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpgraph.errors import MemongerError, OperatorDefError
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.proto_io import proto_of
from dpgraph.ir.registry import OPERATORS
from dpgraph.memory.assign import rename_blobs
from dpgraph.memory.graph import hazard_ancestors, verify_graph_equality, verify_inplace_blobs
from dpgraph.proto import caffe2_pb2

log = logging.getLogger("dpgraph.memonger")
OpList = Sequence[caffe2_pb2.OperatorDef]


def as_netdef(net: Any) -> caffe2_pb2.NetDef:
    """A deep copy of ``net`` (a Net or a NetDef) as a NetDef."""
    proto = proto_of(net)
    if not isinstance(proto, caffe2_pb2.NetDef):
        raise MemongerError(f"Expected a Net or NetDef, got {type(net).__name__}.")
    result = caffe2_pb2.NetDef()
    result.CopyFrom(proto)
    return result


def _has_subnet(op: caffe2_pb2.OperatorDef) -> bool:
    """An op holding nets whose blob names a rename could not follow.  RecurrentNetwork
    ops are renamed through their step nets and ``.rename`` arguments instead."""
    if op.type.startswith("RecurrentNetwork"):
        return False
    return any(arg.HasField("n") or len(arg.nets) for arg in op.arg)


def _pins(op: caffe2_pb2.OperatorDef) -> bool:
    schema = OPERATORS.get(op.type)
    return (op.type == "Alias" or _has_subnet(op)
            or (schema is not None and schema.side_effects))


@dataclass
class BlobUse:
    """Where each blob is written and read, in op order."""

    first_write: dict[str, int]
    first_read: dict[str, int]
    last: dict[str, int]
    accessors: dict[str, int]  # bitset of the ops touching the blob

    @classmethod
    def of(cls, ops: OpList) -> BlobUse:
        use = cls({}, {}, {}, {})
        for i, op in enumerate(ops):
            for b in op.input:
                use.first_read.setdefault(b, i)
            for b in op.output:
                use.first_write.setdefault(b, i)
            for b in list(op.input) + list(op.output):
                use.last[b] = i
                use.accessors[b] = use.accessors.get(b, 0) | (1 << i)
        return use

    def produced_internally(self, blob: str) -> bool:
        """Written before it is first read, and read at least once."""
        write = self.first_write.get(blob)
        read = self.first_read.get(blob)
        return write is not None and read is not None and write < read


def pinned_blobs(proto: caffe2_pb2.NetDef) -> set[str]:
    """Blobs no pass may rename or free (see the module docstring)."""
    pinned = set(proto.external_input) | set(proto.external_output)
    for op in proto.op:
        if _pins(op):
            pinned.update(op.input)
            pinned.update(op.output)
    return pinned


_TO_CPU = frozenset({"CopyGPUToCPU", "EnsureCPUOutput"})


def _output_device(op: caffe2_pb2.OperatorDef) -> tuple[int, int]:
    """Where an op's outputs live: its device, except copies to the host (CPU:0)."""
    if op.type in _TO_CPU:
        return (caffe2_pb2.PROTO_CPU, 0)
    option = op.device_option
    if option.device_type == caffe2_pb2.PROTO_CPU:
        return (caffe2_pb2.PROTO_CPU, 0)  # one host memory, whatever the id
    return (option.device_type, option.device_id)


def plan_slots(ops: OpList, candidates: Iterable[str], sizes: Mapping[str, int] | None = None,
               dag: bool = True) -> list[list[str]]:
    """Linear-scan buffer assignment: each candidate takes, at its first write, a buffer
    on the same device whose previous blob is dead (and, with ``dag``, whose users all
    precede the writer in the dependency graph) -- best fit by size when sizes are known,
    else the most recently freed.  Returns the buffers as lists of blobs in assignment
    order."""
    use = BlobUse.of(ops)
    wanted = {b for b in candidates if use.produced_internally(b)}
    ancestors = hazard_ancestors(ops) if dag else []
    release_at: dict[int, list[str]] = {}
    for b in wanted:
        release_at.setdefault(use.last[b] + 1, []).append(b)
    slots: list[list[str]] = []
    capacity: list[int] = []
    slot_of: dict[str, int] = {}
    slot_device: list[tuple[int, int]] = []
    free: list[int] = []
    for i, op in enumerate(ops):
        for b in sorted(release_at.get(i, ())):
            free.append(slot_of[b])
        device = _output_device(op)
        for b in op.output:
            if b not in wanted or b in slot_of or use.first_write[b] != i:
                continue
            size = int((sizes or {}).get(b) or 0)
            eligible = [s for s in free if slot_device[s] == device and (
                not dag or use.accessors[slots[s][-1]] & ~ancestors[i] == 0)]
            slot = _pick(eligible, capacity, size, sizes is not None)
            if slot is None:
                slot = len(slots)
                slots.append([])
                capacity.append(0)
                slot_device.append(device)
            else:
                free.remove(slot)
            slots[slot].append(b)
            capacity[slot] = max(capacity[slot], size)
            slot_of[b] = slot
    return slots


def _pick(eligible: list[int], capacity: list[int], size: int, sized: bool) -> int | None:
    """Best fit among buffers at most twice the blob's size; else grow the largest smaller
    buffer; else a new buffer (a small blob parked in a much larger buffer would force the
    next large blob into a new one)."""
    if not eligible:
        return None
    if not sized or size <= 0:
        return eligible[-1]
    snug = [s for s in eligible if size <= capacity[s] <= 2 * size]
    if snug:
        return min(snug, key=lambda s: (capacity[s], -s))
    smaller = [s for s in eligible if capacity[s] < size]
    if smaller:
        return max(smaller, key=lambda s: (capacity[s], s))
    return None


def _check(original: caffe2_pb2.NetDef, optimized: caffe2_pb2.NetDef, what: str) -> None:
    if not verify_graph_equality(original, optimized):
        raise MemongerError(f"{what}: the optimised net's dependency graph differs from the "
                            f"original net {original.name!r}; this is a dpgraph bug, please "
                            "report it (run without the memory optimisation meanwhile).")
    if not verify_inplace_blobs(original, optimized):
        raise MemongerError(f"{what}: the optimised net {original.name!r} changed which ops "
                            "run in place; this is a dpgraph bug, please report it.")


def _shared_names(proto: caffe2_pb2.NetDef, namescope: str, slots: list[list[str]]
                  ) -> dict[str, str]:
    """Buffers with two or more blobs -> ``{namescope}__m{N}_shared`` (N past any already
    in the net, so repeated passes never collide)."""
    pattern = re.compile(re.escape(namescope) + r"__m(\d+)_shared$")
    taken = [int(m.group(1)) for op in proto.op for b in list(op.input) + list(op.output)
             if (m := pattern.match(b))]
    counter = max(taken, default=-1) + 1
    mapping: dict[str, str] = {}
    for slot in slots:
        if len(slot) < 2:
            continue
        name = f"{namescope}__m{counter}_shared"
        counter += 1
        mapping.update({b: name for b in slot})
    return mapping


def _normalise_namescope(namescope: str) -> str:
    namescope = str(namescope)
    return namescope + "/" if namescope and not namescope.endswith("/") else namescope


def _blob_names(blobs: Iterable[Any] | None) -> set[str]:
    names: set[str] = set()
    for b in blobs or ():
        if isinstance(b, GradientSlice):
            names.update((str(b.indices), str(b.values)))
        else:
            names.add(str(b))
    return names


def _sizes_from_shapes(shapes: Mapping[str, Any] | None) -> dict[str, int] | None:
    if shapes is None:
        return None
    return {str(k): int(math.prod(int(d) for d in v)) for k, v in shapes.items()}


_AUTOSPLIT = re.compile(r"_grad(_indices|_values)?_autosplit_\d+$")


def _is_grad_name(blob: str) -> bool:
    """``x_grad``, or a partial gradient autodiff sums into one (``_x_grad_autosplit_0``)."""
    return blob.endswith("_grad") or _AUTOSPLIT.search(blob) is not None


def _forward_activations(ops: OpList, external_outputs: set[str], namescope: str
                         ) -> list[str]:
    """Caffe2's activations: outputs ``b`` of ops that read ``b + "_w"`` (conv / fc
    outputs), not external outputs, in op order, without the last two (the head).  Taken
    per namescope, so every device of a Parallelized net keeps its own head."""
    found: list[str] = []
    for op in ops:
        for b in op.output:
            if (b.startswith(namescope) and b + "_w" in op.input
                    and b not in external_outputs and b not in found):
                found.append(b)
    return found[:-2]


def verify_op_schemas(ops: OpList) -> None:
    """Raise :class:`OperatorDefError` (a RuntimeError) for an op that breaks its schema's
    arity or an in-place pair the schema enforces (``IndexFreeze(A) -> B``), as Caffe2's
    memonger does before recycling."""
    for index, op in enumerate(ops):
        schema = OPERATORS.get(op.type)
        if schema is None:
            continue
        problem = schema.check_arity(len(op.input), len(op.output))
        for i, o in schema.extra.get("enforce_inplace", ()):
            if i < len(op.input) and o < len(op.output) and op.input[i] != op.output[o]:
                problem = (f"{op.type} must run in place: input {i} ({op.input[i]!r}) and "
                           f"output {o} ({op.output[o]!r}) must be the same blob")
        if problem is not None:
            raise OperatorDefError(
                f"Memonger: op {index} ({op.type} {list(op.input)} -> {list(op.output)}) "
                f"does not verify against its schema: {problem}.")


def share_grad_blobs(net: Any, losses: Iterable[Any], param_grads: Iterable[Any],
                     namescope: str, dont_share_blobs: Iterable[Any] | None = None,
                     share_activations: bool = False,
                     blob_shapes: Mapping[str, Any] | None = None) -> caffe2_pb2.NetDef:
    """Share the buffers of gradient blobs (and, with ``share_activations``, forward
    activations) under ``namescope``; returns a new NetDef (``net`` is not changed).

    Gradient blobs are names ending ``_grad`` (or autodiff's partial gradients,
    ``..._grad_autosplit_<k>``) that start with the namescope (or with ``"_" + namescope``,
    the autosplit form), param gradients excepted.  Shared blobs are
    renamed ``{namescope}__m{N}_shared``.  Raises :class:`MemongerError` if the result
    would not be equivalent (graph equality, in-place pairs).
    """
    original = as_netdef(net)
    verify_op_schemas(original.op)
    ns = _normalise_namescope(namescope)
    grads = _blob_names(param_grads)
    params = {g[: -len("_grad")] for g in grads if g.endswith("_grad")}
    keep = (pinned_blobs(original) | grads | params | _blob_names(losses)
            | _blob_names(dont_share_blobs))
    ops = list(original.op)
    candidates = {b for op in ops for b in list(op.input) + list(op.output)
                  if _is_grad_name(b) and (b.startswith(ns) or b.startswith("_" + ns))}
    if share_activations:
        candidates |= set(_forward_activations(ops, set(original.external_output), ns))
    slots = plan_slots(ops, candidates - keep, _sizes_from_shapes(blob_shapes), dag=True)
    optimized = as_netdef(original)
    rename_blobs(optimized.op, _shared_names(original, ns, slots))
    _check(original, optimized, "share_grad_blobs")
    log.info("share_grad_blobs(%s): %d blobs -> %d buffers", ns, sum(map(len, slots)),
             len(slots))
    return optimized


_FAST_SHARED = re.compile(r"__m\d+_shared$")


def optimize_inference_fast(net: Any, static_blobs: Iterable[Any]) -> caffe2_pb2.NetDef:
    """Recycle every non-static blob whose last use has passed, in op order; buffers are
    named ``__m<k>_shared`` (no namescope).  Nets of another type than ``""``/``"simple"``,
    nets with a RecurrentNetwork op and nets already memongered come back unchanged;
    returns a new NetDef."""
    original = as_netdef(net)
    ops = list(original.op)
    if (original.type not in ("", "simple")
            or any(op.type == "RecurrentNetwork" for op in ops)
            or any(_FAST_SHARED.match(b) for op in ops for b in list(op.input) + list(op.output))):
        return original
    keep = pinned_blobs(original) | _blob_names(static_blobs)
    candidates = {b for op in ops for b in op.output} - keep
    optimized = as_netdef(original)
    rename_blobs(optimized.op, _shared_names(original, "", plan_slots(ops, candidates,
                                                                       dag=False)))
    _check(original, optimized, "optimize_inference_fast")
    return optimized


def _check_inference_net(proto: caffe2_pb2.NetDef) -> None:
    """Every input is an external input or made earlier; no gradient ops."""
    known = set(proto.external_input)
    for op in proto.op:
        if op.is_gradient_op or "Gradient" in op.type:
            raise MemongerError(f"optimize_inference_for_dag: {op.type} is a gradient op; "
                                "the pass is for inference nets only")
        for b in op.input:
            if b not in known:
                raise MemongerError(f"{b} not in external input")
        known.update(op.output)


def optimize_inference_for_dag(net: Any, input_blobs: Iterable[Any],
                               namescope: str = "") -> caffe2_pb2.NetDef:
    """Recycle the activations (neither external inputs nor outputs) under ``namescope``
    without adding dependencies between ops (so parallel branches stay parallel).  Shared
    blobs are renamed ``{namescope}__m{N}_shared``; returns a new NetDef."""
    original = as_netdef(net)
    verify_op_schemas(original.op)
    _check_inference_net(original)
    ns = _normalise_namescope(namescope)
    keep = (pinned_blobs(original) | _blob_names(input_blobs) | set(original.external_input)
            | set(original.external_output))
    ops = list(original.op)
    candidates = {b for op in ops for b in op.output if b.startswith(ns)} - keep
    slots = plan_slots(ops, candidates, dag=True)
    optimized = as_netdef(original)
    rename_blobs(optimized.op, _shared_names(original, ns, slots))
    _check(original, optimized, "optimize_inference_for_dag")
    return optimized


def _release_candidates(proto: caffe2_pb2.NetDef, dont_free: set[str],
                        selector_fun: Callable[[str], bool] | None) -> set[str]:
    """Caffe2's rule: outputs not read before they are written (and passing the selector),
    used as an input somewhere, not external outputs, not kept, not Alias inputs."""
    seen_inputs: set[str] = set()
    candidates: set[str] = set()
    for op in proto.op:
        candidates.update(b for b in op.output if b not in seen_inputs
                          and (selector_fun is None or selector_fun(b)))
        seen_inputs.update(op.input)
    candidates -= set(proto.external_output)
    candidates &= seen_inputs
    candidates -= dont_free
    candidates -= {b for op in proto.op if op.type == "Alias" for b in op.input}
    return candidates


def release_blobs_when_used(netproto: Any, dont_free_blobs: Iterable[Any],
                            selector_fun: Callable[[str], bool] | None = None
                            ) -> caffe2_pb2.NetDef:
    """Insert ``Free([b], [b])`` right after the op that uses ``b`` last, for every blob
    the net writes before reading it (external outputs, Alias inputs, blobs of ops with
    side effects or step nets and ``dont_free_blobs`` excepted; ``selector_fun(name)`` may
    veto more).  Returns a new NetDef; use it with a memory pool that makes reallocation
    cheap."""
    original = as_netdef(netproto)
    keep = pinned_blobs(original) - {b for op in original.op if op.type == "Alias"
                                     for b in op.output}
    candidates = _release_candidates(original, _blob_names(dont_free_blobs),
                                     selector_fun) - keep
    after: dict[int, list[str]] = {}
    for i in reversed(range(len(original.op))):
        op = original.op[i]
        for b in list(op.input) + list(op.output):
            if b in candidates:
                candidates.discard(b)
                after.setdefault(i, []).append(b)
    ops = []
    for i, op in enumerate(original.op):
        ops.append(op)
        for b in sorted(after.get(i, ())):
            free = caffe2_pb2.OperatorDef(type="Free", input=[b], output=[b])
            if op.HasField("device_option"):
                free.device_option.CopyFrom(op.device_option)
            ops.append(free)
    result = copy.deepcopy(original)
    del result.op[:]
    result.op.extend(ops)
    return result
