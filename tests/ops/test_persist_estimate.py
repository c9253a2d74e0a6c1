"""EstimateAllBlobSizes (Caffe2 2021): every workspace blob and its estimated serialized
size, Caffe2's formula (per-chunk overhead 50 + name, item sizes), and estimates that stay
close to what Save really writes."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.ir.blob_serde import FLOAT_BFLOAT16, KEY_SEPARATOR
from dpgraph.ir.blob_size import HAS_BFLOAT16, estimate_blob_size, item_size


@pytest.fixture(autouse=True)
def _fresh() -> None:
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _options(regex: str, chunk_size: int, float_format: int) -> bytes:
    """A SerializationOptions message's wire bytes (one entry), built by hand."""
    entry = (b"\x0a" + bytes([len(regex)]) + regex.encode()
             + b"\x10" + bytes([chunk_size & 0x7F | 0x80, chunk_size >> 7])
             + b"\x18" + bytes([float_format]))
    return b"\x0a" + bytes([len(entry)]) + entry


def _estimate(**kwargs: object) -> dict[str, int]:
    workspace.RunOperatorOnce(core.CreateOperator(
        "EstimateAllBlobSizes", [], ["blob_names", "blob_sizes"], **kwargs))
    names = workspace.FetchBlob("blob_names")
    sizes = workspace.FetchBlob("blob_sizes")
    assert sizes.dtype == np.int64 and names.shape == sizes.shape
    return {n.decode("utf-8"): int(s) for n, s in zip(names, sizes)}


def _minidb_sizes(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with path.open("rb") as handle:
        while header := handle.read(8):
            key_len, value_len = struct.unpack("=ii", header)
            key = handle.read(key_len).decode()
            handle.seek(value_len, 1)
            name = key.rsplit(KEY_SEPARATOR, 1)[0]
            out[name] = out.get(name, 0) + value_len
    return out


def test_caffe2_formula_and_outputs_included() -> None:
    data = np.random.random_sample(4000).astype(np.float32)
    workspace.FeedBlob("float1", data)
    workspace.FeedBlob("float2", data)
    workspace.FeedBlob("ui16", np.arange(1024, dtype=np.uint16))
    sizes = _estimate(options=_options("float1", 500, FLOAT_BFLOAT16))
    assert set(sizes) == {"float1", "float2", "ui16", "blob_names", "blob_sizes"}
    assert sizes["float2"] == 1 * (6 + 50) + 4000 * 4
    assert sizes["ui16"] == 1 * (4 + 50) + 1024 * 3
    assert sizes["float1"] == 8 * (6 + 50) + 4000 * (2 if HAS_BFLOAT16 else 4)
    assert sizes["blob_names"] == 10 + 50 + 5 * 50  # a string tensor of the 5 names
    assert sizes["blob_sizes"] == 10 + 50 + 5 * 8


def test_empty_string_and_dtype_items() -> None:
    workspace.FeedBlob("text", b"hello")
    workspace.CreateBlob("empty")
    sizes = _estimate()
    assert sizes["empty"] == 0
    assert sizes["text"] == len(workspace.SerializeBlob("text"))
    assert item_size(np.float64) == 8 and item_size(np.int32) == 4
    assert item_size(np.float16) == 3 and item_size(np.int8) == 2
    assert estimate_blob_size("x", np.zeros(0, np.float32)) == 0  # no chunk at all
    assert estimate_blob_size("x", np.zeros(3, np.float32)) == 1 + 50 + 12


def test_estimates_close_to_saved_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    blobs = {"f32": rng.random(3000).astype(np.float32),
             "f64": rng.random(500),
             "u16": rng.integers(0, 0xFFFF, 900).astype(np.uint16)}
    for name, value in blobs.items():
        workspace.FeedBlob(name, value)
    estimated = _estimate()
    path = tmp_path / "db"
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", list(blobs), [], db=str(path), db_type="minidb", absolute_path=1))
    saved = _minidb_sizes(path)
    for name in blobs:
        difference = abs(estimated[name] - saved[name])
        assert difference <= 100 or difference / saved[name] < 0.25, (name, estimated, saved)
