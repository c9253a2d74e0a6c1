"""Reading and writing protobuf files with typed errors."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from google.protobuf.message import DecodeError, Message

from dpgraph.errors import ArgumentError, ProtoError, ResourceLimitError, ShapeError
from dpgraph.proto import caffe2_pb2

M = TypeVar("M", bound=Message)


class ProtoLimitError(ResourceLimitError, ProtoError):
    """A message nests deeper or declares more than the configured limits: a
    ResourceLimitError that is also the ProtoError that callers of the loaders catch."""


def parse_proto(message_type: type[M], data: bytes, source: str = "<bytes>") -> M:
    """Parse ``data`` as ``message_type``; malformed input raises :class:`ProtoError`."""
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        if "MaxDepth" in str(error) or "recursion" in str(error).lower():
            raise ProtoLimitError(
                f"{source}: the serialized {message_type.__name__} nests messages deeper than "
                "protobuf's limit of 100 levels; the file is hostile or corrupt, or its nets "
                "nest too deeply (flatten them).") from None
        raise ProtoError(
            f"{source}: not a valid serialized {message_type.__name__} ({error}); "
            "check that the file is a binary Caffe2 protobuf and is not truncated."
        ) from error
    bad = _non_text_field(message)
    if bad is not None:
        raise ProtoError(f"{source}: field {bad} of the {message_type.__name__} is not valid "
                         "UTF-8 text; the file is corrupt (names and types must be UTF-8).")
    if isinstance(message, caffe2_pb2.NetDef):
        check_nesting(message, source)
    elif isinstance(message, caffe2_pb2.PlanDef):
        for net in message.network:
            check_nesting(net, f"{source}, net {net.name!r}")
    return message


def _non_text_field(message: Message, path: str = "") -> str | None:
    """The first ``string`` field holding bytes (protobuf's form of invalid UTF-8), or None."""
    for field, value in message.ListFields():
        if field.type not in (field.TYPE_STRING, field.TYPE_MESSAGE):
            continue
        where = f"{path}{field.name}"
        items = list(value) if field.is_repeated else [value]
        if field.type == field.TYPE_STRING:
            if any(isinstance(v, bytes) for v in items):
                return where
            continue
        for index, item in enumerate(items):
            found = _non_text_field(item, f"{where}[{index}]." if field.is_repeated
                                    else f"{where}.")
            if found:
                return found
    return None


def read_proto(message_type: type[M], path: str | os.PathLike[str]) -> M:
    """Read a binary protobuf file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ProtoError(f"cannot read {os.fspath(path)!r}: {error.strerror}; check the path "
                         "and that the file is readable.") from error
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
        raise error(f"expected a Net or NetDef, got {type(net).__name__}; pass a core.Net or "
                    "its Proto().")
    return proto


# --- resource limits -------------------------------------------------------------------------
#: Environment variables overriding the default limits (read when no setter value is in force).
ENV_MAX_TENSOR_BYTES = "DPGRAPH_MAX_TENSOR_BYTES"
ENV_MAX_NESTING_DEPTH = "DPGRAPH_MAX_NESTING_DEPTH"
#: Defaults: one tensor may declare at most 64 GiB; nets may nest 32 levels deep (about
#: what protobuf's own limit of 100 nested messages allows).
DEFAULT_MAX_TENSOR_BYTES = 1 << 36
DEFAULT_MAX_NESTING_DEPTH = 32
_overrides: dict[str, int | None] = {"bytes": None, "depth": None}


def _env_limit(variable: str, default: int) -> int:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(float(text)) if any(c in text for c in ".eE") else int(text, 0)
    except ValueError:
        raise ResourceLimitError(f"environment variable {variable}={text!r} is not a number; "
                                 "set it to a positive integer or unset it.") from None
    if value <= 0:
        raise ResourceLimitError(f"environment variable {variable}={text!r} must be a "
                                 "positive integer; set it to a larger value or unset it.")
    return value


def _checked_limit(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentError(f"{what} must be a positive int or None (the default), got "
                            f"{value!r}.")
    return value


def max_tensor_bytes() -> int:
    """The largest tensor (in bytes) a file, message or op may declare: the value of
    :func:`set_max_tensor_bytes`, else ``$DPGRAPH_MAX_TENSOR_BYTES``, else 64 GiB."""
    override = _overrides["bytes"]
    return override if override is not None else _env_limit(ENV_MAX_TENSOR_BYTES,
                                                             DEFAULT_MAX_TENSOR_BYTES)


def set_max_tensor_bytes(limit: int | None) -> int | None:
    """Set the tensor-size limit (``None``: back to the environment/default); returns the
    previous setting."""
    previous = _overrides["bytes"]
    _overrides["bytes"] = _checked_limit(limit, "set_max_tensor_bytes(limit)")
    return previous


def max_nesting_depth() -> int:
    """How deep nets may nest inside nets (step nets, If/While bodies, ``net`` arguments):
    :func:`set_max_nesting_depth`, else ``$DPGRAPH_MAX_NESTING_DEPTH``, else 32."""
    override = _overrides["depth"]
    return override if override is not None else _env_limit(ENV_MAX_NESTING_DEPTH,
                                                            DEFAULT_MAX_NESTING_DEPTH)


def set_max_nesting_depth(limit: int | None) -> int | None:
    """Set the nesting limit (``None``: back to the environment/default); returns the
    previous setting."""
    previous = _overrides["depth"]
    _overrides["depth"] = _checked_limit(limit, "set_max_nesting_depth(limit)")
    return previous


def check_tensor_size(dims: Any, itemsize: int, where: str) -> int:
    """The element count of a tensor of ``dims``; a negative or non-integer dimension raises
    :class:`ShapeError`, a size above :func:`max_tensor_bytes` :class:`ResourceLimitError` —
    both before anything is allocated.  ``where`` names the op, blob or file."""
    dims = list(dims)
    bad = [d for d in dims if isinstance(d, bool) or not isinstance(d, (int, np.integer))
           or d < 0]
    if bad:
        raise ShapeError(f"{where}: dims {dims} must be non-negative integers (bad: {bad}); "
                         "fix the shape.")
    numel = math.prod(int(d) for d in dims)
    limit = max_tensor_bytes()
    if numel * max(int(itemsize), 1) > limit:
        raise ResourceLimitError(
            f"{where}: a tensor of dims {dims} ({numel} elements of {itemsize} bytes) exceeds "
            f"the limit of {limit} bytes; check the shape, or raise the limit with "
            f"{ENV_MAX_TENSOR_BYTES} or dpgraph.ir.proto_io.set_max_tensor_bytes().")
    return numel


def nested_nets(net: Any) -> Iterator[Any]:
    """The NetDefs directly inside ``net``'s ops (``n``/``nets`` arguments)."""
    for op in net.op:
        for arg in op.arg:
            if arg.HasField("n"):
                yield arg.n
            yield from arg.nets


def check_nesting(net: Any, where: str = "") -> None:
    """Refuse a NetDef whose nets nest deeper than :func:`max_nesting_depth`, without
    recursion (so a hostile file cannot exhaust the Python stack)."""
    limit = max_nesting_depth()
    stack = [(net, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > limit:
            raise ProtoLimitError(
                f"{where or 'net ' + repr(net.name)}: nets nest more than {limit} levels deep "
                f"(at net {current.name!r}); flatten the nesting, or raise the limit with "
                f"{ENV_MAX_NESTING_DEPTH} or dpgraph.ir.proto_io.set_max_nesting_depth().")
        stack.extend((inner, depth + 1) for inner in nested_nets(current))
