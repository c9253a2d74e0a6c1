"""Test data writers that do what Caffe2's examples do with the ``lmdb`` package."""

from __future__ import annotations

import io
from pathlib import Path

import lmdb
import numpy as np
from PIL import Image

from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


def write_lmdb_tensor_protos(path: Path, count: int, dims: tuple[int, ...] = (3, 8, 4),
                             seed: int = 0) -> list[tuple[np.ndarray, int]]:
    """lmdb_create_example.py: key ``str(j)``, TensorProtos of FLOAT data + INT32 label."""
    rng = np.random.default_rng(seed)
    env = lmdb.open(str(path), map_size=1 << 40)
    items = []
    with env.begin(write=True) as txn:
        for j in range(count):
            protos = caffe2_pb2.TensorProtos()
            data = rng.random(dims).astype(np.float32)
            image = protos.protos.add()
            image.dims.extend(dims)
            image.data_type = DT.FLOAT
            image.float_data.extend(data.reshape(-1).tolist())
            label = protos.protos.add()
            label.data_type = DT.INT32
            label.int32_data.append(j % 10)
            txn.put(str(j).encode("ascii"), protos.SerializeToString())
            items.append((data, j % 10))
    env.close()
    return items


def jpeg_bytes(pixels_rgb: np.ndarray, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels_rgb).save(buffer, format=fmt, quality=95)
    return buffer.getvalue()


def image_record(encoded: bytes, label: int, extras: list[DT] | None = None) -> bytes:
    """image_input_op_test.py: STRING image proto + INT32 label (+ extra protos)."""
    protos = caffe2_pb2.TensorProtos()
    image = protos.protos.add()
    image.data_type = DT.STRING
    image.dims.append(1)
    image.string_data.append(encoded)
    label_proto = protos.protos.add()
    label_proto.data_type = DT.INT32
    label_proto.int32_data.append(label)
    for extra in extras or []:
        protos.protos.add().CopyFrom(extra)
    return protos.SerializeToString()


def write_lmdb(path: Path, values: list[bytes]) -> None:
    env = lmdb.open(str(path), map_size=1 << 40)
    with env.begin(write=True) as txn:
        for j, value in enumerate(values):
            txn.put(str(j).encode("ascii"), value)
    env.close()
