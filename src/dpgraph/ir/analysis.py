"""Pure analyses of NetDefs: SSA versions, use-def chains, producers, blob devices, op
properties (read from the one table: the flags on :class:`~dpgraph.ir.registry.OpSchema`)
and the structural counts users' graph tests ask for (re-exported by ``dpgraph.testing``).

Nothing here is cached: every function recomputes from the protos it is given, so the
results stay right however the net was mutated.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from dpgraph.ir.device import device_name, effective_device
from dpgraph.ir.proto_io import proto_of
from dpgraph.ir.registry import OPERATORS, OpSchema
from dpgraph.proto import caffe2_pb2

OpList = Sequence[caffe2_pb2.OperatorDef]
Versioned = tuple[str, int]


def _ops(net: Any) -> OpList:
    if hasattr(net, "Proto"):
        return net.Proto().op
    if isinstance(net, caffe2_pb2.NetDef):
        return net.op
    return list(net)


def get_ssa(net: Any, blob_versions: dict[str, int] | None = None
            ) -> tuple[list[tuple[list[Versioned], list[Versioned]]], dict[str, int]]:
    """Per op, its ``(inputs, outputs)`` as ``(name, version)``; and the final versions.

    A blob's version starts at 0 and goes up each time an op writes it.  As in Caffe2, the
    versions include the net's external inputs at 0 (or, for a net that declares none, every
    blob read before it is written), so they can seed :func:`get_op_ids_in_path`.
    """
    versions: dict[str, int] = dict(blob_versions or {})
    proto = proto_of(net)
    external = list(proto.external_input) if isinstance(proto, caffe2_pb2.NetDef) else []
    for b in external:
        versions.setdefault(b, 0)
    ssa = []
    for op in _ops(net):
        if not external:
            for b in op.input:
                versions.setdefault(b, 0)
        inputs = [(b, versions.get(b, 0)) for b in op.input]
        for b in op.output:
            versions[b] = versions.get(b, 0) + 1
        ssa.append((inputs, [(b, versions[b]) for b in op.output]))
    return ssa, versions


def get_undefined_blobs(ssa: Sequence[tuple[list[Versioned], list[Versioned]]]) -> set[str]:
    """Blobs read at version 0, i.e. before any op in the net writes them."""
    return {name for inputs, _ in ssa for name, version in inputs if version == 0}


def get_output_producers(ssa: Sequence[tuple[list[Versioned], list[Versioned]]]
                         ) -> dict[Versioned, int]:
    """``{(blob, version): index of the op that produced it}``."""
    return {out: index for index, (_, outputs) in enumerate(ssa) for out in outputs}


def producers(net: Any) -> dict[str, list[int]]:
    """``{blob: [indices of ops writing it]}`` in op order."""
    return _op_indices_by_blob(net, "output")


def consumers(net: Any) -> dict[str, list[int]]:
    """``{blob: [indices of ops reading it]}`` in op order."""
    return _op_indices_by_blob(net, "input")


def _op_indices_by_blob(net: Any, field: str) -> dict[str, list[int]]:
    """Blob -> indices of the ops naming it in their ``field`` (input or output), in op order."""
    result: defaultdict[str, list[int]] = defaultdict(list)
    for index, op in enumerate(_ops(net)):
        for b in getattr(op, field):
            result[b].append(index)
    return dict(result)


def ops_in_path(ops: OpList, inputs: Iterable[str], outputs: Iterable[str]) -> list[int]:
    """Indices of the ops needed to compute ``outputs`` once ``inputs`` are given."""
    ssa, _ = get_ssa(ops)
    producer = get_output_producers(ssa)
    final: dict[str, int] = {}
    for _, outs in ssa:
        for name, version in outs:
            final[name] = version
    stop = set(inputs)
    needed: set[int] = set()
    stack = [(o, final.get(o, 0)) for o in outputs]
    while stack:
        blob = stack.pop()
        if blob[0] in stop or blob not in producer:
            continue
        index = producer[blob]
        if index in needed:
            continue
        needed.add(index)
        stack.extend(ssa[index][0])
    return sorted(needed)


def get_op_ids_in_path(ssa: Sequence[tuple[list[Versioned], list[Versioned]]],
                       blob_versions: dict[str, int], inputs: Iterable[Any],
                       outputs: Iterable[Any]) -> list[int]:
    """Caffe2's signature: the sorted op indices needed to compute ``outputs`` (at their
    versions in ``blob_versions``) given ``inputs`` at their latest versions."""
    given = {(str(i), blob_versions[str(i)]) for i in inputs}
    producer = get_output_producers(ssa)
    queue = [(str(o), blob_versions[str(o)]) for o in outputs]
    used: set[int] = set()
    while queue:
        blob = queue.pop()
        if blob not in given and blob in producer and producer[blob] not in used:
            used.add(producer[blob])
            queue.extend(ssa[producer[blob]][0])
    return sorted(used)


def InferBlobDevices(net: Any) -> dict[str, caffe2_pb2.DeviceOption]:
    """``{output blob: device option of the (last) op that produces it}``."""
    # a Net is only read here: its lookup tables stay valid (no rescan at its next op)
    proto = net.proto_for_reading() if hasattr(net, "proto_for_reading") else proto_of(net)
    default = proto.device_option if isinstance(proto, caffe2_pb2.NetDef) else None
    mapping: dict[str, caffe2_pb2.DeviceOption] = {}
    for op in _ops(proto):
        option = op.device_option if op.HasField("device_option") else default
        if option is not None:
            mapping.update(dict.fromkeys(op.output, option))
        else:  # one new (empty) option per blob
            mapping.update((b, caffe2_pb2.DeviceOption()) for b in op.output)
    return mapping


def external_inputs_of(ops: OpList) -> list[str]:
    """Blobs the ops read before any of them writes them, in first-use order."""
    produced: set[str] = set()
    seen: set[str] = set()
    result = []
    for op in ops:
        for b in op.input:
            if b not in produced and b not in seen:
                seen.add(b)
                result.append(b)
        produced.update(op.output)
    return result


def _cpu_option() -> caffe2_pb2.DeviceOption:
    return caffe2_pb2.DeviceOption(device_type=caffe2_pb2.PROTO_CPU)


#: Copy ops whose inputs or outputs live on CPU whatever the op's own device:
#: ``type: (inputs on CPU, outputs on CPU)``, as Caffe2's device inference functions say.
_CROSS_DEVICE_SIDES = {
    "CopyGPUToCPU": (False, True),
    "EnsureCPUOutput": (False, True),
    "CopyCPUToGPU": (True, False),
    "CopyFromCPUInput": (True, False),
}


def InferOpDeviceAsBlobDevices(op: caffe2_pb2.OperatorDef
                               ) -> tuple[list[caffe2_pb2.DeviceOption],
                                          list[caffe2_pb2.DeviceOption]]:
    """Every input and output on the op's own device option."""
    option = op.device_option if op.HasField("device_option") else caffe2_pb2.DeviceOption()
    return [option] * len(op.input), [option] * len(op.output)


def InferOpBlobDevices(op: caffe2_pb2.OperatorDef
                       ) -> tuple[list[caffe2_pb2.DeviceOption], list[caffe2_pb2.DeviceOption]]:
    """``(input devices, output devices)`` of ``op``, one DeviceOption per blob.

    Copy ops cross devices (e.g. CopyGPUToCPU reads on the op's GPU and writes on CPU); every
    other op keeps all its blobs on its own device option.
    """
    cpu_in, cpu_out = _CROSS_DEVICE_SIDES.get(op.type, (False, False))

    def side(count: int, on_cpu: bool) -> list[caffe2_pb2.DeviceOption]:
        # fresh copies, so editing one never edits the op or another blob's option
        result = []
        for _ in range(count):
            option = _cpu_option() if on_cpu else caffe2_pb2.DeviceOption()
            if not on_cpu and op.HasField("device_option"):
                option.CopyFrom(op.device_option)
            result.append(option)
        return result

    return side(len(op.input), cpu_in), side(len(op.output), cpu_out)


def InferOpBlobDevicesAsDict(op: caffe2_pb2.OperatorDef
                             ) -> tuple[dict[str, caffe2_pb2.DeviceOption],
                                        dict[str, caffe2_pb2.DeviceOption]]:
    """:func:`InferOpBlobDevices` keyed by blob name: ``({input: dev}, {output: dev})``."""
    inputs, outputs = InferOpBlobDevices(op)
    return dict(zip(op.input, inputs, strict=True)), dict(zip(op.output, outputs, strict=True))


# --- op properties: the flags on OpSchema ---------------------------------------------------
OpOrType = caffe2_pb2.OperatorDef | str


def _schema(op_or_type: OpOrType) -> OpSchema | None:
    return OPERATORS.get(op_or_type if isinstance(op_or_type, str) else op_or_type.type)


def _is_dpm_sum(op_or_type: OpOrType) -> bool:
    """Parallelize's CPU all-reduce: a ``Sum`` named ``dpm`` (an op, not a bare type)."""
    return not isinstance(op_or_type, str) and op_or_type.type == "Sum" \
        and op_or_type.name == "dpm"


def is_collective(op_or_type: OpOrType) -> bool:
    """True for communication ops (schema flag ``collective``: NCCL*, Gloo collectives,
    common worlds, Barrier) and, given an op, for Parallelize's ``dpm`` Sum."""
    schema = _schema(op_or_type)
    return (schema is not None and schema.collective) or _is_dpm_sum(op_or_type)


def is_cross_device(op_or_type: OpOrType) -> bool:
    """True when the runtime lets the op read blobs on any device (copies, collectives)."""
    schema = _schema(op_or_type)
    return schema is not None and schema.cross_device


def has_side_effects(op_or_type: OpOrType) -> bool:
    """True for ops no pass may drop (collectives, Iter, Print, queues)."""
    schema = _schema(op_or_type)
    return schema is not None and schema.side_effects


def may_name_other_devices(op_or_type: OpOrType) -> bool:
    """True when an op on one GPU may name another GPU's blobs: cross-device ops, peer
    readers (Concat gathering sparse gradients) and collectives (incl. the ``dpm`` Sum)."""
    schema = _schema(op_or_type)
    if schema is not None and (schema.cross_device or schema.peer_inputs or schema.collective):
        return True
    return _is_dpm_sum(op_or_type)


# --- structural counts (re-exported by dpgraph.testing) -------------------------------------
def collectives(net: Any) -> list[caffe2_pb2.OperatorDef]:
    """The communication ops of ``net``, in order."""
    return [op for op in _ops(net) if is_collective(op)]


def op_device_name(op: caffe2_pb2.OperatorDef, proto: Any = None) -> str:
    """``'gpu_1'``: the device an op runs on (its own option, else the net's)."""
    default = proto.device_option if isinstance(proto, caffe2_pb2.NetDef) and \
        proto.HasField("device_option") else None
    return device_name(effective_device(op, default))


def ops_by_device(net: Any) -> dict[str, list[caffe2_pb2.OperatorDef]]:
    """``{'cpu_0': [ops...], 'gpu_1': [...]}`` in op order."""
    proto = proto_of(net)
    grouped: dict[str, list[caffe2_pb2.OperatorDef]] = {}
    for op in _ops(net):
        grouped.setdefault(op_device_name(op, proto), []).append(op)
    return grouped


def count_ops(net: Any, type: str | None = None, device: str | None = None) -> int:
    """How many ops of ``type`` (any if None) run on ``device`` (e.g. ``'gpu_1'``)."""
    proto = proto_of(net)
    return sum(1 for op in _ops(net)
               if (type is None or op.type == type)
               and (device is None or op_device_name(op, proto) == device))


def op_types(net: Any) -> Counter[str]:
    """``Counter`` of op types."""
    return Counter(op.type for op in _ops(net))
