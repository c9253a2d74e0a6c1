"""ImageInput's decode threads: the batch does not depend on how many threads decode it,
and a bad record on one thread stops the batch with a typed error and leaves no thread
writing into the batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _records import image_record, jpeg_bytes, write_lmdb

from dpgraph import core, workspace
from dpgraph.errors import DataInputError
from dpgraph.proto import caffe2_pb2


def _db(path: Path, count: int, bad: int | None = None) -> None:
    rng = np.random.default_rng(1)
    records = [image_record(jpeg_bytes(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
                                       "PNG"), j) for j in range(count)]
    if bad is not None:  # a FLOAT16 label: not a label type ImageInput accepts
        protos = caffe2_pb2.TensorProtos.FromString(records[bad])
        protos.protos[1].data_type = caffe2_pb2.TensorProto.FLOAT16
        records[bad] = protos.SerializeToString()
    write_lmdb(path, records)


def _batches(path: Path, threads: int, runs: int, **kwargs: object) -> list[np.ndarray]:
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["reader"], db=str(path),
                                                  db_type="lmdb"))
    op = core.CreateOperator("ImageInput", ["reader"], ["data", "label"], batch_size=6,
                             scale=20, crop=16, mirror=1, is_test=0, decode_threads=threads,
                             device_option=core.DeviceOption(caffe2_pb2.CPU, 0,
                                                             random_seed=11), **kwargs)
    net = core.Net(f"input_{threads}")
    net.Proto().op.extend([op])
    workspace.CreateNet(net)
    out = []
    for _ in range(runs):
        workspace.RunNet(net)
        out.append(workspace.FetchBlob("data").copy())
    return out


def test_batches_do_not_depend_on_the_thread_count(tmp_path: Path) -> None:
    _db(tmp_path / "db", 9)
    one = _batches(tmp_path / "db", 1, 3)
    for threads in (2, 4):
        for a, b in zip(one, _batches(tmp_path / "db", threads, 3)):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(one[0][0], one[2][0])  # record 0 again, other draws


def test_bad_record_on_one_thread_fails_the_batch(tmp_path: Path) -> None:
    _db(tmp_path / "db", 6, bad=4)
    with pytest.raises(DataInputError, match=r"key b'4' \(record 4 of the batch\): the label"):
        _batches(tmp_path / "db", 3, 1, no_prefetch=1)
    _db(tmp_path / "good", 6)
    assert _batches(tmp_path / "good", 3, 2)[1].shape == (6, 16, 16, 3)


def test_a_read_failing_mid_batch_stops_the_decode_threads(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Decode threads start on the first records while the rest are read; a read that
    fails later in the batch raises in the op, and no decode thread is left waiting."""
    import sys
    import threading

    from dpgraph.db.reader import DBReader
    from dpgraph.errors import DBError

    _db(tmp_path / "db", 9)
    calls = {"count": 0}
    read_batch = DBReader.read_batch

    def failing_second_read(self: DBReader, count: int) -> tuple[list[bytes], list[bytes]]:
        calls["count"] += 1
        if calls["count"] == 2:
            raise DBError("the disk went away")
        return read_batch(self, count)

    monkeypatch.setattr(DBReader, "read_batch", failing_second_read)
    with pytest.raises(DBError, match="the disk went away"):
        _batches(tmp_path / "db", 3, 1, no_prefetch=1)
    frames = sys._current_frames()
    decoders = [t.ident for t in threading.enumerate() if t.name.startswith("dpgraph-decode")]
    assert decoders and not any(_waits_for_rows(frames.get(ident)) for ident in decoders)
    monkeypatch.setattr(DBReader, "read_batch", read_batch)
    assert _batches(tmp_path / "db", 3, 2)[1].shape == (6, 16, 16, 3)


def _waits_for_rows(frame: object) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "take":  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False
