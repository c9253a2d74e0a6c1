"""Fuzz targets shared by ``tests/fuzz`` (a bounded hypothesis subset) and ``bench/fuzz.py``.

Each *byte target* takes raw bytes (a file or record as an attacker could shape it) and runs
them through one of dpgraph's public loaders; each *net target* takes a random valid net
(:func:`random_net`).  The property everywhere: the call returns a correct result or raises
a typed :class:`dpgraph.errors.DpgraphError`; any other exception is a bug (the callers
check, see :func:`outcome`).  Seeds (valid inputs to mutate) come from :func:`seeds`.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpgraph.errors import DpgraphError

_TMP = Path(tempfile.mkdtemp(prefix="dpgraph-fuzz-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


def _file(name: str, data: bytes) -> str:
    path = _TMP / f"{os.getpid()}-{name}"
    path.write_bytes(data)
    return str(path)


# --- seeds ------------------------------------------------------------------------------------
def _seed_net() -> Any:
    from dpgraph import core

    net = core.Net("seed")
    net.FC(["x", "w", "b"], "h")
    net.Relu("h", "r")
    net.Softmax("r", "y", axis=1)
    net.Proto().external_input.extend(["x", "w", "b"])
    net.Proto().external_output.append("y")
    return net.Proto()


def _seed_tensors() -> Any:
    from dpgraph.ir.blob_serde import numpy_to_tensor_proto
    from dpgraph.proto import caffe2_pb2

    protos = caffe2_pb2.TensorProtos()
    protos.protos.extend([numpy_to_tensor_proto(np.arange(6, dtype=np.float32).reshape(2, 3)),
                          numpy_to_tensor_proto(np.array([7], np.int32)),
                          numpy_to_tensor_proto(np.array([1.5, 2.5], np.float64))])
    return protos


def _seed_plan() -> Any:
    from dpgraph.proto import caffe2_pb2

    plan = caffe2_pb2.PlanDef(name="plan")
    plan.network.add().CopyFrom(_seed_net())
    step = plan.execution_step.add(name="step", num_iter=2)
    step.network.append("seed")
    return plan


def _seed_meta() -> Any:
    from dpgraph.export import metanet
    from dpgraph.proto import metanet_pb2

    meta = metanet_pb2.MetaNetDef()
    metanet.AddNet(meta, "predict", _seed_net())
    metanet.AddBlobs(meta, "inputs", ["x"])
    metanet.SetBlobsOrder(meta, ["w", "b"])
    return meta


def _minidb_bytes(records: list[tuple[bytes, bytes]]) -> bytes:
    from dpgraph.db.minidb import HEADER

    return b"".join(HEADER.pack(len(k), len(v)) + k + v for k, v in records)


def _seed_save_db() -> bytes:
    """A minidb as ``Save`` writes it (BlobProto records)."""
    from dpgraph.ir.blob_serde import serialize_blob

    return _minidb_bytes([(b"w", serialize_blob("w", np.ones((2, 3), np.float32))),
                          (b"n", serialize_blob("n", np.array([3, 4], np.int64))),
                          (b"s", serialize_blob("s", np.array([b"ab"], object)))])


def _seed_checkpoint() -> bytes:
    from dpgraph.checkpoint import save_checkpoint
    from dpgraph.runtime import Workspace

    ws = Workspace("fuzz-seed", seed=0)
    ws.feed_blob("w", np.arange(4, dtype=np.float32))
    ws.feed_blob("it", np.array([5], np.int64))
    path = _TMP / "seed.ckpt"
    save_checkpoint(path, ["w", "it"], workspace=ws)
    return path.read_bytes()


def _seed_lmdb() -> bytes:
    """The ``data.mdb`` of a small LMDB written through dpgraph (TensorProtos records)."""
    from dpgraph.db import Mode, open_db

    path = _TMP / "seed.lmdb"
    db = open_db("lmdb", str(path), Mode.new)
    txn = db.new_transaction()
    for i in range(20):
        txn.put(f"{i:04d}".encode(), _seed_tensors().SerializeToString())
    txn.commit()
    del txn
    db.close()
    return (path / "data.mdb").read_bytes()


def seeds() -> dict[str, bytes]:
    """A valid input of each byte target, to mutate."""
    from dpgraph.ir.text import format_net

    tensors = _seed_tensors().SerializeToString()
    return {
        "netdef": _seed_net().SerializeToString(),
        "plandef": _seed_plan().SerializeToString(),
        "tensorprotos": tensors,
        "metanetdef": _seed_meta().SerializeToString(),
        "text": format_net(_seed_net()).encode(),
        "lmdb": _seed_lmdb(),
        "minidb": _minidb_bytes([(b"k1", tensors), (b"k2", b"v")]),
        "db_load": _seed_save_db(),
        "checkpoint": _seed_checkpoint(),
        "predictor_db": _seed_meta().SerializeToString(),
    }


def _predictor_db(meta: bytes) -> bytes:
    """A minidb as ``predictor_exporter.save_to_db`` writes it, holding MetaNetDef ``meta``."""
    from dpgraph.ir.blob_serde import serialize_blob

    return _minidb_bytes([(b"!!META_NET_DEF", serialize_blob("!!META_NET_DEF", meta))])


# --- mutations --------------------------------------------------------------------------------
def mutate(data: bytes, rng: random.Random) -> bytes:
    """Truncate, bit-flip, overwrite, splice or replace ``data`` (one random strategy)."""
    kind = rng.randrange(6)
    if kind == 0 or not data:  # random bytes
        return rng.randbytes(rng.randrange(0, 64))
    if kind == 1:  # truncation
        return data[:rng.randrange(len(data))]
    buf = bytearray(data)
    if kind == 2:  # bit flips
        for _ in range(rng.randrange(1, 5)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 3:  # overwritten bytes (lengths, tags)
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
    elif kind == 4:  # a random chunk inserted
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.randbytes(rng.randrange(1, 16))
    else:  # a slice duplicated or removed
        a, b = sorted(rng.randrange(len(buf) + 1) for _ in range(2))
        buf[a:b] = buf[a:b] * rng.randrange(0, 3)
    return bytes(buf)


_TEXT_PIECES = ["{", "}", '"', "->", "[", "]", "\n", " ", "op", "net", "input", "output", "#",
                '{"args": 5}', '{"args": [["a"]]}', '{"args": [["a", {"net": 1}]]}',
                '{"device": []}', '{"device": {"type": "x"}}', '{"name": 3}', '{"grad": "x"}',
                '{"ctrl": [1]}', '{"num_workers": -1}', '{"type": null}', '"x"', "1e999",
                '{"op_version": 99999999999999999999}', "[" * 3000, "\u0000", "\udc80"]


def mutate_text(data: bytes, rng: random.Random) -> bytes:
    """Text-aware mutation: splice format tokens and JSON fragments into ``data``."""
    if rng.random() < 0.4:
        return mutate(data, rng)
    text = data.decode("utf-8", "replace")
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(text) + 1)
        cut = at + rng.choice([0, 0, 1, rng.randrange(8)])
        text = text[:at] + rng.choice(_TEXT_PIECES) + text[cut:]
    return text.encode("utf-8", "surrogatepass")


# --- byte targets -----------------------------------------------------------------------------
def non_text_field(message: Any, path: str = "") -> str | None:
    """The first ``string`` field of ``message`` holding bytes (protobuf returns invalid
    UTF-8 that way); a loader must refuse those, names and types are text."""
    for fd, value in message.ListFields():
        where = f"{path}{fd.name}"
        items = list(value) if fd.is_repeated else [value]
        if fd.type == fd.TYPE_STRING and any(isinstance(v, bytes) for v in items):
            return where
        if fd.type == fd.TYPE_MESSAGE:
            for index, item in enumerate(items):
                found = non_text_field(item, f"{where}[{index}]." if fd.is_repeated else
                                       f"{where}.")
                if found:
                    return found
    return None


def _text_only(message: Any) -> Any:
    found = non_text_field(message)
    assert found is None, f"the loader returned bytes in string field {found}"
    return message


def t_netdef(data: bytes) -> None:
    """``parse_proto(NetDef)`` then the verifier and the text format on what parsed."""
    from dpgraph.ir.proto_io import parse_proto, read_proto
    from dpgraph.ir.text import format_net, parse_net
    from dpgraph.ir.verify import verify_problems
    from dpgraph.proto import caffe2_pb2

    net = _text_only(read_proto(caffe2_pb2.NetDef, _file("net.pb", data)))
    assert net == parse_proto(caffe2_pb2.NetDef, data)
    verify_problems(net)
    text = format_net(net)
    again = parse_net(text)
    assert format_net(again) == text, "text format round trip changed the net"


def t_plandef(data: bytes) -> None:
    from dpgraph.ir.proto_io import parse_proto
    from dpgraph.ir.verify import verify_problems
    from dpgraph.proto import caffe2_pb2

    plan = _text_only(parse_proto(caffe2_pb2.PlanDef, data))
    for net in plan.network:
        verify_problems(net)


def t_tensorprotos(data: bytes) -> None:
    """The fast wire decoder and the protobuf path must agree (or both refuse)."""
    from dpgraph.ir.blob_serde import decode_tensor_protos, tensor_proto_to_numpy
    from dpgraph.ir.proto_io import parse_proto
    from dpgraph.proto import caffe2_pb2

    fast = decode_tensor_protos(data, "fuzz")
    protos = _text_only(parse_proto(caffe2_pb2.TensorProtos, data))
    slow = [tensor_proto_to_numpy(p, f"fuzz proto {i}") for i, p in enumerate(protos.protos)]
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a, b)


def t_metanetdef(data: bytes) -> None:
    from dpgraph.export import metanet
    from dpgraph.ir.proto_io import parse_proto
    from dpgraph.proto import metanet_pb2

    meta = _text_only(parse_proto(metanet_pb2.MetaNetDef, data))
    metanet.GetBlobsOrder(meta)
    for kv in meta.nets:
        metanet.GetNet(meta, kv.key)


def t_text(data: bytes) -> None:
    from dpgraph.errors import TextFormatError
    from dpgraph.ir.text import format_net, parse_net

    try:
        text = data.decode("utf-8", "surrogatepass")  # lone surrogates: JSON escapes can too
    except UnicodeDecodeError:
        return  # parse_net takes str; decoding bytes is the caller's step
    net = parse_net(text)
    try:
        assert parse_net(format_net(net)) == net
    except TextFormatError as error:
        raise AssertionError(f"format_net of a parsed net does not parse back: {error}") from None


def t_minidb(data: bytes) -> None:
    """Every record of a minidb file, through the registry's cursor."""
    from dpgraph.db import Mode, open_db

    db = open_db("minidb", _file("fuzz.minidb", data), Mode.read)
    try:
        cursor = db.new_cursor()
        total = 0
        while cursor.valid():
            total += len(cursor.key()) + len(cursor.value())
            cursor.next()
        assert total <= len(data)
        cursor.close()
    finally:
        db.close()


def t_lmdb(data: bytes) -> None:
    """Every record of an LMDB environment whose ``data.mdb`` is ``data`` (read-only)."""
    from dpgraph.db import Mode, open_db

    folder = _TMP / f"{os.getpid()}-fuzz.lmdb"
    folder.mkdir(exist_ok=True)
    (folder / "data.mdb").write_bytes(data)
    db = open_db("lmdb", str(folder), Mode.read)
    try:
        cursor = db.new_cursor()
        while cursor.valid():
            cursor.key()
            cursor.value()
            cursor.next()
        cursor.close()
    finally:
        db.close()


def t_db_load(data: bytes) -> None:
    """The ``Load`` op on a minidb file (BlobProto records, chunks, strings)."""
    from dpgraph.core import CreateOperator
    from dpgraph.runtime import Workspace

    ws = Workspace("fuzz-load", seed=0)
    ws.run_operators_once([CreateOperator("Load", [], [], db=_file("load.minidb", data),
                                          db_type="minidb", absolute_path=True, load_all=True)])


def t_checkpoint(data: bytes) -> None:
    from dpgraph.checkpoint import read_checkpoint

    read_checkpoint(_file("fuzz.ckpt", data))


def t_predictor_db(data: bytes) -> None:
    """``predictor_exporter``'s reader of a (well-framed) minidb whose ``!!META_NET_DEF``
    record holds the MetaNetDef bytes ``data``."""
    from dpgraph.export import metanet
    from dpgraph.export.predictor_exporter import read_meta_net_def
    from dpgraph.runtime import Workspace

    ws = Workspace("fuzz-predictor", seed=0)
    meta = read_meta_net_def(ws, _file("predictor.minidb", _predictor_db(data)), "minidb")
    _text_only(meta)
    for kv in meta.nets:
        metanet.GetNet(meta, kv.key)


#: A target-specific mutator (default :func:`mutate`).
MUTATORS: dict[str, Callable[[bytes, random.Random], bytes]] = {"text": mutate_text}

BYTE_TARGETS: dict[str, Callable[[bytes], None]] = {
    "netdef": t_netdef, "plandef": t_plandef, "tensorprotos": t_tensorprotos,
    "metanetdef": t_metanetdef, "text": t_text, "minidb": t_minidb, "lmdb": t_lmdb,
    "db_load": t_db_load, "checkpoint": t_checkpoint, "predictor_db": t_predictor_db,
}


# --- random valid nets ------------------------------------------------------------------------
_UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Negative", "Softplus", "Copy", "Sqr"]


@dataclass
class RandomNet:
    """A valid predict net over input ``x`` [batch, width], its parameters and shapes."""

    predict: Any
    params: dict[str, np.ndarray]
    batch: int
    width: int
    ops: list[str] = field(default_factory=list)


def random_net(rng: random.Random) -> RandomNet:
    """A chain of FC / unary / binary / Softmax / Concat ops on ``x``."""
    from dpgraph import core

    batch, width = rng.randrange(1, 4), rng.randrange(1, 5)
    net = core.Net(f"rand{rng.randrange(10**6)}")
    params: dict[str, np.ndarray] = {}
    gen = np.random.default_rng(rng.randrange(2**32))
    blobs = [("x", width)]
    for i in range(rng.randrange(1, 7)):
        src, w = rng.choice(blobs)
        kind = rng.randrange(5)
        out = f"b{i}"
        if kind == 0:
            units = rng.randrange(1, 5)
            params[f"W{i}"] = gen.standard_normal((units, w)).astype(np.float32)
            params[f"B{i}"] = gen.standard_normal(units).astype(np.float32)
            net.FC([src, f"W{i}", f"B{i}"], out)
            w = units
        elif kind == 1:
            op = rng.choice([*_UNARY, "Scale", "LeakyRelu", "Clip"])
            extra = {"Scale": {"scale": rng.uniform(-2, 2)},
                     "LeakyRelu": {"alpha": rng.uniform(0, 0.5)},
                     "Clip": {"min": -rng.random(), "max": rng.random()}}.get(op, {})
            getattr(net, op)(src, out, **extra)
        elif kind == 2:
            same = [b for b, bw in blobs if bw == w]
            others = [rng.choice(same) for _ in range(rng.randrange(1, 3))]
            op = rng.choice(["Add", "Mul", "Sub", "Max", "Sum", "Mean"])
            getattr(net, op)([src, *(others if op in ("Sum", "Mean", "Max") else others[:1])],
                             out)
        elif kind == 3:
            net.Softmax(src, out, axis=1)
        else:
            other, ow = rng.choice(blobs)
            net.Concat([src, other], [out, f"{out}_split"], axis=1)
            w += ow
        blobs.append((out, w))
    proto = net.Proto()
    proto.external_input.extend(["x", *params])
    proto.external_output.append(blobs[-1][0])
    return RandomNet(proto, params, batch, width, [op.type for op in proto.op])


def _run_dpgraph(rnet: RandomNet, x: np.ndarray) -> np.ndarray:
    from dpgraph.runtime import Workspace

    ws = Workspace("fuzz-run", seed=0)
    for name, value in rnet.params.items():
        ws.feed_blob(name, value)
    ws.feed_blob("x", x)
    ws.run_net_once(rnet.predict)
    return np.asarray(ws.fetch_blob(rnet.predict.external_output[0]))


def t_verify(rnet: RandomNet) -> None:
    """A generated valid net verifies, and a net with an op reading an unknown blob is
    refused with VerificationError naming the blob."""
    from dpgraph.errors import VerificationError
    from dpgraph.ir.verify import verify

    verify(rnet.predict)
    broken = type(rnet.predict)()
    broken.CopyFrom(rnet.predict)
    broken.op[-1].input[0] = "never_written_blob"
    try:
        verify(broken)
    except VerificationError as error:
        assert "never_written_blob" in str(error)
    else:
        raise AssertionError("verify accepted an op reading a blob nothing writes")


def t_onnx(rnet: RandomNet) -> None:
    """The exported model passes the ONNX checker and computes what dpgraph computes."""
    import onnx

    from dpgraph.export.onnx import to_onnx

    model = to_onnx(rnet.predict, rnet.params, inputs={"x": (rnet.batch, rnet.width)})
    onnx.checker.check_model(model)
    x = np.random.default_rng(0).standard_normal((rnet.batch, rnet.width)).astype(np.float32)
    expected = _run_dpgraph(rnet, x)
    try:
        import onnxruntime
    except ImportError:
        return
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


NET_TARGETS: dict[str, Callable[[RandomNet], None]] = {"verify": t_verify, "onnx": t_onnx}


# --- outcome ----------------------------------------------------------------------------------
class Hang(AssertionError):
    """A case ran past its time limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang("hang: the case ran past its time limit")


def outcome(fn: Callable[[Any], None], case: Any, timeout: float = 10.0) -> str:
    """``"ok"`` or ``"typed"``; any other exception propagates (the property failed), and
    a case running past ``timeout`` seconds raises :class:`Hang` (main thread only)."""
    import signal
    import threading

    timed = threading.current_thread() is threading.main_thread() and timeout > 0
    if timed:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fn(case)
    except DpgraphError:
        return "typed"
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return "ok"


def outcome_isolated(fn: Callable[[Any], None], case: Any, timeout: float = 30.0) -> str:
    """:func:`outcome` in a forked child, so a crash (SIGBUS/SIGSEGV in a C library) or a
    hang is reported instead of killing the caller: raises AssertionError for those and
    for untyped exceptions."""
    import pickle
    import select
    import signal
    import traceback

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running the parent's cleanup
        import faulthandler

        faulthandler.disable()  # the parent reports the crash; no stack dump from here
        os.close(read)
        try:
            result: Any = outcome(fn, case)
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            result = ("error", "".join(traceback.format_exception(error))[-3000:])
        os.write(write, pickle.dumps(result))
        os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"hang: no result within {timeout} s")
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(f"crash: the loader killed the process with signal "
                             f"{signal.Signals(os.WTERMSIG(status)).name}")
    result = pickle.loads(b"".join(chunks))
    if isinstance(result, tuple):
        raise AssertionError(f"untyped exception:\n{result[1]}")
    return result


#: Targets whose loader runs C code on the raw file (liblmdb mmaps it): run isolated.
ISOLATED = {"lmdb"}
