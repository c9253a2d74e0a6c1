"""Index operators: a growing ``key -> id`` dictionary held in a blob (Caffe2's index_ops).

``IntIndexCreate`` / ``LongIndexCreate`` / ``StringIndexCreate`` make an empty index
(``max_elements``); ``IndexGet`` maps keys to ids, adding unseen keys (ids start at 1; 0 is
the "unknown" id, returned for unseen keys once the index is frozen); ``IndexFreeze`` stops
growth, ``IndexLoad`` / ``IndexStore`` read and write the keys in id order and
``IndexSize`` counts the ids handed out (the unknown id included)::

    IntIndexCreate([], idx, max_elements=10); IndexGet([idx, [7, 3, 7]]) -> [1, 2, 1]
    IndexFreeze(idx, idx); IndexGet([idx, [5]]) -> [0]

IndexFreeze and IndexLoad must run in place (``schema.extra["enforce_inplace"]``), as in
Caffe2, whose memonger refuses nets that break it. Save/Load keep an index (BlobProto type
``std::unique_ptr<caffe2::IndexBase>``): its keys in id order, ``max_elements`` and frozen.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dpgraph.ir.blob_serde import (
    TypeSerializer,
    numpy_to_tensor_proto,
    register_type,
    tensor_proto_to_numpy,
)
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.proto import caffe2_pb2

ENFORCE_INPLACE = "enforce_inplace"
_INT32_MAX = 2 ** 31 - 1


class Index:
    """The dictionary blob: keys of one dtype mapped to ids 1..; 0 is unknown."""

    def __init__(self, dtype: Any, max_elements: int) -> None:
        self.dtype = np.dtype(dtype)
        self.max_elements = int(max_elements)
        self.ids: dict[Any, int] = {}
        self.next_id = 1
        self.frozen = False
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Index(dtype={self.dtype}, size={self.next_id}, "
                f"max_elements={self.max_elements}, frozen={self.frozen})")

    def key(self, value: Any) -> Any:
        if self.dtype == object:
            return value if isinstance(value, bytes) else str(value).encode()
        return self.dtype.type(value).item()

    def get(self, ctx: OpContext, keys: Any) -> Any:
        out = np.zeros(np.shape(keys), dtype=np.int64)
        flat = out.reshape(-1)
        with self.lock:
            for i, raw in enumerate(np.asarray(keys).reshape(-1)):
                key = self.key(raw)
                found = self.ids.get(key)
                if found is not None or self.frozen:
                    flat[i] = found or 0
                    continue
                if self.next_id >= self.max_elements:
                    raise ctx.fail(f"Dict max size reached: the index holds "
                                   f"{self.max_elements} elements (max_elements); create it "
                                   "with a larger max_elements or freeze it first")
                self.ids[key] = flat[i] = self.next_id
                self.next_id += 1
        return out

    def load(self, ctx: OpContext, keys: Any) -> None:
        with self.lock:
            if self.frozen:
                raise ctx.fail("cannot load into a frozen index")
            for raw in np.asarray(keys).reshape(-1):
                key = self.key(raw)
                if key in self.ids:
                    raise ctx.fail(f"Repeated elements found ({raw!r}): cannot load into "
                                   "dictionary.")
                if self.next_id >= self.max_elements:
                    raise ctx.fail(f"Dict max size reached ({self.max_elements}) while "
                                   "loading")
                self.ids[key] = self.next_id
                self.next_id += 1

    def store(self) -> Any:
        with self.lock:
            keys = sorted(self.ids, key=self.ids.__getitem__)
        if self.dtype == object:
            out = np.empty(len(keys), dtype=object)
            out[:] = keys
            return out
        return np.asarray(keys, dtype=self.dtype)


def _create(dtype: Any) -> Any:
    def kernel(ctx: OpContext) -> Outputs:
        max_elements = ctx.int_arg("max_elements", _INT32_MAX)
        if max_elements <= 0:
            raise ctx.fail(f"max_elements must be positive, got {max_elements}")
        return (Index(dtype, max_elements),)

    kernel.__doc__ = f"[] -> [handle]: an empty {np.dtype(dtype).name} index."
    return kernel


register_op("IntIndexCreate", inputs=0, outputs=1)(_create(np.int32))
register_op("LongIndexCreate", inputs=0, outputs=1)(_create(np.int64))
register_op("StringIndexCreate", inputs=0, outputs=1)(_create(object))


def _index(ctx: OpContext, position: int = 0) -> Index:
    handle = ctx.inputs[position]
    if not isinstance(handle, Index):
        raise ctx.fail(f"input {ctx.input_name(position)!r} is not an index (got "
                       f"{type(handle).__name__}); create it with IntIndexCreate, "
                       "LongIndexCreate or StringIndexCreate")
    return handle


@register_op("IndexGet", inputs=2, outputs=1)
def index_get(ctx: OpContext) -> Outputs:
    """[handle, keys] -> [int64 ids] (unseen keys get new ids unless frozen: then 0)."""
    return (_index(ctx).get(ctx, host(ctx.inputs[1])),)


@register_op("IndexFreeze", inputs=1, outputs=1, inplace=[(0, 0)], side_effects=True)
def index_freeze(ctx: OpContext) -> Outputs:
    """[handle] -> [handle] (in place): later IndexGet calls map unseen keys to 0."""
    index = _index(ctx)
    index.frozen = True
    return (index,)


@register_op("IndexLoad", inputs=2, outputs=1, inplace=[(0, 0)], side_effects=True)
def index_load(ctx: OpContext) -> Outputs:
    """[handle, keys] -> [handle] (in place): add the keys in order (``skip_first_entry``
    drops the first, the slot of the unknown id in embedding-aligned tensors)."""
    index = _index(ctx)
    keys = np.asarray(host(ctx.inputs[1])).reshape(-1)
    index.load(ctx, keys[1:] if ctx.int_arg("skip_first_entry", 0) else keys)
    return (index,)


@register_op("IndexStore", inputs=1, outputs=1)
def index_store(ctx: OpContext) -> Outputs:
    """[handle] -> [keys in id order] (id 1 first; the unknown id has no key)."""
    return (_index(ctx).store(),)


@register_op("IndexSize", inputs=1, outputs=1)
def index_size(ctx: OpContext) -> Outputs:
    """[handle] -> [int64 scalar]: ids handed out so far, the unknown id 0 included."""
    return (np.array(_index(ctx).next_id, dtype=np.int64),)


for _type in ("IndexFreeze", "IndexLoad"):
    OPERATORS.lookup(_type).extra[ENFORCE_INPLACE] = ((0, 0),)


INDEX_TYPE = "std::unique_ptr<caffe2::IndexBase>"


def _serialize_index(name: str, index: Index) -> bytes:
    """``TensorProtos``: the keys in id order, then INT64 ``[max_elements, frozen]``."""
    keys = numpy_to_tensor_proto(index.store(), name)
    meta = numpy_to_tensor_proto(
        np.array([index.max_elements, int(index.frozen)], dtype=np.int64), name)
    return caffe2_pb2.TensorProtos(protos=[keys, meta]).SerializeToString()


def _deserialize_index(content: bytes) -> Index:
    keys_proto, meta_proto = caffe2_pb2.TensorProtos.FromString(content).protos
    keys = tensor_proto_to_numpy(keys_proto, f"index {keys_proto.name!r}")
    max_elements, frozen = (int(v) for v in tensor_proto_to_numpy(meta_proto))
    index = Index(keys.dtype if keys.dtype != object else object, max_elements)
    for key in keys.reshape(-1):
        index.ids[index.key(key)] = index.next_id
        index.next_id += 1
    index.frozen = bool(frozen)
    return index


register_type(TypeSerializer(INDEX_TYPE, lambda v: isinstance(v, Index), _serialize_index,
                             _deserialize_index))
