"""Gradient buckets: one collective for many dense gradients.

``Parallelize(..., gradient_bucket_mb=25)`` packs the dense gradients, in the order the
backward pass produces them, into contiguous per-device buckets of about 25 MB (one dtype
per bucket), reduces each bucket with the collective Caffe2 would have used for one
gradient, and unpacks it into views that the updates read::

    before (per blob, Caffe2):  Allreduce([cw, cpu_0/fc2_w_grad, cpu_1/fc2_w_grad]) ...
                                Allreduce([cw, cpu_0/fc1_w_grad, cpu_1/fc1_w_grad]) ...
    after:  GradientBucketPack([cpu_d/fc2_w_grad, cpu_d/fc2_b_grad, ...]) -> cpu_d/grad_bucket_0
            Allreduce([cw, cpu_0/grad_bucket_0, cpu_1/grad_bucket_0])
            GradientBucketUnpack([cpu_d/grad_bucket_0, cpu_d/fc2_w_grad, ...]) -> same grads

Bucket assignment (:func:`assign_buckets`) is a pure function of the graph: gradient sizes
come from the param init net, the order from the net's op order, so every rank builds the
same buckets.  Sparse gradients and gradients of unknown size keep Caffe2's per-blob path.
Elements are only moved, never combined, so the sums equal the per-blob sums bit for bit
wherever the reduction order per element is the same (local devices; 2 ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.parallel._emit import device_option, emit, make_op
from dpgraph.parallel.state import ParallelState
from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY
from dpgraph.runtime.shapes import infer_shapes_and_types

MB = 1 << 20
BUCKET_PREFIX = "grad_bucket_"

Reducer = Callable[[ParallelState, Sequence[str], Any], None]


@dataclass(frozen=True)
class GradInfo:
    """One dense gradient as the bucketing pass sees it (sizes of the master copy)."""

    name: str  # stripped name (the key of state.grouped)
    nbytes: int
    dtype: str
    order: int  # index of the op that last writes it in the net
    group: Any = None  # gradients of different groups (owners) never share a bucket
    op: int = -1  # that op's index (-1: unknown); one op's gradients share a bucket


@dataclass
class Bucket:
    """Gradients reduced together: one dtype, production order."""

    index: int
    dtype: str
    grads: list[GradInfo] = field(default_factory=list)
    group: Any = None

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.grads)

    @property
    def ready(self) -> int:
        """Op index after which every gradient of the bucket exists."""
        return max(g.order for g in self.grads)

    @property
    def name(self) -> str:
        return f"{BUCKET_PREFIX}{self.index}"


def assign_buckets(grads: Sequence[GradInfo], bucket_bytes: float,
                   join_same_op: bool = False) -> list[Bucket]:
    """Greedy packing in production order; one open bucket per dtype (and group), closed
    when the next gradient would take it past ``bucket_bytes`` (a larger gradient gets its
    own bucket).  With ``join_same_op`` (``"auto"``), the gradients one op writes are
    packed as one unit (the size test takes them all): splitting them would cost a
    collective and gain no overlap, as they are ready together.

    Returns the buckets sorted by the op after which they are ready (then by first grad).
    """
    ordered = sorted(grads, key=lambda g: (g.order, g.name))
    unit: dict[tuple[str, Any, int], int] = {}
    for grad in ordered:
        if join_same_op and grad.op >= 0:
            key = (grad.dtype, grad.group, grad.op)
            unit[key] = unit.get(key, 0) + grad.nbytes
    open_by_kind: dict[tuple[str, Any], list[GradInfo]] = {}
    closed: list[tuple[tuple[str, Any], list[GradInfo]]] = []
    for grad in ordered:
        kind = (grad.dtype, grad.group)
        current = open_by_kind.setdefault(kind, [])
        same_op = (join_same_op and bool(current) and grad.op >= 0
                   and current[-1].op == grad.op)
        size = unit.get((*kind, grad.op), grad.nbytes)
        if (current and not same_op
                and sum(g.nbytes for g in current) + size > bucket_bytes):
            closed.append((kind, current))
            current = open_by_kind[kind] = []
        current.append(grad)
    closed.extend((kind, items) for kind, items in open_by_kind.items() if items)
    closed.sort(key=lambda item: (max(g.order for g in item[1]), item[1][0].order,
                                  item[1][0].name))
    return [Bucket(index=i, dtype=kind[0], grads=items, group=kind[1])
            for i, (kind, items) in enumerate(closed)]


# --- gradient sizes and order from the graph ----------------------------------------------
def _last_writers(net_proto: Any) -> dict[str, int]:
    result: dict[str, int] = {}
    for index, op in enumerate(net_proto.op):
        for blob in op.output:
            result[blob] = index
    return result


def _param_of_grad(state: ParallelState) -> dict[str, str]:
    """Full grad name -> full param name, for every dense gradient."""
    result: dict[str, str] = {}
    for param, grad in state.model.param_to_grad.items():
        if not isinstance(grad, GradientSlice):
            result[str(grad)] = str(param)
    return result


def gradient_infos(state: ParallelState, names: Sequence[str], net: Any
                   ) -> tuple[list[GradInfo], list[str]]:
    """``(dense blobs with known size, the other names)`` among ``names``.

    A blob's size is its own, or its param's, shape in the param init net; its order is the
    index of the last op of ``net`` writing it (-1 for blobs ``net`` only reads, such as
    BMUF's params), then its position in ``names``.
    """
    shapes, types = infer_shapes_and_types([state.model.param_init_net])
    writers = _last_writers(net.Proto())
    params = _param_of_grad(state)
    infos, others = [], []
    for position, name in enumerate(names):
        group = state.grouped[name]
        master = group.get(state.master)
        if (len(group) != len(state.devices) or master is None
                or isinstance(master, GradientSlice)):
            others.append(name)
            continue
        blob = str(master)
        source = blob if blob in shapes else params.get(blob)
        if source is None or source not in shapes:
            others.append(name)
            continue
        dtype = np.dtype(DATA_TYPE_TO_NUMPY.get(types.get(source, 1), np.float32))
        count = int(np.prod(shapes[source])) if shapes[source] else 1
        writer = writers.get(blob, -1)
        order = writer * (len(names) + 1) + position
        infos.append(GradInfo(name, count * dtype.itemsize, dtype.name, order, op=writer))
    return infos, others


# --- emission --------------------------------------------------------------------------------
def _device_options(state: ParallelState, grad: str) -> dict[int, Any]:
    """The device option of each copy of ``grad`` (its first op's, as Caffe2 infers)."""
    options = {}
    for device, blob in state.grouped[grad].items():
        option = state.blob_to_device.get(str(blob))
        options[device] = option if option is not None else device_option(
            state.config.device_type, device)
    return options


def _register_bucket(state: ParallelState, bucket: Bucket) -> list[str]:
    """Group the bucket blobs like a gradient so the per-blob reducers can handle them;
    returns the full names placed in ``state.blob_to_device`` (removed afterwards)."""
    options = _device_options(state, bucket.grads[0].name)
    group: dict[int, Any] = {}
    for device in state.devices:
        full = f"{state.namescope(device)}/{bucket.name}"
        group[device] = BlobReference(full)
        state.blob_to_device[full] = options[device]
    state.grouped[bucket.name] = group
    return [str(b) for b in group.values()]


def _emit_pack(state: ParallelState, net: Any, bucket: Bucket) -> None:
    options = _device_options(state, bucket.grads[0].name)
    for device in state.devices:
        grads = [state.grouped[g.name][device] for g in bucket.grads]
        emit(net, make_op("GradientBucketPack", grads, [state.grouped[bucket.name][device]],
                          options[device]))


def _emit_unpack(state: ParallelState, net: Any, bucket: Bucket, copy: bool) -> None:
    options = _device_options(state, bucket.grads[0].name)
    for device in state.devices:
        grads = [state.grouped[g.name][device] for g in bucket.grads]
        emit(net, make_op("GradientBucketUnpack", [state.grouped[bucket.name][device], *grads],
                          grads, options[device], copy=1 if copy else None))


def _ordered_items(buckets: Sequence[Bucket], others: Sequence[str], names: Sequence[str],
                   writers: Mapping[str, int], state: ParallelState) -> list[str]:
    """Bucket names and per-blob names, in the order they become ready (the keys of
    :func:`gradient_infos`)."""
    items: list[tuple[int, str]] = [(b.ready, b.name) for b in buckets]
    position = {name: i for i, name in enumerate(names)}
    for name in others:
        master = state.grouped[name].get(state.master)
        blob = str(master.values) if isinstance(master, GradientSlice) else str(master)
        items.append((writers.get(blob, -1) * (len(names) + 1) + position[name], name))
    items.sort()
    return [name for _, name in items]


def plan_buckets(state: ParallelState, names: Sequence[str], net: Any,
                 bucket_mb: float | str, group_of: Callable[[str], Any] | None = None
                 ) -> tuple[list[Bucket], list[str]]:
    """The buckets for ``names`` reduced in ``net`` and the names left to the per-blob
    path; with ``group_of`` (e.g. the owner of a sharded gradient) a bucket holds one
    group's gradients only."""
    infos, others = gradient_infos(state, names, net)
    if group_of is not None:
        infos = [replace(info, group=group_of(info.name)) for info in infos]
    if bucket_mb == "auto":
        from dpgraph.parallel.plan.planner import auto_bucket_bytes

        bucket_bytes = auto_bucket_bytes(state, infos)
    else:
        bucket_bytes = float(bucket_mb) * MB
    return assign_buckets(infos, bucket_bytes, join_same_op=bucket_mb == "auto"), others


def reduce_in_buckets(state: ParallelState, names: Sequence[str], net: Any,
                      reduce: Reducer, bucket_mb: float | str, copy: bool = False,
                      group_of: Callable[[str], Any] | None = None) -> list[Bucket]:
    """Pack, reduce (with ``reduce``, the per-blob reducer of this configuration) and unpack.

    ``reduce`` is called once, with the bucket names and the per-blob names in the order they
    become ready, so collectives keep one concurrency context.  With ``group_of``, buckets
    hold one group's gradients and ``state.reduce_groups`` names each bucket's group while
    ``reduce`` runs.  Returns the buckets.
    """
    if len(state.devices) == 1 and not state.config.is_multi_host:
        return []
    buckets, others = plan_buckets(state, names, net, bucket_mb, group_of)
    writers = _last_writers(net.Proto())
    order = _ordered_items(buckets, others, names, writers, state)
    placed: list[str] = []
    try:
        for bucket in buckets:
            placed += _register_bucket(state, bucket)
        for bucket in buckets:
            _emit_pack(state, net, bucket)
            if group_of is not None:
                state.reduce_groups[bucket.name] = bucket.group
        reduce(state, order, net)
        for bucket in buckets:
            _emit_unpack(state, net, bucket, copy)
    finally:  # the buckets are not Caffe2 blobs: keep them out of the published groups
        for bucket in buckets:
            state.grouped.pop(bucket.name, None)
            state.reduce_groups.pop(bucket.name, None)
        for blob in placed:
            state.blob_to_device.pop(blob, None)
    state.model_attrs["_gradient_buckets"] = [[g.name for g in b.grads] for b in buckets]
    return buckets
