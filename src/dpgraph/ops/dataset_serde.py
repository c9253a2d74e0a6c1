"""Caffe2's TreeCursor serializer (type ``std::unique_ptr<TreeCursor>``): the cursor's
offsets as an INT64 TensorProto in ``BlobProto.tensor`` (left out while the cursor has none)
and its field names, each followed by a space, in ``BlobProto.content``.  This lets
checkpoints Save and Load dataset cursors as Caffe2 does."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.blob_serde import (
    TypeSerializer,
    register_type,
    tensor_chunk,
    tensor_proto_to_numpy,
)
from dpgraph.ops.dataset import TreeCursor

TREE_CURSOR_TYPE = "std::unique_ptr<TreeCursor>"


def _serialize(name: str, cursor: TreeCursor) -> tuple[Any, bytes]:
    with cursor.lock:
        offsets = np.array(cursor.offsets, dtype=np.int64)
    tensor = tensor_chunk(offsets, name, 0, offsets.size) if offsets.size else None
    content = "".join(f"{field} " for field in cursor.it.fields).encode("utf-8")
    return tensor, content


def _deserialize(tensor: Any, content: bytes) -> TreeCursor:
    cursor = TreeCursor(content.decode("utf-8").split())
    if tensor is not None and len(tensor.int64_data):
        where = f"TreeCursor {tensor.name!r}"
        cursor.offsets = [int(v) for v in tensor_proto_to_numpy(tensor, where).reshape(-1)]
    return cursor


register_type(TypeSerializer(TREE_CURSOR_TYPE, lambda v: isinstance(v, TreeCursor),
                             _serialize, _deserialize, with_tensor=True))

__all__ = ["TREE_CURSOR_TYPE"]
