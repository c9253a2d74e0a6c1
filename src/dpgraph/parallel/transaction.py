"""Transactional Parallelize: snapshot the model up front, restore it on any error.

The snapshot covers every attribute of the model (containers are restored in place so
shared objects keep their identity), the live protos of every Net the model refers to,
the Nets' bookkeeping, and the ParameterInfo objects (whose ``grad`` autodiff sets).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from dpgraph.ir.net import Net
from dpgraph.proto import caffe2_pb2

_NET_STATE = ("_next_name_index", "_registered_blob_names", "_attr_dict",
              "_recreate_lookup_tables", "_op_outputs", "_external_input_map")


@dataclass
class _NetSnapshot:
    net: Net
    proto: caffe2_pb2.NetDef
    state: dict[str, Any]


@dataclass
class ModelSnapshot:
    """Everything needed to put a model back as it was."""

    model: Any
    attrs: dict[str, Any] = field(default_factory=dict)
    contents: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    nets: list[_NetSnapshot] = field(default_factory=list)
    objects: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    def restore(self) -> None:
        for snap in self.nets:
            live = snap.net._net
            live.Clear()
            live.CopyFrom(snap.proto)
            for key, value in snap.state.items():
                setattr(snap.net, key, value)
            snap.net._recreate_lookup_tables = True
        for obj, saved in self.contents.values():
            _restore_container(obj, saved)
        for obj, saved_vars in self.objects:
            obj.__dict__.clear()
            obj.__dict__.update(saved_vars)
        current = vars(self.model)
        for key in list(current):
            if key not in self.attrs:
                del current[key]
        current.update(self.attrs)


def _restore_container(obj: Any, saved: Any) -> None:
    if isinstance(obj, list):
        obj[:] = saved
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(saved)
    elif isinstance(obj, set):
        obj.clear()
        obj.update(saved)


def _snapshot_net(net: Net) -> _NetSnapshot:
    proto = caffe2_pb2.NetDef()
    proto.CopyFrom(net._net)
    state = {k: copy.copy(getattr(net, k)) for k in _NET_STATE if hasattr(net, k)}
    return _NetSnapshot(net, proto, state)


def _visit(snapshot: ModelSnapshot, value: Any, seen_nets: set[int]) -> None:
    if isinstance(value, Net):
        if id(value) not in seen_nets:
            seen_nets.add(id(value))
            snapshot.nets.append(_snapshot_net(value))
        return
    if isinstance(value, (list, dict, set)) and id(value) not in snapshot.contents:
        snapshot.contents[id(value)] = (value, copy.copy(value))
        items = value.values() if isinstance(value, dict) else value
        for item in list(items):
            if isinstance(item, Net):
                _visit(snapshot, item, seen_nets)
            elif hasattr(item, "__dict__") and type(item).__name__ == "ParameterInfo":
                snapshot.objects.append((item, dict(vars(item))))


def take_snapshot(model: Any) -> ModelSnapshot:
    """Snapshot ``model`` (a ModelHelper) so :meth:`ModelSnapshot.restore` can undo."""
    snapshot = ModelSnapshot(model, attrs=dict(vars(model)))
    seen: set[int] = set()
    for value in snapshot.attrs.values():
        _visit(snapshot, value, seen)
    return snapshot
