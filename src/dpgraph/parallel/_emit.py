"""Fast op emission for the passes: OperatorDefs built directly, appended in bulk.

Passes must stay linear in the size of the net, so they never go through per-call
conveniences that rescan the net; inputs a net does not define yet are declared external,
as ``net.<Op>(...)`` would.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from dpgraph.ir.arguments import MakeArgument
from dpgraph.proto import caffe2_pb2


def make_op(
    op_type: str,
    inputs: Iterable[Any],
    outputs: Iterable[Any],
    device: caffe2_pb2.DeviceOption | None = None,
    name: str = "",
    control_input: Iterable[Any] | None = None,
    engine: str | None = None,
    **args: Any,
) -> caffe2_pb2.OperatorDef:
    """An OperatorDef with exact (unscoped) blob names and an explicit device option."""
    fields: dict[str, Any] = {
        "type": op_type, "name": name, "input": [str(b) for b in inputs],
        "output": [str(b) for b in outputs],
    }
    if control_input:
        fields["control_input"] = [str(b) for b in control_input]
    if device is not None:
        fields["device_option"] = device
    if engine is not None:
        fields["engine"] = engine
    if args:
        fields["arg"] = [MakeArgument(k, v) for k, v in args.items() if v is not None]
    return caffe2_pb2.OperatorDef(**fields)


def emit_op(
    net: Any,
    op_type: str,
    inputs: Iterable[Any],
    outputs: Iterable[Any],
    device: caffe2_pb2.DeviceOption | None = None,
    name: str = "",
    control_input: Iterable[Any] | None = None,
    engine: str | None = None,
    **args: Any,
) -> caffe2_pb2.OperatorDef:
    """``emit(net, make_op(...))`` with the op written in place at the end of ``net``'s
    NetDef (no standalone op, no copy); the same bytes, external inputs and errors."""
    input_names = [str(b) for b in inputs]
    output_names = [str(b) for b in outputs]
    return net.append_op(_fill, input_names, output_names, op_type, name, input_names,
                         output_names, control_input, device, engine, args)


def _fill(op: caffe2_pb2.OperatorDef, op_type: str, name: str, inputs: list[str],
          outputs: list[str], control_input: Iterable[Any] | None,
          device: caffe2_pb2.DeviceOption | None, engine: str | None,
          args: dict[str, Any]) -> None:
    """:func:`make_op`'s fields, written into the empty ``op``."""
    op.type = op_type
    op.name = name
    op.input.extend(inputs)
    op.output.extend(outputs)
    if control_input:
        op.control_input.extend([str(b) for b in control_input])
    if device is not None:
        op.device_option.CopyFrom(device)
    if engine is not None:
        op.engine = engine
    if args:
        op.arg.extend([MakeArgument(k, v) for k, v in args.items() if v is not None])


def emit_copies(net: Any, op_type: str, inputs: Iterable[Any], outputs: list[list[str]],
                device: caffe2_pb2.DeviceOption, device_ids: list[int] | None = None) -> None:
    """``emit_op(net, op_type, inputs, outputs[i], device)`` for each ``i`` (on device id
    ``device_ids[i]`` when given), the same bytes in one go: the first op is emitted, the
    others are copies of it with their outputs (see ``Net.append_ops_like``)."""
    if not outputs:
        return
    first = emit_op(net, op_type, inputs, outputs[0], device)
    if len(outputs) > 1:
        template = caffe2_pb2.OperatorDef()
        template.CopyFrom(first)
        net.append_ops_like(template, outputs[1:],
                            None if device_ids is None else device_ids[1:])


def emit(net: Any, *ops: caffe2_pb2.OperatorDef) -> None:
    """Append ``ops`` to ``net`` (a dpgraph Net), declaring undefined inputs external."""
    for op in ops:
        for blob in op.input:
            if not net.BlobIsDefined(blob):
                net.AddExternalInput(blob)
        net.extend_ops([op])


def device_option(device_type: int, device_id: int = 0) -> caffe2_pb2.DeviceOption:
    option = caffe2_pb2.DeviceOption()
    option.device_type = device_type
    option.device_id = device_id
    return option


def walk_ops(net_proto: caffe2_pb2.NetDef) -> Iterator[caffe2_pb2.OperatorDef]:
    """Every op of ``net_proto``, then of the nets in its ops' NetDef arguments (the
    subnets of If/While/Do, e.g. the sync net of ``accumulate_steps``), depth first."""
    for op in net_proto.op:
        yield op
        for arg in op.arg:
            if arg.HasField("n"):
                yield from walk_ops(arg.n)
            for net in arg.nets:
                yield from walk_ops(net)
