"""Caffe2's map blobs: CreateMap, KeyValueToMap, MapToKeyValue, and their serializer.

A map blob is a :class:`MapBlob` (a dict with its key and value dtypes, int32 or int64).
Saved, it is a BlobProto of type ``(std::unordered_map<K, V>)`` whose ``content`` is a
``TensorProtos`` of two 1-D tensors, the keys and the values, as Caffe2 writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError
from dpgraph.ir.arrays import to_host
from dpgraph.ir.blob_serde import (
    TypeSerializer,
    register_type,
    tensor_chunk,
    tensor_proto_to_numpy,
)
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto
_DTYPES: dict[int, np.dtype] = {int(DT.INT32): np.dtype(np.int32),
                                 int(DT.INT64): np.dtype(np.int64)}
_C_NAMES: dict[np.dtype, str] = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}


class MapBlob(dict):  # type: ignore[type-arg]
    """A Caffe2 map blob: ``{key: value}`` with fixed key and value dtypes."""

    def __init__(self, key_dtype: Any, value_dtype: Any, items: Any = ()) -> None:
        super().__init__(items)
        self.key_dtype, self.value_dtype = np.dtype(key_dtype), np.dtype(value_dtype)

    @property
    def type_name(self) -> str:
        return (f"(std::unordered_map<{_C_NAMES[self.key_dtype]}, "
                f"{_C_NAMES[self.value_dtype]}>)")

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array(list(self.keys()), dtype=self.key_dtype),
                np.array(list(self.values()), dtype=self.value_dtype))


def _dtype_arg(ctx: OpContext, name: str) -> np.dtype:
    data_type = ctx.int_arg(name, int(DT.INT32))
    if data_type not in _DTYPES:
        raise ArgumentError(ctx.describe(f"{name} must be INT32 or INT64, got {data_type}."))
    return _DTYPES[data_type]


@register_op("CreateMap", inputs=0, outputs=1)
def create_map(ctx: OpContext) -> Outputs:
    """An empty map of ``key_dtype`` to ``value_dtype`` (TensorProto types, default INT32)."""
    return (MapBlob(_dtype_arg(ctx, "key_dtype"), _dtype_arg(ctx, "value_dtype")),)


def _int_input(ctx: OpContext, index: int) -> np.ndarray:
    array = np.asarray(to_host(ctx.inputs[index]))
    if array.dtype not in _C_NAMES:
        raise ctx.fail(f"input {index} ({ctx.input_name(index)}) must be int32 or int64, got "
                       f"{array.dtype}.")
    return array.reshape(-1)


@register_op("KeyValueToMap", inputs=2, outputs=1)
def key_value_to_map(ctx: OpContext) -> Outputs:
    """A map from the keys and values tensors (the first value of a repeated key wins)."""
    keys, values = _int_input(ctx, 0), _int_input(ctx, 1)
    if keys.size != values.size:
        raise ctx.fail(f"keys and values must have the same size, got {keys.size} and "
                       f"{values.size}.")
    result = MapBlob(keys.dtype, values.dtype)
    for key, value in zip(keys.tolist(), values.tolist()):
        result.setdefault(key, value)
    return (result,)


@register_op("MapToKeyValue", inputs=1, outputs=2)
def map_to_key_value(ctx: OpContext) -> Outputs:
    """The map's keys and values as two 1-D tensors."""
    return ctx.object_input(0, MapBlob, "map", "CreateMap or KeyValueToMap").arrays()


def _serialize(name: str, value: MapBlob) -> bytes:
    protos = caffe2_pb2.TensorProtos()
    for array in value.arrays():
        protos.protos.add().CopyFrom(tensor_chunk(array, name, 0, array.size))
    return protos.SerializeToString()


def _deserializer(key_dtype: np.dtype, value_dtype: np.dtype) -> Any:
    def deserialize(content: bytes) -> MapBlob:
        protos = caffe2_pb2.TensorProtos.FromString(content)
        if len(protos.protos) != 2:
            raise ArgumentError(f"a serialized map holds 2 tensors (keys, values), got "
                                f"{len(protos.protos)}.")
        keys, values = (tensor_proto_to_numpy(p, "map blob").reshape(-1) for p in protos.protos)
        return MapBlob(key_dtype, value_dtype, zip(keys.tolist(), values.tolist()))
    return deserialize


def _accepts(type_name: str) -> Any:
    return lambda value: isinstance(value, MapBlob) and value.type_name == type_name


for _key in _C_NAMES:
    for _value in _C_NAMES:
        _name = MapBlob(_key, _value).type_name
        register_type(TypeSerializer(_name, _accepts(_name), _serialize,
                                     _deserializer(_key, _value)))

def _no_gradient(g: Any) -> None:
    """Caffe2's ``NO_GRADIENT``."""


for _op_type in ("CreateMap", "KeyValueToMap", "MapToKeyValue"):
    register_gradient(_op_type)(_no_gradient)

__all__ = ["MapBlob"]
