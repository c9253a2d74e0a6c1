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
    fails later in the batch raises in the op, and no decode thread is still at work on
    the batch."""
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
    assert decoders and not any(_decodes_rows(frames.get(ident)) for ident in decoders)
    monkeypatch.setattr(DBReader, "read_batch", read_batch)
    assert _batches(tmp_path / "db", 3, 2)[1].shape == (6, 16, 16, 3)


def test_blocked_reads_hold_no_decode_thread_another_op_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode pools are shared by size.  While ops' reads block mid-batch (DBs over blobs
    queues waiting for data), their decode helpers must not sit on pool threads: another op
    with the same decode_threads still decodes its batch."""
    import threading
    import time

    from dpgraph.db.reader import DBReader

    blocking, names = ["blocked_a", "blocked_b"], ["blocked_a", "blocked_b", "free"]
    for name in names:
        _db(tmp_path / name, 9)
    other_done = threading.Event()
    reads_block = {name: threading.Event() for name in blocking}
    reads = dict.fromkeys(blocking, 0)
    read_batch = DBReader.read_batch

    def read_waiting_for_the_other_op(self: DBReader,
                                      count: int) -> tuple[list[bytes], list[bytes]]:
        name = Path(self.source).name
        if name in reads:
            reads[name] += 1
            if reads[name] == 2:  # after the first chunk, which the helpers decode
                reads_block[name].set()
                other_done.wait(20)
        return read_batch(self, count)

    monkeypatch.setattr(DBReader, "read_batch", read_waiting_for_the_other_op)
    workspace.ResetWorkspace()
    nets = {}
    for name in names:
        workspace.RunOperatorOnce(core.CreateOperator(
            "CreateDB", [], [f"reader_{name}"], db=str(tmp_path / name), db_type="lmdb"))
        net = core.Net(f"input_{name}")
        net.ImageInput([f"reader_{name}"], [f"data_{name}", f"label_{name}"], batch_size=6,
                       scale=20, crop=16, is_test=1, decode_threads=3, no_prefetch=1)
        workspace.CreateNet(net)
        nets[name] = net
    blocked = [threading.Thread(target=workspace.RunNet, args=(nets[name],))
               for name in blocking]
    for thread in blocked:
        thread.start()
    assert all(event.wait(20) for event in reads_block.values())
    time.sleep(0.2)  # their helpers are done with the first chunks
    start = time.monotonic()
    workspace.RunNet(nets["free"])
    took = time.monotonic() - start
    other_done.set()
    for thread in blocked:
        thread.join(30)
    assert took < 10, f"the other op waited {took:.1f} s for the blocked ops' decode helpers"
    for name in names:
        assert workspace.FetchBlob(f"data_{name}").shape == (6, 16, 16, 3)


def _decodes_rows(frame: object) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "_rows":  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False
