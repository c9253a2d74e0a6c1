"""Parallelize by cloning: what one device's builders added, recorded and replayed for
other devices through a blob-name map.

:func:`watch` marks the model before a device's builders run; :func:`additions` then
returns what they appended (ops and external blobs of both nets, params, weights, biases,
computed params, parameter infos, reserved blob names), or ``None`` when they changed
anything else (other model attributes, net attributes, the workspace), which cannot be
replayed.  :func:`clone_for` renames a recording for another device (blob names under
``<prefix>_<d0>/`` move to ``<prefix>_<d>/``, ops on the first device's option move to the
other device's) and :func:`same` compares a renamed recording with a real one.

Before (device 0 built by its builders)::

    FC(cpu_0/data, cpu_0/fc_w, cpu_0/fc_b) -> cpu_0/fc            (device cpu 0)

After ``apply(model, clone_for(recorded, renamer(state, 1)))``::

    FC(cpu_1/data, cpu_1/fc_w, cpu_1/fc_b) -> cpu_1/fc            (device cpu 1)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dpgraph.ir.blob import BlobReference
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as runtime

#: Model lists the builders may append to (ModelHelper.AddParameter's targets).
LISTS = ("params", "weights", "biases", "_computed_params")
#: Model attributes a replay updates: the lists, the parameter infos and the nets.
_REPLAYED = frozenset(LISTS) | {"_parameters_info", "net", "param_init_net"}
#: Net bookkeeping a replayable build leaves alone (auto-name counter, attributes, records).
_NET_FIXED = ("_next_name_index", "_input_record", "_output_record")
_NETS = ("net", "param_init_net")


@dataclass
class Mark:
    """Sizes and fingerprints of the model before one device's builders run."""

    ops: dict[str, int]
    inputs: dict[str, int]
    outputs: dict[str, int]
    lists: dict[str, int]
    infos: int
    registered: dict[str, frozenset[str]]
    fixed: tuple[Any, ...]
    others: dict[str, tuple[int, int | None]]
    blobs: frozenset[str]


@dataclass
class Additions:
    """What one device's builders added, in order."""

    ops: dict[str, list[caffe2_pb2.OperatorDef]]
    inputs: dict[str, list[str]]
    outputs: dict[str, list[str]]
    lists: dict[str, list[BlobReference]]
    infos: list[Any]
    registered: dict[str, set[str]]
    losses: Any = None
    #: per net, the ops with their blob lists precomputed (see :func:`plans`)
    compiled: dict[str, list[OpPlan]] = field(default_factory=dict)


#: ``(op, inputs, outputs, control inputs, on the first device)``
OpPlan = tuple[caffe2_pb2.OperatorDef, tuple[str, ...], tuple[str, ...], tuple[str, ...], bool]


def plans_of(ops: Iterable[caffe2_pb2.OperatorDef], first_option: caffe2_pb2.DeviceOption
             ) -> list[OpPlan]:
    """``ops`` with their blob lists read once (replays only look names up)."""
    return [(op, tuple(op.input), tuple(op.output), tuple(op.control_input),
             _on(op, first_option)) for op in ops]


def _on(op: caffe2_pb2.OperatorDef, option: caffe2_pb2.DeviceOption) -> bool:
    """Whether ``op`` runs on ``option``'s device (other option fields, such as autodiff's
    ``extra_info``, are kept as they are)."""
    mine = op.device_option
    return (op.HasField("device_option") and mine.HasField("device_id")
            and mine.device_type == option.device_type and mine.device_id == option.device_id)


def plans(recorded: Additions, first_option: caffe2_pb2.DeviceOption) -> dict[str, list[OpPlan]]:
    """The recorded ops as plans, made once per recording."""
    if not recorded.compiled:
        recorded.compiled = {net_name: plans_of(ops, first_option)
                             for net_name, ops in recorded.ops.items()}
    return recorded.compiled


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (list, dict, set, tuple)) else None


def _others(model: Any) -> dict[str, tuple[int, int | None]]:
    return {name: (id(value), _size(value)) for name, value in vars(model).items()
            if name not in _REPLAYED}


def _fixed(model: Any) -> tuple[Any, ...]:
    state: list[Any] = []
    for net_name in _NETS:
        net = getattr(model, net_name)
        state.extend(id(getattr(net, attr, None)) if "record" in attr
                     else getattr(net, attr, None) for attr in _NET_FIXED)
        attrs: dict[str, Any] = getattr(net, "_attr_dict", {})
        state.append(sum(len(v) for v in attrs.values()))
    return tuple(state)


def watch(model: Any) -> Mark:
    """Mark ``model`` (a ModelHelper) before one device's builders run."""
    protos = {n: getattr(model, n).Proto() for n in _NETS}
    return Mark(
        ops={n: len(p.op) for n, p in protos.items()},
        inputs={n: len(p.external_input) for n, p in protos.items()},
        outputs={n: len(p.external_output) for n, p in protos.items()},
        lists={n: len(getattr(model, n)) for n in LISTS},
        infos=len(model._parameters_info),
        registered={n: frozenset(getattr(model, n)._registered_blob_names) for n in _NETS},
        fixed=_fixed(model), others=_others(model), blobs=frozenset(runtime.Blobs()),
    )


def additions(model: Any, mark: Mark, losses: Any = None) -> Additions | None:
    """What the builders appended since ``mark``, or ``None`` if they changed anything a
    replay cannot reproduce."""
    if (_others(model) != mark.others or _fixed(model) != mark.fixed
            or frozenset(runtime.Blobs()) != mark.blobs):
        return None
    protos = {n: getattr(model, n).Proto() for n in _NETS}
    lists = {n: list(getattr(model, n)[mark.lists[n]:]) for n in LISTS}
    if any(len(getattr(model, n)) < mark.lists[n] for n in LISTS):
        return None
    infos = list(model._parameters_info.values())[mark.infos:]
    if any(getattr(info, "blob_copy", None) is not None for info in infos):
        return None
    return Additions(
        ops={n: [_detached(op) for op in p.op[mark.ops[n]:]] for n, p in protos.items()},
        inputs={n: list(p.external_input[mark.inputs[n]:]) for n, p in protos.items()},
        outputs={n: list(p.external_output[mark.outputs[n]:]) for n, p in protos.items()},
        lists=lists, infos=infos,
        registered={n: set(getattr(model, n)._registered_blob_names) - mark.registered[n]
                    for n in _NETS},
        losses=losses,
    )


def _detached(op: caffe2_pb2.OperatorDef) -> caffe2_pb2.OperatorDef:
    copied = caffe2_pb2.OperatorDef()
    copied.CopyFrom(op)
    return copied


class Renamer:
    """Blob names and device options of the first device, moved to device ``device``."""

    def __init__(self, prefix: str, first: int, device: int, device_type: int) -> None:
        self.old, self.new = f"{prefix}_{first}/", f"{prefix}_{device}/"
        self.cut = len(self.old)
        self.first_option = caffe2_pb2.DeviceOption(device_type=device_type, device_id=first)
        self.device = device
        self.cache: dict[str, str] = {}
        self.refs: dict[int, BlobReference] = {}

    def name(self, blob: str) -> str:
        """``<prefix>_<first>/x`` -> ``<prefix>_<device>/x``; also autodiff's split
        gradients ``_<prefix>_<first>/x_grad_autosplit_0``; other names are kept."""
        renamed = self.cache.get(blob)
        if renamed is None:
            if blob.startswith(self.old):
                renamed = self.new + blob[self.cut:]
            elif blob.startswith("_") and blob.startswith(self.old, 1):
                renamed = "_" + self.new + blob[self.cut + 1:]
            else:
                renamed = blob
            self.cache[blob] = renamed
        return renamed

    def names(self, blobs: Iterable[str]) -> list[str]:
        return [self.name(b) for b in blobs]

    def ref(self, blob: BlobReference) -> BlobReference:
        """The renamed reference, bound to the same net; one object per original (a param
        listed in ``params`` and ``weights`` stays one object, as a real build makes it)."""
        renamed = self.refs.get(id(blob))
        if renamed is None:
            renamed = BlobReference(self.name(str(blob)), blob.Net())
            if blob._meta:  # (an unset or empty meta stays unset: made on first use)
                renamed.meta = dict(blob._meta)
            self.refs[id(blob)] = renamed
        return renamed

    def new_inputs(self, blobs: Iterable[str]) -> list[str]:
        """External inputs a build of this device adds: unscoped ones were declared by the
        first device's build already."""
        return [renamed for blob in blobs if (renamed := self.name(blob)) != blob]

    def ops_into(self, compiled: list[OpPlan], targets: Iterable[caffe2_pb2.OperatorDef]
                 ) -> None:
        """Each target becomes its plan's op renamed (one proto copy, then the renamed
        fields; the plans' blob names are looked up in a map made once per device)."""
        for name in {b for plan in compiled for lists in plan[1:4] for b in lists}:
            self.name(name)
        names, device = self.cache, self.device
        for (op, ins, outs, ctrl, on_first), target in zip(compiled, targets):
            target.CopyFrom(op)
            target.input[:] = [names[b] for b in ins]
            target.output[:] = [names[b] for b in outs]
            if ctrl:
                target.control_input[:] = [names[b] for b in ctrl]
            if on_first:
                target.device_option.device_id = device


def _info(info: Any, renamer: Renamer) -> Any:
    renamed = info.__class__.__new__(info.__class__)
    renamed.__dict__.update(info.__dict__)
    renamed.blob = renamer.ref(info.blob)
    renamed.name = str(renamed.blob)
    renamed._cloned_init_net = None
    return renamed


def _losses(losses: Any, renamer: Renamer) -> Any:
    if isinstance(losses, list):
        return [renamer.ref(b) if isinstance(b, BlobReference) else b for b in losses]
    return losses


def clone_for(recorded: Additions, renamer: Renamer) -> Additions:
    """``recorded`` renamed for another device (ops are detached copies)."""
    ops = {}
    for net_name, compiled in plans(recorded, renamer.first_option).items():
        ops[net_name] = [caffe2_pb2.OperatorDef() for _ in compiled]
        renamer.ops_into(compiled, ops[net_name])
    return Additions(
        ops=ops,
        inputs={n: renamer.new_inputs(v) for n, v in recorded.inputs.items()},
        outputs={n: renamer.names(v) for n, v in recorded.outputs.items()},
        lists={n: [renamer.ref(b) for b in v] for n, v in recorded.lists.items()},
        infos=[_info(info, renamer) for info in recorded.infos],
        registered={n: set(renamer.names(v)) for n, v in recorded.registered.items()},
        losses=_losses(recorded.losses, renamer),
    )


def _info_key(info: Any) -> tuple[Any, ...]:
    return (info.name, info.param_id, info.key, info.shape, info.length, info.grad,
            id(info.optimizer), id(info.regularizer), type(info))


def _names(values: Any) -> Any:
    if isinstance(values, list):
        return [(type(v), str(v)) for v in values]
    return (type(values), values)


def same(expected: Additions, actual: Additions) -> bool:
    """Whether a renamed recording is exactly what another device's builders added."""
    for net_name, ops in expected.ops.items():
        real = actual.ops[net_name]
        if len(ops) != len(real) or any(
                a.SerializeToString() != b.SerializeToString() for a, b in zip(ops, real)):
            return False
    return (expected.inputs == actual.inputs and expected.outputs == actual.outputs
            and {n: [str(b) for b in v] for n, v in expected.lists.items()}
            == {n: [str(b) for b in v] for n, v in actual.lists.items()}
            and [_info_key(i) for i in expected.infos] == [_info_key(i) for i in actual.infos]
            and expected.registered == actual.registered
            and _names(expected.losses) == _names(actual.losses))


def apply(model: Any, recorded: Additions, renamer: Renamer) -> Any:
    """Append ``recorded``, renamed by ``renamer``, to ``model`` as that device's builders
    would have; returns the renamed losses."""
    compiled = plans(recorded, renamer.first_option)
    for net_name in _NETS:
        net = getattr(model, net_name)
        proto = net.Proto()  # marks the net's lookup tables for a rebuild
        live = proto.op
        renamer.ops_into(compiled[net_name], (live.add() for _ in compiled[net_name]))
        # new by construction (renamed into this device's scope; a real build of this
        # device declared exactly these, as checked on the second device)
        proto.external_input.extend(renamer.new_inputs(recorded.inputs[net_name]))
        proto.external_output.extend(renamer.names(recorded.outputs[net_name]))
        net._registered_blob_names.update(renamer.names(recorded.registered[net_name]))
    for name in LISTS:
        getattr(model, name).extend(renamer.ref(b) for b in recorded.lists[name])
    for info in recorded.infos:
        renamed = _info(info, renamer)
        model._parameters_info[renamed.name] = renamed
    return _losses(recorded.losses, renamer)


def replayable(recorded: Additions | None) -> bool:
    """A recording exists and holds no nested nets (their blob names are not renamed)."""
    if recorded is None:
        return False
    for ops in recorded.ops.values():
        for op in ops:
            if any(arg.HasField("n") or len(arg.nets) for arg in op.arg):
                return False
    return True
