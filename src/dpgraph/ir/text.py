"""A compact, line-based text format for nets: one line per op, lossless round trip.

Example::

    net "mlp" {"type": "dag", "num_workers": 4}
    input data fc_w fc_b
    output loss
    op FC data fc_w fc_b -> fc {"args": [["axis", 1]], "device": "gpu:0"}
    op Relu fc -> fc
    op AveragedLoss fc -> loss {"device": "gpu:0"}

``format_net`` prints it, ``parse_net`` reads it back into an equal NetDef (field presence
included).  Blob names that contain spaces or quotes, start with ``{`` or equal ``->`` are
written as JSON strings.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

from dpgraph.errors import ResourceLimitError, TextFormatError
from dpgraph.ir.proto_io import check_nesting, proto_of
from dpgraph.proto import caffe2_pb2


class TextLimitError(ResourceLimitError, TextFormatError):
    """The text nests deeper than the parser allows: a ResourceLimitError that is also the
    TextFormatError callers of :func:`parse_net` catch."""


_DEVICE_NAMES = {0: "cpu", 1: "gpu", 5: "ideep", 6: "hip"}
_DEVICE_TYPES = {name: number for number, name in _DEVICE_NAMES.items()}
_DEVICE_FIELDS = (("device_type", "type"), ("device_id", "id"), ("random_seed", "seed"),
                  ("node_name", "node"), ("numa_node_id", "numa"))


# --- values ------------------------------------------------------------------------------
def _encode_bytes(value: bytes) -> Any:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"$bytes": base64.b64encode(value).decode("ascii")}


def _decode_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        return base64.b64decode(value["$bytes"])
    return str(value).encode("utf-8")


def _encode_message(kind: str, message: Any) -> dict[str, str]:
    return {kind: base64.b64encode(message.SerializeToString()).decode("ascii")}


def _encode_argument(argument: caffe2_pb2.Argument) -> Any:
    for field, kind in (("n", "$net"), ("t", "$tensor")):
        if argument.HasField(field):
            return _encode_message(kind, getattr(argument, field))
    if argument.HasField("f"):
        return float(argument.f)
    if argument.HasField("i"):
        return int(argument.i)
    if argument.HasField("s"):
        return _encode_bytes(argument.s)
    for field, kind in (("floats", ""), ("ints", ""), ("strings", ""),
                        ("nets", "$net"), ("tensors", "$tensor"), ("qtensors", "$qtensor")):
        values = list(getattr(argument, field))
        if not values:
            continue
        if field == "floats":
            return [float(v) for v in values]
        if field == "ints":
            return [int(v) for v in values]
        if field == "strings":
            return [_encode_bytes(v) for v in values]
        return [_encode_message(kind, v) for v in values]
    return []


def _decode_message(message_type: Any, text: str) -> Any:
    message = message_type()
    message.ParseFromString(base64.b64decode(text))
    return message


def _decode_argument(name: str, value: Any) -> caffe2_pb2.Argument:
    argument = caffe2_pb2.Argument(name=name)
    if isinstance(value, (bool, int)):
        argument.i = int(value)
    elif isinstance(value, float):
        argument.f = value
    elif isinstance(value, str):
        argument.s = value.encode("utf-8")
    elif isinstance(value, _Pairs):
        _decode_special(argument, value)
    elif isinstance(value, list) and value and all(isinstance(v, (str, _Pairs)) for v in value):
        if all(isinstance(v, _Pairs) and "$bytes" not in v for v in value):
            for item in value:
                _decode_special(argument, item, repeated=True)
        else:
            argument.strings.extend(_decode_bytes(v) for v in value)
    elif isinstance(value, list) and any(isinstance(v, float) for v in value):
        argument.floats.extend(float(v) for v in value)
    elif isinstance(value, list) and value:
        argument.ints.extend(int(v) for v in value)
    elif not isinstance(value, list):
        raise TextFormatError(f"argument {name!r}: cannot decode {value!r}")
    return argument


def _decode_special(argument: caffe2_pb2.Argument, value: Any,
                    repeated: bool = False) -> None:
    if "$bytes" in value:
        argument.s = _decode_bytes(value)
    elif "$net" in value:
        net = _decode_message(caffe2_pb2.NetDef, value["$net"])
        (argument.nets.append(net) if repeated else argument.n.CopyFrom(net))
    elif "$tensor" in value:
        tensor = _decode_message(caffe2_pb2.TensorProto, value["$tensor"])
        (argument.tensors.append(tensor) if repeated else argument.t.CopyFrom(tensor))
    elif "$qtensor" in value:
        argument.qtensors.append(_decode_message(caffe2_pb2.QTensorProto, value["$qtensor"]))
    else:
        raise TextFormatError(f"argument {argument.name!r}: unknown value {value!r}")


# --- device options ----------------------------------------------------------------------
def _encode_device(option: caffe2_pb2.DeviceOption) -> Any:
    fields = {short: getattr(option, name) for name, short in _DEVICE_FIELDS
              if option.HasField(name)}
    if option.extra_info:
        fields["extra"] = list(option.extra_info)
    if set(fields) == {"type", "id"} and fields["type"] in _DEVICE_NAMES:
        return f"{_DEVICE_NAMES[fields['type']]}:{fields['id']}"
    return fields


def _decode_device(value: Any, option: caffe2_pb2.DeviceOption) -> None:
    option.SetInParent()
    if isinstance(value, str):
        kind, _, index = value.partition(":")
        if kind not in _DEVICE_TYPES or not index.lstrip("-").isdigit():
            raise TextFormatError(f"bad device {value!r}; expected e.g. 'gpu:0'")
        option.device_type, option.device_id = _DEVICE_TYPES[kind], int(index)
        return
    shorts = {short: name for name, short in _DEVICE_FIELDS}
    for key, item in value.items():
        if key == "extra":
            option.extra_info.extend(item)
        elif key in shorts:
            setattr(option, shorts[key], item)
        else:
            raise TextFormatError(f"unknown device field {key!r}")


# --- blob names --------------------------------------------------------------------------
def _name(blob: str) -> str:
    plain = blob and not any(c.isspace() or c == '"' for c in blob)
    return blob if plain and blob != "->" and not blob.startswith("{") else json.dumps(blob)


def _tokens(line: str) -> Iterator[Any]:
    """Split a line into blob names (str), ``'->'`` and one trailing JSON object (dict)."""
    decoder = json.JSONDecoder(object_pairs_hook=_pairs)
    position = 0
    while position < len(line):
        if line[position].isspace():
            position += 1
        elif line[position] in '"{':
            try:
                value, position = decoder.raw_decode(line, position)
            except json.JSONDecodeError as error:
                raise TextFormatError(f"bad JSON in {line!r}: {error}; the options must be one "
                                      "JSON object") from error
            yield _Quoted(value) if isinstance(value, str) else value
        else:
            end = position
            while end < len(line) and not line[end].isspace():
                end += 1
            yield line[position:end]
            position = end


class _Quoted(str):
    """A blob name that was written as a JSON string (so ``"->"`` is a name, not the arrow)."""


def _arrow_index(tokens: list[Any]) -> int:
    """Index of the unquoted ``->`` token, or -1."""
    return next((i for i, token in enumerate(tokens)
                 if token == "->" and not isinstance(token, _Quoted)), -1)


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object kept as ordered (key, value) pairs, duplicates included."""

    def get(self, key: str, default: Any = None) -> Any:
        return next((v for k, v in self if k == key), default)

    def keys(self) -> list[str]:
        return [k for k, _ in self]

    def items(self) -> list[tuple[str, Any]]:
        return list(self)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.get(key)
        return list.__getitem__(self, key)


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    return _Pairs(pairs)


# --- ops and nets ------------------------------------------------------------------------
_OP_SCALARS = (("name", "name"), ("engine", "engine"), ("is_gradient_op", "grad"),
               ("debug_info", "debug_info"), ("domain", "domain"), ("op_version", "op_version"))


def format_op(op: caffe2_pb2.OperatorDef) -> str:
    """One ``op`` line."""
    parts = ["op", _name(op.type), *map(_name, op.input), "->", *map(_name, op.output)]
    options: dict[str, Any] = {}
    if op.arg:
        options["args"] = [[a.name, _encode_argument(a)] for a in op.arg]
    if op.HasField("device_option"):
        options["device"] = _encode_device(op.device_option)
    for field, key in _OP_SCALARS:
        if op.HasField(field):
            options[key] = getattr(op, field)
    if op.control_input:
        options["ctrl"] = list(op.control_input)
    if options:
        parts.append(json.dumps(options))
    return " ".join(parts)


def parse_op(line: str) -> caffe2_pb2.OperatorDef:
    """Parse one ``op`` line."""
    tokens = list(_tokens(line))
    arrow = _arrow_index(tokens)
    if len(tokens) < 3 or tokens[0] != "op" or arrow < 0:
        raise TextFormatError(f"not an op line: {line!r}; write "
                              "'op TYPE INPUT... -> OUTPUT... {OPTIONS}'")
    options = tokens.pop() if isinstance(tokens[-1], _Pairs) else _Pairs()
    op = caffe2_pb2.OperatorDef(type=tokens[1])
    op.input.extend(tokens[2:arrow])
    op.output.extend(tokens[arrow + 1:])
    for name, value in options.get("args", []):
        op.arg.append(_decode_argument(name, value))
    if "device" in options:
        _decode_device(options["device"], op.device_option)
    for field, key in _OP_SCALARS:
        if key in options:
            setattr(op, field, options[key])
    op.control_input.extend(options.get("ctrl", []))
    return op


def format_net(net: Any) -> str:
    """The text form of a NetDef (or Net)."""
    proto: caffe2_pb2.NetDef = proto_of(net)
    header: dict[str, Any] = {}
    for field in ("type", "num_workers"):
        if proto.HasField(field):
            header[field] = getattr(proto, field)
    if proto.HasField("device_option"):
        header["device"] = _encode_device(proto.device_option)
    if proto.arg:
        header["args"] = [[a.name, _encode_argument(a)] for a in proto.arg]
    head = f"net {json.dumps(proto.name)}" if proto.HasField("name") else "net"
    lines = [head + (f" {json.dumps(header)}" if header else "")]
    if proto.external_input:
        lines.append("input " + " ".join(map(_name, proto.external_input)))
    if proto.external_output:
        lines.append("output " + " ".join(map(_name, proto.external_output)))
    for op in proto.op:
        lines.append(format_op(op))
        lines.extend(_nested_net_comments(op))
    return "\n".join(lines) + "\n"


def _nested_net_comments(op: caffe2_pb2.OperatorDef, depth: int = 1) -> list[str]:
    """A readable rendering of the op's nested nets (RecurrentNetwork step nets, If/While
    bodies) as ``#`` comment lines under it; the op line's ``$net`` value stays the
    lossless record, so parsing ignores these lines."""
    lines = []
    for argument in op.arg:
        nets = [argument.n] if argument.HasField("n") else list(argument.nets)
        for nested in nets:
            pad = "#" + "  " * depth
            lines.append(f"{pad}{argument.name}:")
            lines.extend(pad + "  " + line for line in format_net(nested).splitlines())
    return lines


def parse_net(text: str) -> caffe2_pb2.NetDef:
    """Parse the text form back into a NetDef."""
    proto = caffe2_pb2.NetDef()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword = line.split(None, 1)[0]
        try:
            if keyword == "net":
                _parse_header(line, proto)
            elif keyword in ("input", "output"):
                names = list(_tokens(line))[1:]
                field = proto.external_input if keyword == "input" else proto.external_output
                field.extend(names)
            elif keyword == "op":
                proto.op.append(parse_op(line))
            else:
                raise TextFormatError(f"unknown keyword {keyword!r}; a line starts with "
                                      "'net', 'input', 'output', 'op' or '#'")
        except TextFormatError as error:
            raise TextFormatError(f"line {number}: {error}") from None
        except RecursionError:
            raise TextLimitError(f"line {number}: the options nest too deeply to parse; the "
                                 "text is hostile or corrupt (flatten the nesting).") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as error:
            raise TextFormatError(f"line {number}: {error}; fix the value on that line (the "
                                  "format is what dpgraph.ir.text.format_net writes).") from None
    check_nesting(proto, "text net")
    return proto


def _parse_header(line: str, proto: caffe2_pb2.NetDef) -> None:
    tokens = list(_tokens(line))[1:]
    options = tokens.pop() if tokens and isinstance(tokens[-1], _Pairs) else _Pairs()
    if tokens:
        proto.name = tokens[0]
    for field in ("type", "num_workers"):
        if field in options:
            setattr(proto, field, options[field])
    if "device" in options:
        _decode_device(options["device"], proto.device_option)
    for name, value in options.get("args", []):
        proto.arg.append(_decode_argument(name, value))
