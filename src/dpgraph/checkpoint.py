"""Checkpoints: save and load workspace blobs, and resume a data-parallel model.

File format (version 1): one serialized ``caffe2.TensorProtos`` message.  ``protos[i]`` for
``i < n`` holds blob ``i``: ``name`` is the blob name, ``dims`` and ``data_type`` are exact,
numbers are in ``raw_data`` (little endian; float16 and bool as their own widths), string
tensors in ``string_data``; a string blob (not a tensor) has ``data_type = STRING``, no
dims and one ``string_data`` entry.  The last proto is the manifest: name
``"__dpgraph_checkpoint__"``, ``data_type = INT64``, ``int64_data = [1, n, crc32]`` where
``crc32`` covers the serialized blob protos in order.  A file without a valid manifest
(truncated, corrupt, not a checkpoint) raises :class:`~dpgraph.errors.CheckpointError`.
Files are written to a temporary file and renamed, so a crash never leaves a half-written
checkpoint under the target name.

Resuming a ``Parallelize``'d model::

    save_model_checkpoint(model, "ckpt.pb")        # the blobs GetCheckpointParams names
    ...                                            # fresh process: build, RunInitNet
    load_model_checkpoint(model, "ckpt.pb")        # load + FinalizeAfterCheckpoint
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from dpgraph.errors import (
    CheckpointError,
    CheckpointWriteError,
    CorruptDataError,
    ProtoError,
    SerializationError,
)
from dpgraph.ir.blob_serde import numpy_to_tensor_proto, tensor_proto_to_numpy
from dpgraph.ir.proto_io import parse_proto, write_proto
from dpgraph.jobs.checkpoint_manager import (  # noqa: F401  (Caffe2's checkpoint module API)
    CheckpointManager,
    JobRunner,
    MultiNodeCheckpointManager,
    UploadTaskGroupBuilder,
    db_name,
    epoch_limiter,
    get_ckpt_filename,
)
from dpgraph.jobs.job import Job  # noqa: F401  (Caffe2's checkpoint.Job)
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api, devices

FORMAT_VERSION = 1
MANIFEST_NAME = "__dpgraph_checkpoint__"
DT = caffe2_pb2.TensorProto


def _tensor(name: str, value: Any) -> caffe2_pb2.TensorProto:
    """A blob as a checkpoint TensorProto (numbers in ``raw_data``; a string blob as a
    dims-less STRING tensor with one entry), through the package's one serializer."""
    if isinstance(value, (bytes, str)):
        proto = DT(name=name, data_type=DT.STRING)
        proto.string_data.append(value.encode("utf-8") if isinstance(value, str) else value)
        return proto
    if not devices.is_array(value):
        raise CheckpointError(f"Blob {name!r} holds a {type(value).__name__}, not a tensor or "
                              "a string; only tensors and strings can be checkpointed.")
    try:
        return numpy_to_tensor_proto(devices.to_host(value), name, raw=True)
    except SerializationError as error:
        raise CheckpointError(f"Blob {name!r}: {error}") from None


def _value(proto: caffe2_pb2.TensorProto, path: str) -> Any:
    if proto.data_type == DT.STRING and not proto.dims and len(proto.string_data) == 1:
        return bytes(proto.string_data[0])
    try:
        return tensor_proto_to_numpy(proto, f"{path}: blob {proto.name!r}")
    except (SerializationError, CorruptDataError) as error:
        raise CheckpointError(f"{error}; the file is corrupt.") from None


def _crc(protos: Iterable[caffe2_pb2.TensorProto]) -> int:
    crc = 0
    for proto in protos:
        crc = zlib.crc32(proto.SerializeToString(deterministic=True), crc)
    return crc


def save_checkpoint(path: str | os.PathLike[str], blob_names: Iterable[Any],
                    workspace: Any = None) -> None:
    """Write ``blob_names`` (sorted) from the workspace to ``path`` atomically."""
    ws = api.resolve(workspace)
    names = sorted({str(b) for b in blob_names})
    missing = [n for n in names if not ws.has_blob(n) or ws.get_blob(n) is None]
    if missing:
        raise CheckpointError(f"Cannot checkpoint blobs that are missing or empty in workspace "
                              f"{ws.name!r}: {missing}; run the init net first.")
    message = caffe2_pb2.TensorProtos()
    message.protos.extend(_tensor(n, ws.get_blob(n)) for n in names)
    manifest = message.protos.add(name=MANIFEST_NAME, data_type=DT.INT64)
    manifest.dims.append(3)
    manifest.int64_data.extend([FORMAT_VERSION, len(names), _crc(message.protos[:-1])])
    try:
        write_proto(message, path)
    except OSError as error:
        raise CheckpointWriteError(
            f"Cannot write checkpoint {os.fspath(path)!r}: {error.strerror or error}; give a "
            f"file path in a writable directory.") from error


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{blob: value}`` from a checkpoint file (validated against its manifest)."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise CheckpointError(f"Cannot read checkpoint {where!r}: {error.strerror}.") from error
    try:
        message = parse_proto(caffe2_pb2.TensorProtos, data, where)
    except ProtoError as error:
        raise CheckpointError(f"{where}: not a readable checkpoint ({error}).") from error
    protos = list(message.protos)
    if not protos or protos[-1].name != MANIFEST_NAME or len(protos[-1].int64_data) != 3:
        raise CheckpointError(f"{where}: no checkpoint manifest at the end of the file; it is "
                              "truncated or not a dpgraph checkpoint.")
    version, count, crc = protos[-1].int64_data
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{where}: checkpoint format version {version}, this dpgraph "
                              f"reads version {FORMAT_VERSION}.")
    blobs = protos[:-1]
    if count != len(blobs) or _crc(blobs) != crc:
        raise CheckpointError(f"{where}: the checkpoint holds {len(blobs)} blobs (manifest: "
                              f"{count}) or fails its checksum; the file is corrupt.")
    return {p.name: _value(p, where) for p in blobs}


def _check_like(name: str, value: Any, current: Any, where: str) -> None:
    if not devices.is_array(current) or isinstance(value, bytes):
        return
    shape, dtype = tuple(current.shape), np.dtype(current.dtype)
    if tuple(value.shape) != shape or value.dtype != dtype:
        raise CheckpointError(f"{where}: blob {name!r} is {value.dtype}{list(value.shape)} in "
                              f"the checkpoint but {dtype}{list(shape)} in the workspace; the "
                              "checkpoint was saved from a different model.")


def load_checkpoint(path: str | os.PathLike[str], expected: Iterable[Any] | None = None,
                    workspace: Any = None) -> list[str]:
    """Load a checkpoint into the workspace; returns the loaded blob names.

    With ``expected``, exactly those blobs are loaded and each must be in the file.  A blob
    that already holds a tensor keeps its device and must keep its shape and dtype (else
    :class:`CheckpointError`, and nothing is loaded).
    """
    ws = api.resolve(workspace)
    where = os.fspath(path)
    values = read_checkpoint(path)
    names = sorted(values) if expected is None else sorted({str(b) for b in expected})
    missing = [n for n in names if n not in values]
    if missing:
        raise CheckpointError(f"{where}: missing blobs {missing}; the checkpoint was saved "
                              "from a different model.")
    for name in names:
        if ws.has_blob(name):
            _check_like(name, values[name], ws.get_blob(name), where)
    for name in names:
        value = values[name]
        if isinstance(value, bytes):
            ws.set_blob(name, value, None)
            continue
        key = ws.placement(name) if ws.has_blob(name) else None
        key = devices.CPU_KEY if key is None else key
        ws.set_blob(name, devices.to_device(value, key), key)
    return names


def checkpoint_blob_names(model: Any) -> list[str]:
    """The blobs ``data_parallel_model.GetCheckpointParams`` names, sorted."""
    from dpgraph.parallel.lifecycle import GetCheckpointParams

    return sorted(str(b) for b in GetCheckpointParams(model))


def save_model_checkpoint(model: Any, path: str | os.PathLike[str],
                          workspace: Any = None) -> list[str]:
    """Save a Parallelize'd model's checkpoint params (master device + iteration
    counters); returns the saved names."""
    names = checkpoint_blob_names(model)
    save_checkpoint(path, names, workspace)
    return names


def load_model_checkpoint(model: Any, path: str | os.PathLike[str]) -> list[str]:
    """Load the master device's blobs, then ``FinalizeAfterCheckpoint`` copies them to
    every device.  Run the model's init nets first (``RunInitNet``)."""
    from dpgraph.parallel.lifecycle import FinalizeAfterCheckpoint

    names = load_checkpoint(path, expected=checkpoint_blob_names(model))
    FinalizeAfterCheckpoint(model)
    return names
