"""Sharded optimizer state (ZeRO-1): ``Parallelize(..., shard_optimizer_state=True)``.

Every parameter with a dense gradient gets one owner among the ranks (hosts x local
devices; rank ``host * len(devices) + i`` is local device ``devices[i]`` of host ``host``),
by a deterministic, balanced assignment by bytes (:func:`assign_owners`, a pure function of
the graph, so every rank computes the same plan).  Then (2 CPU devices, ``fc_w`` owned by
rank 1, ``fc_b`` by rank 0, SGD with momentum)::

    before (Caffe2):  Sum([cpu_0/fc_w_grad, cpu_1/fc_w_grad]) -> cpu_0/fc_w_grad
                      Copy(cpu_0/fc_w_grad) -> cpu_1/fc_w_grad
                      MomentumSGDUpdate(cpu_0/fc_w_grad, cpu_0/fc_w_momentum, lr, cpu_0/fc_w)
                      MomentumSGDUpdate(cpu_1/fc_w_grad, cpu_1/fc_w_momentum, lr, cpu_1/fc_w)
    after:            Sum([cpu_0/fc_w_grad, cpu_1/fc_w_grad]) -> cpu_1/fc_w_grad   (to owner)
                      MomentumSGDUpdate(cpu_1/fc_w_grad, cpu_1/fc_w_momentum, lr, cpu_1/fc_w)
                      Copy(cpu_1/fc_w) -> cpu_0/fc_w                       (updated param back)
    param_init_net:   ConstantFill(cpu_1/fc_w) -> cpu_1/fc_w_momentum      (owner only)

Across hosts (GLOO) the reduction is one ``Reduce`` per gradient to the owner's host
(``root``) and the updated parameter comes back with one ``Broadcast`` from it (the owner's
copy listed first).  The optimizer builder runs as in Caffe2, for every device;
:func:`shard_updates` then keeps each parameter's update ops and state-init ops only on its
owner: an update op belongs to the parameter copy whose blobs (the param, its gradient, and
everything derived from them) it reads or writes; ops touching none (iteration counter,
learning rate, constants) stay on every device; an op touching two parameters (e.g. a global
gradient-norm clip) makes ownership undeterminable and is refused.  Sparse (GradientSlice)
gradients keep Caffe2's replicated update.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpgraph.errors import ParallelizeError
from dpgraph.ir.blob import GradientSlice
from dpgraph.parallel.grouping import stripBlobName
from dpgraph.parallel.passes import parallel_pass
from dpgraph.parallel.shard_reduce import broadcast_params
from dpgraph.parallel.state import ParallelState
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY
from dpgraph.runtime.shapes import infer_shapes_and_types

Key = tuple[str, int]  # (stripped param name, local device)


@dataclass(frozen=True)
class ShardPlan:
    """Who owns which parameter (published as ``model._shard_plan``)."""

    devices: tuple[int, ...]
    num_hosts: int
    host: int  # this process's shard_id
    prefix: str
    #: stripped param name -> owning rank
    owner: Mapping[str, int]
    #: stripped grad name -> stripped param name (the sharded gradients)
    grads: Mapping[str, str]
    #: stripped param name -> bytes
    nbytes: Mapping[str, int]
    #: stripped optimizer-state blob name -> stripped param name (after the updates)
    state: Mapping[str, str] = field(default_factory=dict)
    #: stripped state name -> the serialized init ops that make it on the master device
    #: (checkpoints rebuild a state blob's buffer on ranks that do not own it)
    state_init: Mapping[str, tuple[bytes, ...]] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return self.num_hosts * len(self.devices)

    def host_of(self, rank: int) -> int:
        return rank // len(self.devices)

    def device_of(self, rank: int) -> int:
        return self.devices[rank % len(self.devices)]

    def local_owner(self, param: str) -> int | None:
        """The local device owning ``param``, or None when another host owns it."""
        rank = self.owner[param]
        return self.device_of(rank) if self.host_of(rank) == self.host else None

    def blob(self, device: int, name: str) -> str:
        return f"{self.prefix}_{device}/{name}"

    def rank_bytes(self) -> list[int]:
        """Parameter bytes owned by each rank."""
        loads = [0] * self.ranks
        for param, rank in self.owner.items():
            loads[rank] += self.nbytes[param]
        return loads


def assign_owners(sizes: Iterable[tuple[str, int]], ranks: int) -> dict[str, int]:
    """Largest first, each to the least-loaded rank (ties: the lower rank; equal sizes in
    name order): a deterministic, balanced partition by bytes."""
    heap = [(0, rank) for rank in range(ranks)]
    owners: dict[str, int] = {}
    for name, nbytes in sorted(sizes, key=lambda item: (-item[1], item[0])):
        load, rank = heapq.heappop(heap)
        owners[name] = rank
        heapq.heappush(heap, (load + nbytes, rank))
    return owners


def _param_bytes(state: ParallelState, params: Mapping[str, str]) -> dict[str, int]:
    """Bytes of each (stripped) param from its master copy's shape in the param init net;
    a param of unknown shape counts as one element."""
    shapes, types = infer_shapes_and_types([state.model.param_init_net])
    sizes = {}
    for name, full in params.items():
        dtype = np.dtype(DATA_TYPE_TO_NUMPY.get(types.get(full, 1), np.float32))
        shape = shapes.get(full)
        count = int(np.prod(shape)) if shape else 1
        sizes[name] = count * dtype.itemsize
    return sizes


@parallel_pass(reads=("grouped", "grad_names", "param_init_net", "model", "config"),
               writes=("shard_plan",), enabled=lambda config: config.shard_optimizer_state)
def assign_shards(state: ParallelState) -> None:
    """The owner of every parameter with a dense gradient on every device."""
    param_of = {str(g): str(p) for p, g in state.model.param_to_grad.items()
                if not isinstance(g, GradientSlice)}
    grads: dict[str, str] = {}
    masters: dict[str, str] = {}
    for name in state.grad_names:
        group = state.grouped[name]
        master = group.get(state.master)
        if (len(group) != len(state.devices) or master is None
                or isinstance(master, GradientSlice) or str(master) not in param_of):
            continue
        param = param_of[str(master)]
        grads[name] = stripBlobName(param)
        masters[stripBlobName(param)] = param
    nbytes = _param_bytes(state, masters)
    config = state.config
    ranks = len(config.devices) * config.num_shards
    rendezvous = config.rendezvous
    state.shard_plan = ShardPlan(
        devices=config.devices, num_hosts=config.num_shards,
        host=rendezvous.shard_id if rendezvous is not None and config.is_multi_host else 0,
        prefix=config.device_prefix, owner=assign_owners(nbytes.items(), ranks),
        grads=grads, nbytes=nbytes)


@parallel_pass(reads=("net", "param_init_net"), writes=("update_split",),
               enabled=lambda config: config.shard_optimizer_state)
def mark_updates(state: ParallelState) -> None:
    """Remember where the update builders' ops start in both nets."""
    state.update_split = (len(state.model.net.Proto().op),
                          len(state.model.param_init_net.Proto().op))


# --- which update op belongs to which parameter copy --------------------------------------
def _seed_keys(state: ParallelState) -> dict[str, Key]:
    """Every param copy with a gradient, its gradient (values and indices of a slice)."""
    keys: dict[str, Key] = {}
    head = f"{state.config.device_prefix}_"
    for param, grad in state.model.param_to_grad.items():
        full = str(param)
        scope = full.split("/", 1)[0]
        if not scope.startswith(head) or not scope[len(head):].isdigit():
            continue
        key = (stripBlobName(full), int(scope[len(head):]))
        blobs = [grad.indices, grad.values] if isinstance(grad, GradientSlice) else [grad]
        for blob in (full, *blobs):
            keys[str(blob)] = key
    return keys


def _describe(op: caffe2_pb2.OperatorDef) -> str:
    return f"{op.type}({list(op.input)}) -> {list(op.output)}"


def classify(ops: Sequence[caffe2_pb2.OperatorDef], keys: dict[str, Key],
             shared: set[str], seeds: Mapping[str, Key]) -> list[Key | None]:
    """The parameter copy each op belongs to (None: shared by all): the copy whose blobs it
    reads, or whose param or gradient it writes.  Extends ``keys`` with the blobs the ops
    derive from a copy (a blob written again takes the new writer's copy, e.g. an lr
    temporary reused for every param) and ``shared`` with the other outputs."""
    result: list[Key | None] = []
    for op in ops:
        touched = ({keys[b] for b in op.input if b in keys}
                   | {seeds[b] for b in op.output if b in seeds})
        if len(touched) > 1:
            names = sorted(f"{p} on device {d}" for p, d in touched)
            raise ParallelizeError(
                f"shard_optimizer_state: update op {_describe(op)} touches several parameters "
                f"({', '.join(names)}), so its owner cannot be determined. Write updates that "
                "touch one parameter each (e.g. no global gradient-norm clipping: "
                "max_gradient_norm), or use shard_optimizer_state=False.")
        key = next(iter(touched), None)
        if key is None:
            shared.update(op.output)
            for blob in op.output:
                keys.pop(blob, None)
        else:
            clash = [b for b in op.output if b in shared]
            if clash:
                raise ParallelizeError(
                    f"shard_optimizer_state: update op {_describe(op)} of parameter {key[0]} "
                    f"on device {key[1]} writes {clash}, which every device shares; its owner "
                    "cannot be determined. Keep per-parameter results in per-parameter blobs, "
                    "or use shard_optimizer_state=False.")
            keys.update((b, key) for b in op.output)
        result.append(key)
    return result


def _keep(plan: ShardPlan, key: Key | None) -> bool:
    if key is None or key[0] not in plan.owner:
        return True
    return plan.local_owner(key[0]) == key[1]


def _with_state(plan: ShardPlan, ops: Sequence[caffe2_pb2.OperatorDef],
                keys: Sequence[Key | None], seeds: Mapping[str, Key]) -> ShardPlan:
    """The plan with the optimizer state of the sharded parameters: their init-net outputs
    other than the param and gradient, by stripped name, and the master's init ops."""
    state: dict[str, str] = {}
    init: dict[str, list[bytes]] = {}
    for op, key in zip(ops, keys):
        if key is None or key[0] not in plan.owner:
            continue
        for blob in op.output:
            if blob not in seeds and blob.startswith(f"{plan.prefix}_{key[1]}/"):
                state[stripBlobName(blob)] = key[0]
                if key[1] == plan.devices[0]:
                    init.setdefault(stripBlobName(blob), []).append(op.SerializeToString())
    return dataclasses.replace(plan, state=state,
                               state_init={k: tuple(v) for k, v in init.items()})


def _replace_ops(net: Any, start: int, ops: Sequence[caffe2_pb2.OperatorDef]) -> None:
    proto = net.Proto()
    head = list(proto.op[:start])
    del proto.op[:]
    proto.op.extend([*head, *ops])
    net._recreate_lookup_tables = True


@parallel_pass(reads=("update_split", "shard_plan", "grouped", "blob_to_device", "model",
                      "config"),
               writes=("net", "param_init_net", "shard_plan", "broadcast_context"),
               enabled=lambda config: config.shard_optimizer_state)
def shard_updates(state: ParallelState) -> None:
    """Keep each parameter's update and state-init ops on its owner only, then copy (or
    broadcast) the updated parameters back to every device."""
    plan: ShardPlan = state.shard_plan
    assert plan is not None and state.update_split is not None
    net_start, init_start = state.update_split
    seeds = _seed_keys(state)
    keys: dict[str, Key] = dict(seeds)
    shared: set[str] = set()
    init_ops = list(state.model.param_init_net.Proto().op[init_start:])
    net_ops = list(state.model.net.Proto().op[net_start:])
    init_keys = classify(init_ops, keys, shared, seeds)
    net_keys = classify(net_ops, keys, shared, seeds)
    _replace_ops(state.model.param_init_net, init_start,
                 [op for op, key in zip(init_ops, init_keys) if _keep(plan, key)])
    _replace_ops(state.model.net, net_start,
                 [op for op, key in zip(net_ops, net_keys) if _keep(plan, key)])
    state.shard_plan = _with_state(plan, init_ops, init_keys, seeds)
    broadcast_params(state, state.model.net)
