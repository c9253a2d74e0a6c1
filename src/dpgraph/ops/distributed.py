"""Distributed ops: store handlers, common worlds and collectives across processes and hosts.

Caffe2's op style, executed by the collective backend of their common world
(:mod:`dpgraph.collectives`)::

    FileStoreHandlerCreate([], ["store"], path="/tmp/rdv", prefix="job")
    CreateCommonWorld(["store"], ["cw"], size=2, rank=0, engine="GLOO", timeout_ms=30000)
    Allreduce(["cw", "gpu_0/g", "gpu_1/g"], ["gpu_0/g", "gpu_1/g"], engine="GLOO")

A common world blob holds a :class:`~dpgraph.collectives.Backend`.  The kernels reach stores
and backends through ``ctx.workspace.collectives`` (the runtime's
:class:`~dpgraph.collectives.services.CollectiveServices`): this module sits in the ops layer,
below the collectives, and never imports them.  Collectives take the copies
of one blob on several local devices, reduce them locally and then across ranks, in place.
They are side-effecting and cross-device, and collectives on one common world must run in the
same order on every rank (Parallelize chains them with control inputs).  ``timeout_ms`` on an
op overrides its world's timeout; a peer that dies or never joins raises
:class:`~dpgraph.errors.CollectiveTimeoutError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import CollectiveError, NotSupportedError, RendezvousError
from dpgraph.ir.arrays import is_cupy_array
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.device_copy import OUTPUT_PLACEMENT

_MAX_COPIES = 512
_SHIFTED_INPLACE = [(i + 1, i) for i in range(_MAX_COPIES)]
_STORE_TIMEOUT_SEC = 300.0


def _seconds(ctx: OpContext, default: float | None) -> float | None:
    """``timeout_ms`` in seconds; absent or non-positive means ``default``."""
    timeout_ms = ctx.float_arg("timeout_ms", -1.0)
    return timeout_ms / 1000.0 if timeout_ms > 0 else default


def _services(ctx: OpContext) -> Any:
    services = getattr(ctx.workspace, "collectives", None)
    if services is None:
        raise CollectiveError(ctx.describe(
            "distributed ops run in a dpgraph workspace (workspace.RunOperatorOnce, "
            "RunNet), which provides the collective backends; this context has none"))
    return services


def _engine(ctx: OpContext, default: str = "GLOO") -> str:
    return (ctx.op.engine or ctx.str_arg("engine") or default).upper()


# --- store handlers ------------------------------------------------------------------------
@register_op("FileStoreHandlerCreate", inputs=0, outputs=1, side_effects=True)
def file_store_handler_create(ctx: OpContext) -> Outputs:
    """A store handler in the file system: ``path`` (a shared directory), ``prefix``."""
    path = ctx.str_arg("path")
    if not path:
        raise RendezvousError(ctx.describe("argument 'path' (a directory every rank can reach) "
                                           "is required"))
    timeout = _seconds(ctx, _STORE_TIMEOUT_SEC) or _STORE_TIMEOUT_SEC
    return (_services(ctx).file_store(path, ctx.str_arg("prefix"), timeout),)


@register_op("TCPStoreHandlerCreate", inputs=0, outputs=1, side_effects=True)
def tcp_store_handler_create(ctx: OpContext) -> Outputs:
    """A TCP store handler: ``host``, ``port``, ``is_master`` (1 on one rank; absent: serve if
    the port is free, else connect), optional ``world_size``, ``prefix`` and ``timeout_ms``."""
    host, port = ctx.str_arg("host", "127.0.0.1"), ctx.int_arg("port", 0)
    if port <= 0:
        raise RendezvousError(ctx.describe("argument 'port' (the store's TCP port) is required"))
    master = bool(ctx.int_arg("is_master")) if ctx.has_arg("is_master") else None
    world_size = ctx.int_arg("world_size") if ctx.has_arg("world_size") else None
    timeout = _seconds(ctx, _STORE_TIMEOUT_SEC) or _STORE_TIMEOUT_SEC
    return (_services(ctx).tcp_store(host, port, master, world_size, ctx.str_arg("prefix"),
                                     timeout),)


# --- common worlds ------------------------------------------------------------------------
@register_op("CreateCommonWorld", inputs=(0, 1), outputs=1, side_effects=True, collective=True)
def create_common_world(ctx: OpContext) -> Outputs:
    """A common world of ``size`` ranks, this one being ``rank``, met through the store handler
    input; ``engine`` (default GLOO) picks the backend, ``timeout_ms`` (default 30 s) bounds
    every collective on it; ``transport`` and ``interface`` configure Gloo."""
    if ctx.int_arg("mpi_rendezvous"):
        raise NotSupportedError(ctx.describe("MPI rendezvous is not supported; use a store "
                                             "handler (FileStoreHandlerCreate) instead"))
    if not ctx.has_arg("size"):
        raise RendezvousError(ctx.describe("argument 'size' (the number of ranks) is required"))
    store = ctx.inputs[0] if ctx.inputs else None
    services = _services(ctx)
    default_timeout = services.default_timeout_sec
    world = services.create_world(
        _engine(ctx), store=store, rank=ctx.int_arg("rank"), size=ctx.int_arg("size"),
        world=ctx.output_name(0), timeout=_seconds(ctx, default_timeout) or default_timeout,
        transport=ctx.str_arg("transport", "tcp") or "tcp", interface=ctx.str_arg("interface"))
    return (world,)


def _world(ctx: OpContext) -> Any:
    value = ctx.inputs[0] if ctx.inputs else None
    world = _services(ctx).as_world(value)
    if world is None:
        got = type(value).__name__
        name = ctx.input_name(0) if ctx.num_inputs else "<none>"
        raise CollectiveError(ctx.describe(
            f"input 0 ({name!r}) must be a common world, got {got}; create it with "
            "CreateCommonWorld in the init net and run that first"))
    return world  # type: ignore[return-value]


@register_op("CloneCommonWorld", inputs=1, outputs=1, side_effects=True, collective=True)
def clone_common_world(ctx: OpContext) -> Outputs:
    """A new common world with the same ranks and settings as the input one."""
    return (_world(ctx).clone(ctx.output_name(0)),)


@register_op("DestroyCommonWorld", inputs=1, outputs=(0, 1), inplace=[(0, 0)],
             side_effects=True, collective=True)
def destroy_common_world(ctx: OpContext) -> Outputs:
    """Release a common world; collectives on it raise afterwards."""
    world = _world(ctx)
    world.close()
    return (world,) * ctx.num_outputs


# --- collectives ---------------------------------------------------------------------------
def _buffers(ctx: OpContext) -> list[Any]:
    """The local copies (inputs 1..), as writable contiguous buffers.

    A copy is updated in place when its output is the same blob; otherwise it is copied first
    so the input blob keeps its value.
    """
    if ctx.num_inputs < 2:
        raise CollectiveError(ctx.describe("needs a common world and at least one blob"))
    buffers = []
    for index, value in enumerate(ctx.inputs[1:], start=1):
        inplace = index - 1 < ctx.num_outputs and ctx.output_name(index - 1) == ctx.input_name(
            index)
        buffers.append(_writable(value, copy=not inplace))
    return buffers


def _writable(value: Any, copy: bool) -> Any:
    if is_cupy_array(value):
        return value.copy() if copy else value
    array = np.asarray(value)
    if copy or array is not value or not array.flags.c_contiguous or not array.flags.writeable:
        return np.array(array, order="C", copy=True)
    return array


def _check_outputs(ctx: OpContext, expected: int) -> None:
    if ctx.num_outputs != expected:
        raise CollectiveError(ctx.describe(f"takes {expected} outputs (one per local copy), "
                                           f"got {ctx.num_outputs}"))


def _root(ctx: OpContext, world: Any) -> int:
    root = ctx.int_arg("root", 0)
    if not 0 <= root < world.size:
        raise CollectiveError(ctx.describe(f"root {root} is not a rank of common world "
                                           f"{world.name!r} (0..{world.size - 1})"))
    return root


@register_op("Allreduce", inputs=(2, None), outputs=(1, None), inplace=_SHIFTED_INPLACE,
             side_effects=True, cross_device=True, collective=True)
def allreduce(ctx: OpContext) -> Outputs:
    """Sum every local copy across devices and ranks, into every copy.

    dpgraph's argument ``wire_dtype`` (``"bfloat16"``, set by the gradient-compression pass
    on blobs holding bfloat16 values stored as float32) makes the values cross ranks as
    16-bit words; float16 blobs always do (:mod:`dpgraph.collectives.halfsum`)."""
    world = _world(ctx)
    _check_outputs(ctx, ctx.num_inputs - 1)
    wire = ctx.str_arg("wire_dtype")
    if wire:
        return tuple(world.allreduce(_buffers(ctx), _seconds(ctx, None), wire_dtype=wire))
    return tuple(world.allreduce(_buffers(ctx), _seconds(ctx, None)))


@register_op("Broadcast", inputs=(2, None), outputs=(1, None), inplace=_SHIFTED_INPLACE,
             side_effects=True, cross_device=True, collective=True)
def broadcast(ctx: OpContext) -> Outputs:
    """Copy the first local copy of rank ``root`` to every copy on every rank."""
    world = _world(ctx)
    _check_outputs(ctx, ctx.num_inputs - 1)
    return tuple(world.broadcast(_buffers(ctx), _root(ctx, world), _seconds(ctx, None)))


@register_op("Reduce", inputs=(2, None), outputs=(1, None), inplace=_SHIFTED_INPLACE,
             side_effects=True, cross_device=True, collective=True)
def reduce(ctx: OpContext) -> Outputs:
    """Sum into the copies of rank ``root``; other ranks' copies keep their values."""
    world = _world(ctx)
    _check_outputs(ctx, ctx.num_inputs - 1)
    return tuple(world.reduce(_buffers(ctx), _root(ctx, world), _seconds(ctx, None)))


@register_op("Allgather", inputs=(2, None), outputs=1, side_effects=True, cross_device=True,
             collective=True)
def allgather(ctx: OpContext) -> Outputs:
    """Stack the local copies of every rank: ``(size * copies, *shape)``, rank-major."""
    world = _world(ctx)
    copies = [_writable(value, copy=False) for value in ctx.inputs[1:]]
    return (world.allgather(copies, _seconds(ctx, None)),)


@register_op("ReduceScatter", inputs=(2, None), outputs=(1, None), side_effects=True,
             cross_device=True, collective=True)
def reduce_scatter(ctx: OpContext) -> Outputs:
    """The sum over copies and ranks, of which this rank keeps rows
    ``[rank * n / size, (rank + 1) * n / size)``: one output per local copy."""
    world = _world(ctx)
    _check_outputs(ctx, ctx.num_inputs - 1)
    copies = [_writable(value, copy=False) for value in ctx.inputs[1:]]
    return tuple(world.reduce_scatter(copies, _seconds(ctx, None)))


@register_op("Barrier", inputs=1, outputs=0, side_effects=True, collective=True)
def barrier(ctx: OpContext) -> Outputs:
    """Wait until every rank of the common world reaches this barrier."""
    _world(ctx).barrier(_seconds(ctx, None))
    return ()


def _after_world(op_key: Any, input_keys: list[Any], args: Any) -> list[Any]:
    """Output k lives where local copy k (input k + 1) lives."""
    return [key if key is not None else op_key for key in input_keys[1:]]


for _type in ("Allreduce", "Broadcast", "Reduce", "ReduceScatter"):
    OPERATORS.lookup(_type).extra[OUTPUT_PLACEMENT] = _after_world
