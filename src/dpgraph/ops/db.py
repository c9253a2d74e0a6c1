"""DB operators: CreateDB, DBExists, TensorProtosDBInput, CreateBlobsQueueDB.

``CreateDB`` opens a :class:`~dpgraph.db.DBReader` (READ mode, positioned at its shard);
``TensorProtosDBInput`` reads ``batch_size`` records from it (wrapping around at the end)
and stacks each record's TensorProtos into its outputs, ``[batch_size] + dims`` each.  Like
Caffe2's PrefetchOperator it reads the next batch on a background thread while the net runs
(so its reader is one batch ahead; ``no_prefetch=1`` reads synchronously); the batch in
flight when the op instance is destroyed is dropped, its records consumed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dpgraph.errors import ArgumentError, DBError, ShapeError
from dpgraph.ir.blob_serde import decode_tensor_protos
from dpgraph.ir.protos_batch import decode_joined_tensor_protos
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient

if TYPE_CHECKING:
    from dpgraph.data.prefetch import Prefetcher
    from dpgraph.db.reader import DBReader
    from dpgraph.db.services import StorageServices


def storage(ctx: OpContext) -> StorageServices:
    """The DB and image services of the runtime workspace running the op."""
    services = getattr(ctx.workspace, "storage", None)
    if services is None:
        raise DBError(ctx.describe(
            "DB and input ops run in a dpgraph workspace (workspace.RunOperatorOnce, RunNet), "
            "which provides the DB types and readers; this context has none."))
    return services  # type: ignore[no-any-return]


def resolve_path(ctx: OpContext, path: str) -> str:
    """Caffe2's ``absolute_path``: 0 joins the workspace root folder and ``path`` literally."""
    if ctx.int_arg("absolute_path", 0):
        return path
    root = getattr(ctx.workspace, "root_folder", ".") if ctx.workspace is not None else "."
    return f"{root}/{path}"


def required_str(ctx: OpContext, name: str, message: str) -> str:
    value = ctx.str_arg(name, "")
    if not value:
        raise ArgumentError(ctx.describe(message))
    return value


def on_device(ctx: OpContext, array: np.ndarray) -> Any:
    """``array`` on the op's device (numpy for CPU and virtual GPUs)."""
    return array if ctx.xp is np else ctx.xp.asarray(array)


def reader_input(ctx: OpContext, index: int = 0) -> DBReader:
    reader = ctx.inputs[index]
    if not storage(ctx).is_reader(reader):
        raise ShapeError(ctx.describe(
            f"input {ctx.input_name(index)!r} is a {type(reader).__name__}, not a DB reader; "
            "create it with CreateDB (model.CreateDB / brew.db_input)."))
    return reader


@register_op("CreateDB", inputs=0, outputs=1, side_effects=True)
def create_db(ctx: OpContext) -> Outputs:
    """Open ``db`` (type ``db_type``, default leveldb) for reading; args num_shards,
    shard_id.  The path is used as given (no root folder)."""
    source = required_str(ctx, "db", "Must specify a db name.")
    return (storage(ctx).reader(ctx.str_arg("db_type", "leveldb"), source,
                                ctx.int_arg("num_shards", 1), ctx.int_arg("shard_id", 0),
                                name=ctx.output_name(0)),)


@register_op("DBExists", inputs=0, outputs=1, side_effects=True)
def db_exists_op(ctx: OpContext) -> Outputs:
    """A bool scalar: does ``db_name`` (type ``db_type``) open for reading."""
    path = resolve_path(ctx, ctx.str_arg("db_name", ""))
    return (np.array(storage(ctx).db_exists(ctx.str_arg("db_type", ""), path),
                     dtype=np.bool_),)


def prefetcher(ctx: OpContext, reader: DBReader) -> Prefetcher:
    """This op instance's prefetcher of ``reader`` (closed with the instance, dropping its
    batch)."""
    state = ctx.state()
    if "prefetcher" not in state:
        state["prefetcher"] = storage(ctx).prefetcher(may_block=reader.db.blocking)
    return state["prefetcher"]


@register_op("TensorProtosDBInput", inputs=1, outputs=(1, None), side_effects=True)
def tensor_protos_db_input(ctx: OpContext) -> Outputs:
    """Read ``batch_size`` records (0: one record, unbatched) of ``TensorProtos``; output i
    stacks ``protos[i]`` of each record."""
    reader = reader_input(ctx)
    batch_size = ctx.int_arg("batch_size", 0)
    if batch_size < 0:
        raise ArgumentError(ctx.describe(f"batch_size must be >= 0, got {batch_size}."))
    if ctx.int_arg("no_prefetch", 0):
        outputs = _read_tensor_protos(reader, batch_size)
    else:
        outputs = prefetcher(ctx, reader).next(
            lambda size: _read_tensor_protos(reader, size), lambda: batch_size)
    if len(outputs) != ctx.num_outputs:
        raise ShapeError(ctx.describe(
            f"the records of {reader.db.where()} hold {len(outputs)} TensorProtos each, the "
            f"op has {ctx.num_outputs} outputs; give one output per proto in each record."))
    return tuple(on_device(ctx, t) for t in outputs)


def _read_tensor_protos(reader: DBReader, batch_size: int) -> list[np.ndarray]:
    where = f"TensorProtosDBInput reading {reader.db.where()}"
    if batch_size == 0:
        key, value = reader.read()
        return decode_tensor_protos(value, f"{where}, key {key!r}")
    keys, lengths, joined = reader.read_joined(batch_size)
    return decode_joined_tensor_protos(joined, lengths, where, keys)


@register_op("CreateBlobsQueueDB", inputs=1, outputs=1, side_effects=True)
def create_blobs_queue_db(ctx: OpContext) -> Outputs:
    """A DB reader whose cursor pops records from a blobs queue; args key_blob_index (-1),
    value_blob_index (0), timeout_secs (0: wait forever)."""
    return (storage(ctx).queue_reader(ctx.inputs[0], ctx.int_arg("key_blob_index", -1),
                                      ctx.int_arg("value_blob_index", 0),
                                      ctx.float_arg("timeout_secs", 0.0), ctx.input_name(0),
                                      ctx.output_name(0)),)


for _op_type in ("CreateDB", "DBExists", "TensorProtosDBInput", "CreateBlobsQueueDB"):
    register_gradient(_op_type)(no_gradient)
