"""One checkpoint file: workspace blobs in a ``TensorProtos`` with a CRC manifest, written
atomically.

File format (version 1): one serialized ``caffe2.TensorProtos`` message.  ``protos[i]`` for
``i < n`` holds blob ``i``: ``name`` is the blob name, ``dims`` and ``data_type`` are exact,
numbers are in ``raw_data`` (little endian; float16 and bool as their own widths), string
tensors in ``string_data``; a string blob (not a tensor) has ``data_type = STRING``, no
dims and one ``string_data`` entry.  The last proto is the manifest: name
``"__dpgraph_checkpoint__"``, ``data_type = INT64``, ``int64_data = [1, n, crc32]`` where
``crc32`` covers the serialized blob protos in order.  A file without a valid manifest
(truncated, corrupt, not a checkpoint) raises :class:`~dpgraph.errors.CheckpointError`.

:func:`write_atomic` writes a temporary file in the target's directory, fsyncs it, renames
it over the target and fsyncs the directory: a crash leaves either the old file or the new
one under the target name, never a half-written one.
"""

from __future__ import annotations

import errno
import os
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
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
from dpgraph.ir.proto_io import parse_proto
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api, devices

FORMAT_VERSION = 1
MANIFEST_NAME = "__dpgraph_checkpoint__"
DT = caffe2_pb2.TensorProto

#: errno -> what the user should do when a checkpoint write fails with it.
_WRITE_ADVICE = {
    errno.ENOSPC: "the file system is full; free space or checkpoint to a larger disk",
    errno.EDQUOT: "the disk quota is exhausted; free space or checkpoint elsewhere",
    errno.EACCES: "the directory is not writable; fix its permissions or choose a writable "
                  "directory",
    errno.EPERM: "the directory is not writable; fix its permissions or choose a writable "
                 "directory",
    errno.EROFS: "the file system is read-only; choose a writable directory",
    errno.EISDIR: "the target is a directory; give a file path in a writable directory",
}


# --- atomic writes ---------------------------------------------------------------------------
def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames and unlinks in directory ``path`` durable (best effort where a platform
    cannot open directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_error(path: str | os.PathLike[str], error: OSError,
                what: str = "checkpoint") -> CheckpointWriteError:
    """The typed error for a failed write of ``path``: names the path and what to do (the
    OSError, with its ``errno``, is chained as the cause by the caller)."""
    advice = _WRITE_ADVICE.get(error.errno or 0, "give a file path in a writable directory "
                               "on a file system with free space")
    return CheckpointWriteError(f"Cannot write {what} {os.fspath(path)!r}: "
                                f"{error.strerror or error}; {advice}.")


def write_atomic(path: str | os.PathLike[str], data: bytes, what: str = "checkpoint") -> None:
    """Write ``data`` to ``path`` durably and atomically (temporary file, fsync, rename,
    directory fsync), creating missing parent directories.

    Raises:
        CheckpointWriteError: the directory is not writable, the disk is full, ``path`` is a
            directory, ...; the temporary file is removed and the old ``path`` is untouched.
    """
    target = Path(path)
    temporary = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".tmp")
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
        temporary = None
        fsync_dir(target.parent)
    except OSError as error:
        raise write_error(path, error, what) from error
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


# --- the file format -------------------------------------------------------------------------
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


def encode_checkpoint(blob_names: Iterable[Any], workspace: Any = None) -> bytes:
    """The checkpoint file's bytes for ``blob_names`` (sorted) of the workspace."""
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
    return message.SerializeToString(deterministic=True)


def save_checkpoint(path: str | os.PathLike[str], blob_names: Iterable[Any],
                    workspace: Any = None) -> None:
    """Write ``blob_names`` (sorted) from the workspace to ``path`` atomically."""
    write_atomic(path, encode_checkpoint(blob_names, workspace))


def decode_checkpoint(data: bytes, where: str) -> dict[str, Any]:
    """``{blob: value}`` from a checkpoint file's bytes, validated against its manifest;
    ``where`` (the file) is named in every error."""
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


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{blob: value}`` from a checkpoint file (validated against its manifest)."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise CheckpointError(f"Cannot read checkpoint {where!r}: {error.strerror}.") from error
    return decode_checkpoint(data, where)


def _check_like(name: str, value: Any, current: Any, where: str) -> None:
    if not devices.is_array(current) or isinstance(value, bytes):
        return
    shape, dtype = tuple(current.shape), np.dtype(current.dtype)
    if tuple(value.shape) != shape or value.dtype != dtype:
        raise CheckpointError(f"{where}: blob {name!r} is {value.dtype}{list(value.shape)} in "
                              f"the checkpoint but {dtype}{list(shape)} in the workspace; the "
                              "checkpoint was saved from a different model.")


def apply_checkpoint(values: dict[str, Any], where: str, expected: Iterable[Any] | None = None,
                     workspace: Any = None) -> list[str]:
    """Put checkpoint ``values`` into the workspace (see :func:`load_checkpoint`); ``where``
    names the file in errors."""
    ws = api.resolve(workspace)
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


def load_checkpoint(path: str | os.PathLike[str], expected: Iterable[Any] | None = None,
                    workspace: Any = None) -> list[str]:
    """Load a checkpoint into the workspace; returns the loaded blob names.

    With ``expected``, exactly those blobs are loaded and each must be in the file.  A blob
    that already holds a tensor keeps its device and must keep its shape and dtype (else
    :class:`CheckpointError`, and nothing is loaded).
    """
    ws = api.resolve(workspace)
    return apply_checkpoint(read_checkpoint(path), os.fspath(path), expected, ws)
