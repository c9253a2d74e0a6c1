"""Reading and writing protobuf files with typed errors."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from dpgraph.errors import ProtoError
from dpgraph.proto import caffe2_pb2

M = TypeVar("M", bound=Message)


def parse_proto(message_type: type[M], data: bytes, source: str = "<bytes>") -> M:
    """Parse ``data`` as ``message_type``; malformed input raises :class:`ProtoError`."""
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ProtoError(
            f"{source}: not a valid serialized {message_type.__name__} ({error}); "
            "check that the file is a binary Caffe2 protobuf and is not truncated."
        ) from error
    return message


def read_proto(message_type: type[M], path: str | os.PathLike[str]) -> M:
    """Read a binary protobuf file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ProtoError(f"cannot read {os.fspath(path)!r}: {error.strerror}") from error
    return parse_proto(message_type, data, os.fspath(path))


def write_proto(message: Any, path: str | os.PathLike[str]) -> None:
    """Write ``message`` atomically (temporary file + rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(message.SerializeToString())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def proto_of(obj: Any) -> Any:
    """The protobuf behind a builder (``Net``, ``Plan``, ``ExecutionStep``) or ``obj`` itself."""
    return obj.Proto() if hasattr(obj, "Proto") else obj


def netdef_of(net: Any, error: type[Exception] = ProtoError) -> Any:
    """The ``caffe2.NetDef`` behind a ``Net`` or a NetDef; anything else raises ``error``."""
    proto = proto_of(net)
    if not isinstance(proto, caffe2_pb2.NetDef):
        raise error(f"expected a Net or NetDef, got {type(net).__name__}")
    return proto
