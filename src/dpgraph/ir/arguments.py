"""Operator arguments: Caffe2's ``utils.MakeArgument`` encoding and typed readers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from google.protobuf.message import Message

from dpgraph.errors import ArgumentError
from dpgraph.proto import caffe2_pb2

_FLOATS = frozenset({float})
_INTS = frozenset({int})  # bools go through int() below


def _encode_iterable(argument: caffe2_pb2.Argument, key: str, values: Any) -> None:
    """A list of floats, ints/bools, strings, NetDefs or messages (numpy scalars count as
    the Python number they hold)."""
    kinds = set(map(type, values))
    if kinds <= _FLOATS:  # the common cases first, decided by exact type
        argument.floats.extend(values)
    elif kinds <= _INTS:
        argument.ints.extend(values)
    elif all(isinstance(v, (float, np.floating)) for v in values):
        argument.floats.extend(float(v) for v in values)
    elif all(isinstance(v, (bool, int, np.integer, np.bool_)) for v in values):
        argument.ints.extend(int(v) for v in values)
    elif all(isinstance(v, (str, bytes)) for v in values):
        argument.strings.extend(v.encode("utf-8") if isinstance(v, str) else v for v in values)
    elif all(isinstance(v, caffe2_pb2.NetDef) for v in values):
        argument.nets.extend(values)
    elif all(isinstance(v, Message) for v in values):
        argument.strings.extend(v.SerializeToString() for v in values)
    else:
        kinds_text = sorted({type(v.item() if isinstance(v, np.generic) else v).__name__
                             for v in values})
        raise ArgumentError(
            f"Argument {key!r}: cannot encode a list mixing {', '.join(kinds_text)}; use a "
            "list of only floats, only ints/bools, only strings, or only NetDefs."
        )


def MakeArgument(key: str, value: Any) -> caffe2_pb2.Argument:
    """Encode ``value`` into an Argument named ``key`` exactly as Caffe2 does.

    float -> ``f``; int/bool -> ``i``; str/bytes -> ``s``; NetDef -> ``n``; other protobuf
    messages -> serialised into ``s``; iterables -> ``floats``/``ints``/``strings``/``nets``.
    A float32 array goes to ``floats``; other arrays are flattened first.
    """
    argument = caffe2_pb2.Argument(name=key)
    encode_argument(argument, key, value)
    return argument


def encode_argument(argument: caffe2_pb2.Argument, key: str, value: Any) -> None:
    """:func:`MakeArgument`'s encoding of ``value`` into an existing ``argument`` (so an
    op's arguments can be built in place, with ``op.arg.add(name=key)``)."""
    kind = type(value)
    if kind is float:  # the common scalar kinds first, decided by exact type
        argument.f = value
    elif kind is int or kind is bool:
        argument.i = int(value)
    elif kind is str:
        argument.s = value.encode("utf-8")
    elif kind is list or kind is tuple:  # numpy scalars inside are handled there
        _encode_iterable(argument, key, value)
    else:
        _encode_other(argument, key, value)


def _encode_other(argument: caffe2_pb2.Argument, key: str, value: Any) -> None:
    if isinstance(value, np.ndarray):
        value = value.flatten().tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        argument.f = value
    elif isinstance(value, (bool, int)):
        argument.i = int(value)
    elif isinstance(value, bytes):
        argument.s = value
    elif isinstance(value, str):
        argument.s = value.encode("utf-8")
    elif isinstance(value, caffe2_pb2.NetDef):
        argument.n.CopyFrom(value)
    elif isinstance(value, Message):
        argument.s = value.SerializeToString()
    elif isinstance(value, Iterable) and not isinstance(value, Mapping):
        _encode_iterable(argument, key, list(value))
    else:
        raise ArgumentError(
            f"Argument {key!r}: unsupported value {value!r} of type {type(value).__name__}; "
            "use a number, string, bytes, NetDef, protobuf message or a list of those."
        )


def argument_value(argument: caffe2_pb2.Argument) -> Any:
    """Decode an Argument back to a Python value (the field that is set wins)."""
    for field in ("f", "i", "s", "n", "t"):
        if argument.HasField(field):
            value = getattr(argument, field)
            return value.decode("utf-8", "surrogateescape") if field == "s" else value
    for field in ("floats", "ints", "nets", "tensors", "qtensors"):
        values = getattr(argument, field)
        if values:
            return list(values)
    if argument.strings:
        return [s.decode("utf-8", "surrogateescape") for s in argument.strings]
    return []


def arguments_dict(arguments: Iterable[caffe2_pb2.Argument]) -> dict[str, Any]:
    """``{name: decoded value}``; a later duplicate name wins, as in Caffe2's ArgumentHelper."""
    return {a.name: argument_value(a) for a in arguments}


def raw_argument_value(argument: caffe2_pb2.Argument) -> Any:
    """Like :func:`argument_value` but leaves ``s`` as bytes."""
    if argument.HasField("s"):
        return argument.s
    return argument_value(argument)
