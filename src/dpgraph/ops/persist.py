"""Persistence operators: Save, Load, Checkpoint (alias Snapshot).

Blobs are written with :mod:`dpgraph.ir.blob_serde` exactly as Caffe2 lays them out (tensor
chunk ``k`` of ``W`` under key ``W#%k``, strings under their plain name), to any registered
DB type.  Paths are joined to the workspace root folder unless ``absolute_path=1``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from dpgraph.errors import ArgumentError, BlobNotFoundError, DBError, ShapeError
from dpgraph.ir.blob_serde import (
    FLOAT_DEFAULT,
    BlobAssembler,
    BlobOptions,
    blob_name_of_key,
    options_for,
    parse_blob_proto,
    parse_serialization_options,
    serialize_blob_chunks,
)
from dpgraph.ir.blob_size import estimate_blob_size, estimate_tensor_size
from dpgraph.ir.device import device_key
from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops import dataset_serde  # noqa: F401  (registers blob serializers)
from dpgraph.ops.context import REMOVE_BLOB, OpContext, Outputs
from dpgraph.ops.db import on_device, reader_input, required_str, resolve_path, storage
from dpgraph.ops.device_copy import OUTPUT_PLACEMENT
from dpgraph.ops.fill import no_gradient

if TYPE_CHECKING:
    from dpgraph.db.base import Cursor

DeviceKey = tuple[int, int]
_PLACEMENT = threading.local()  # Load -> its output placement function (same thread)


# --- Save --------------------------------------------------------------------------------------
def _strip(name: str, prefix: str) -> str:
    index = name.find(prefix) if prefix else -1
    return name if index < 0 else name[index + len(prefix):]


def _stored_names(ctx: OpContext) -> list[str]:
    overrides = ctx.arg("blob_name_overrides", None)
    prefix = ctx.str_arg("strip_prefix", "")
    if overrides is not None and overrides != []:
        if prefix:
            raise ArgumentError(ctx.describe(
                "strip_prefix and blob_name_overrides are mutually exclusive."))
        overrides = [str(o) for o in overrides]
        if len(overrides) != ctx.num_inputs:
            raise ArgumentError(ctx.describe(
                f"Number of blobs and blob_name_overrides mismatch: {ctx.num_inputs} inputs, "
                f"{len(overrides)} overrides."))
        names = overrides
    else:
        names = [_strip(name, prefix) for name in ctx.op.input]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ArgumentError(ctx.describe(f"Duplicated input: {name}; each saved blob needs "
                                             "a unique name."))
        seen.add(name)
    return names


def _raw_arg(ctx: OpContext, name: str) -> bytes | None:
    for argument in ctx.op.arg:
        if argument.name == name and argument.HasField("s"):
            return argument.s
    return None


def _save_options(ctx: OpContext) -> list[BlobOptions]:
    entries = parse_serialization_options(_raw_arg(ctx, "options"))
    if ctx.has_arg("chunk_size") and not isinstance(ctx.arg("chunk_size"), list):
        legacy = ctx.int_arg("chunk_size")
        size = {-1: 0, 0: -1}.get(legacy, legacy)  # legacy -1 = default, 0 = no chunking
        entries.append(BlobOptions("", size, FLOAT_DEFAULT))
    return entries


def _placement_of(ctx: OpContext, name: str) -> Any:
    workspace = ctx.workspace
    if workspace is None or not hasattr(workspace, "placement"):
        return None
    try:
        return workspace.placement(name)
    except BlobNotFoundError:  # no such blob: no placement (CPU)
        return None


def serialized_records(ctx: OpContext, names: list[str]) -> Iterator[tuple[str, bytes]]:
    """``(key, value)`` of every chunk of every input, in input order."""
    options = _save_options(ctx)
    for index, (name, value) in enumerate(zip(names, ctx.inputs)):
        entry = options_for(name, options)
        device = _placement_of(ctx, ctx.input_name(index))
        yield from serialize_blob_chunks(name, value, device, entry.resolved_chunk_size(),
                                         entry.float_format)


def save_to(ctx: OpContext, db_path: str) -> None:
    """Serialize the op's inputs into a new DB at ``db_path`` (root-resolved)."""
    db_type = required_str(ctx, "db_type", "Must specify a db type.")
    names = _stored_names(ctx)
    records = list(serialized_records(ctx, names))  # serialize fully before touching the DB
    services = storage(ctx)
    db = services.open_db(db_type, resolve_path(ctx, db_path), services.Mode.new)
    try:
        db.set_options(ctx.str_arg("db_options", ""))
        transaction = db.new_transaction()
        for key, value in records:
            transaction.put(key, value)
        transaction.commit()
        del transaction
    finally:
        db.close()


@register_op("Save", inputs=(1, None), outputs=0, side_effects=True, cross_device=True)
def save(ctx: OpContext) -> Outputs:
    """Write the inputs to a new DB ``db`` of type ``db_type``; args absolute_path,
    strip_prefix, blob_name_overrides, chunk_size, options, db_options."""
    save_to(ctx, required_str(ctx, "db", "Must specify a db name."))
    return ()


# --- Load --------------------------------------------------------------------------------------
def _check_load_args(ctx: OpContext, dbs: list[str]) -> list[str]:
    """Caffe2's construction checks; the names wanted, in output order."""
    if ctx.num_inputs == 0:
        required_str(ctx, "db_type", "Must specify a db type.")
        if not dbs:
            dbs.append(required_str(ctx, "db", "Must specify a db name."))
        elif any(not d for d in dbs) or len(set(dbs)) != len(dbs):
            duplicate = next((d for d in dbs if dbs.count(d) > 1 or not d), "")
            raise ArgumentError(ctx.describe(f"Duplicated db name: {duplicate}"))
    sources = [str(s) for s in ctx.arg("source_blob_names", []) or []]
    load_all = bool(ctx.int_arg("load_all", 0))
    if sources:
        if len(sources) != ctx.num_outputs:
            raise ArgumentError(ctx.describe(
                "Number of output blobs and source_blob_names mismatch."))
        if ctx.str_arg("strip_prefix", ""):
            raise ArgumentError(ctx.describe(
                "source_blob_names and strip_prefix are mutually exclusive."))
        if load_all:
            raise ArgumentError(ctx.describe("cannot load_all_ while using source_blob_names."))
    wanted = sources or list(ctx.op.output)
    if not load_all:
        for name in wanted:
            if wanted.count(name) > 1:
                raise ArgumentError(ctx.describe(f"Duplicated source blob name: {name}"))
    return wanted


class _Loader:
    """Scans sources, assembling the blobs whose mapped names are wanted."""

    def __init__(self, ctx: OpContext, wanted: list[str], load_all: bool) -> None:
        self.ctx, self.load_all = ctx, load_all
        self.index = {name: i for i, name in enumerate(wanted)}
        self.strip = ctx.str_arg("strip_prefix", "")
        self.add = ctx.str_arg("add_prefix", "")
        self.blobs: dict[str, BlobAssembler] = {}
        self.origin: dict[str, int] = {}
        self.done = 0

    def map_key(self, key: str) -> str:
        name = blob_name_of_key(key)
        if self.strip:
            at = name.find(self.strip)
            if at >= 0:
                name = name[at + len(self.strip):]
        return self.add + name

    def scan(self, cursor: Cursor, source: int, label: str) -> bool:
        """Read records from ``cursor``; True once every wanted blob is complete."""
        while cursor.valid():
            raw_key = cursor.key()
            key = raw_key.decode("utf-8", "surrogateescape")
            name = self.map_key(key)
            if self.load_all or name in self.index:
                if self.origin.setdefault(name, source) != source:
                    raise DBError(f"{label}: Duplicate Key {key} is found! (blob {name!r} "
                                  "is in more than one DB)")
                where = f"{label}, key {key!r}, blob {name!r}"
                blob = self.blobs.setdefault(name, BlobAssembler(name, where))
                if blob.add(parse_blob_proto(cursor.value(), where)) and name in self.index:
                    self.done += 1
                    if not self.load_all and self.done == len(self.index):
                        return True  # the cursor stays on the last record used
            cursor.next()
        return False

    def finish(self) -> None:
        for blob in self.blobs.values():
            blob.check_complete()


def _sources(ctx: OpContext, dbs: list[str]) -> Iterator[tuple[Cursor, str, Any]]:
    if ctx.num_inputs:
        for i in range(ctx.num_inputs):
            reader = reader_input(ctx, i)
            yield reader.cursor(), reader.db.where(), None
        return
    db_type = ctx.str_arg("db_type")
    services = storage(ctx)
    for path in dbs:
        db = services.open_db(db_type, resolve_path(ctx, path), services.Mode.read)
        try:
            cursor = db.new_cursor()
            yield cursor, db.where(), db
            cursor.close()
        finally:
            db.close()


def _target_key(ctx: OpContext, blob: BlobAssembler) -> DeviceKey:
    return blob.device if ctx.int_arg("keep_device", 0) else device_key(ctx.device)


def _placed(ctx: OpContext, blob: BlobAssembler) -> Any:
    value = blob.value
    if isinstance(value, np.ndarray) and _target_key(ctx, blob) == device_key(ctx.device):
        return on_device(ctx, value)
    return value


def _load_shape(op: Any, in_shapes: Any, in_types: Any) -> list[Any]:
    from dpgraph.ir.arguments import arguments_dict

    args = arguments_dict(op.arg)
    shape = args.get("shape") or []
    if len(op.output) == 1 and shape:
        return [(tuple(int(d) for d in shape), int(args.get("dtype", 1)))]
    return [None] * len(op.output)


@register_op("Load", inputs=(0, None), outputs=(0, None), side_effects=True, shape=_load_shape)
def load(ctx: OpContext) -> Outputs:
    """Load blobs from ``db``/``dbs`` (or DBReader inputs, from their cursor position) into
    the outputs; args load_all, keep_device, strip_prefix, add_prefix, source_blob_names,
    allow_incomplete, absolute_path, db_type."""
    dbs = [str(d) for d in ctx.arg("dbs", []) or []]
    wanted = _check_load_args(ctx, dbs)
    load_all = bool(ctx.int_arg("load_all", 0))
    loader = _Loader(ctx, wanted, load_all)
    for source, (cursor, label, _) in enumerate(_sources(ctx, dbs)):
        if loader.scan(cursor, source, label):
            break
    loader.finish()
    where = ", ".join(dbs) if dbs else ", ".join(ctx.op.input)
    if load_all:
        missing = [n for n in wanted if n not in loader.blobs]
        if missing:
            raise DBError(ctx.describe(f"Output blob name {missing[0]} does not exist in the "
                                       f"db(s) {where}."))
    elif loader.done < len(wanted) and not ctx.int_arg("allow_incomplete", 0):
        missing = [n for n in wanted if n not in loader.blobs]
        raise DBError(ctx.describe(
            f"Expected to load {len(wanted)} blobs, got {loader.done} only; not in {where}: "
            f"{missing}. Nothing was loaded."))
    return _store_extra_and_outputs(ctx, loader, wanted)


def _store_extra_and_outputs(ctx: OpContext, loader: _Loader, wanted: list[str]) -> Outputs:
    outputs, keys = [], []
    for i, name in enumerate(wanted):
        blob = loader.blobs.get(name)
        if blob is None:  # allow_incomplete: keep what the blob held, or remove it
            previous_value = ctx.prev_output(i)
            outputs.append(REMOVE_BLOB if previous_value is None else previous_value)
            previous = _placement_of(ctx, ctx.output_name(i))
            keys.append(previous if previous is not None else device_key(ctx.device))
        else:
            outputs.append(_placed(ctx, blob))
            keys.append(_target_key(ctx, blob))
    if loader.load_all:
        if ctx.workspace is None:
            raise ShapeError(ctx.describe("load_all needs a workspace."))
        declared = set(ctx.op.output)
        for name, blob in loader.blobs.items():
            if name not in declared:
                ctx.workspace.set_blob(name, _placed(ctx, blob), _target_key(ctx, blob))
    _PLACEMENT.keys = keys
    return tuple(outputs)


def _load_placement(op_key: DeviceKey, input_keys: Any, args: Any) -> list[DeviceKey]:
    keys = getattr(_PLACEMENT, "keys", None) or []
    _PLACEMENT.keys = None
    return keys


OPERATORS.lookup("Load").extra[OUTPUT_PLACEMENT] = _load_placement


# --- Checkpoint --------------------------------------------------------------------------------
def _checkpoint(ctx: OpContext) -> Outputs:
    pattern = required_str(ctx, "db", "Must specify a checkpoint file pattern.")
    every = ctx.int_arg("every", 1)
    if every <= 0:
        raise ArgumentError(ctx.describe(f"Checkpoint interval 'every' must be > 0, got "
                                         f"{every}."))
    counter = ctx.inputs[0]
    if not isinstance(counter, np.ndarray) or counter.dtype != np.int64 or counter.size != 1:
        raise ShapeError(ctx.describe(
            f"input 0 {ctx.input_name(0)!r} must be the int64 CPU iteration counter (as Iter "
            f"makes it), got {getattr(counter, 'dtype', type(counter).__name__)}."))
    iteration = int(counter.reshape(-1)[0])
    if iteration % every == 0:
        try:
            path = pattern % iteration
        except (TypeError, ValueError):
            raise ArgumentError(ctx.describe(
                f"db pattern {pattern!r} needs one integer field such as %08d.")) from None
        save_to(ctx, path)
    return ()


for _name in ("Checkpoint", "Snapshot"):
    register_op(_name, inputs=(1, None), outputs=0, side_effects=True,
                cross_device=True)(_checkpoint)


# --- EstimateAllBlobSizes ----------------------------------------------------------------------
def _estimate_all(ctx: OpContext) -> Outputs:
    """Names and estimated serialized sizes (bytes) of every blob in the workspace, the two
    outputs included (sized as the string and int64 tensors they become)."""
    if ctx.workspace is None:
        raise ShapeError(ctx.describe("EstimateAllBlobSizes needs a workspace."))
    outputs = list(ctx.op.output)
    names = sorted(set(ctx.workspace.blobs()) | set(outputs))
    options = parse_serialization_options(_raw_arg(ctx, "options"))
    sizes = []
    for name in names:
        entry = options_for(name, options)
        if name in outputs:
            dtype = object if name == outputs[0] else np.int64
            sizes.append(estimate_tensor_size(name, len(names), dtype, entry))
        else:
            sizes.append(estimate_blob_size(name, ctx.workspace.get_blob_or_none(name), entry))
    return (np.array([n.encode("utf-8") for n in names], dtype=object),
            np.array(sizes, dtype=np.int64))


register_op("EstimateAllBlobSizes", inputs=0, outputs=2)(_estimate_all)


# --- GetAllBlobNames ---------------------------------------------------------------------------
def _local_names(workspace: Any) -> list[str]:
    """The blobs created in ``workspace`` itself (a child workspace's parent blobs left out)."""
    blobs = getattr(workspace, "_blobs", None)
    local = getattr(blobs, "local", None)
    if isinstance(local, dict) and getattr(blobs, "forward", False) is None:
        return sorted(local)
    return list(workspace.blobs())


def _all_blob_names(ctx: OpContext) -> Outputs:
    """Every blob name of the workspace as a 1-D string tensor (its own output included);
    ``include_shared`` (default 1) also lists a child workspace's parent blobs."""
    if ctx.workspace is None:
        raise ShapeError(ctx.describe("GetAllBlobNames needs a workspace."))
    include_shared = bool(ctx.int_arg("include_shared", 1))
    names = set(ctx.workspace.blobs() if include_shared else _local_names(ctx.workspace))
    names.add(ctx.op.output[0])
    return (np.array([n.encode("utf-8") for n in sorted(names)], dtype=object),)


register_op("GetAllBlobNames", inputs=0, outputs=1)(_all_blob_names)


for _op_type in ("Save", "Load", "Checkpoint", "Snapshot", "EstimateAllBlobSizes",
                 "GetAllBlobNames"):
    register_gradient(_op_type)(no_gradient)
