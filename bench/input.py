"""Input pipeline benchmark: ImageInput and TensorProtosDBInput against plain Python loops.

Prints ONE JSON object.  Figures (the best of alternating rounds in one process, which is
the least disturbed by other load on the machine; ``median_*`` give the medians):

* ``image_input``: images/s of the ``ImageInput`` op (256x256 JPEGs in an LMDB, training
  mode: scale 256, random 224 crops, mirror, mean/std, batch 32) with ``decode_threads`` 1
  and 2, against a plain Pillow decode + resize + crop loop in one thread over the same
  JPEG bytes.  Targets: ``ratio_1_thread`` >= 0.9 and ``ratio_2_threads`` >= 1.6 (on 2 free
  cores).  The op decodes with OpenCV (as Caffe2 does) and also writes float32
  (``(v - mean) / std``, 600 KB per image), which the loop does not.  For context on a
  shared machine: ``cpu_ratio_1_thread`` compares images per CPU-second of the process
  (what each side costs, whatever the other load), and
  ``pillow_loop_2_threads_images_per_s`` / ``pillow_2_thread_scaling`` show what two plain
  Pillow threads reach on this machine in the same run.
* ``tensor_protos_db_input``: records/s of ``TensorProtosDBInput`` (lmdb_create_example's
  records: FLOAT [3, 64, 32] + INT32 label, batch 32) against a raw ``lmdb`` cursor +
  ``TensorProtos.ParseFromString`` loop.  Target: ``ratio`` >= 0.8.  The op prefetches by
  default (one batch ahead; here, where the net does nothing else, the op reads it in the
  caller's thread, having nothing to overlap it with); ``*_no_prefetch`` is the op with
  ``no_prefetch=1``, reading each batch when it is due, as the raw loop does.

Every side gets a warm-up first, and the batch the op prefetches past the timed ones is
finished before the next measurement starts, so it does not slow that one down.

Run: ``python bench/input.py [--images 768] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import lmdb
import numpy as np
from PIL import Image

from dpgraph import core, workspace
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto
BATCH, SIDE, CROP = 32, 256, 224


def _jpegs(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    for _ in range(count):
        base = np.stack([(x * rng.uniform(0.2, 1) + y * rng.uniform(0.2, 1)) % 256
                         for _ in range(3)], axis=-1)
        noise = rng.integers(0, 40, (SIDE, SIDE, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(
            buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def _write(path: str, values: list[bytes]) -> None:
    env = lmdb.open(path, map_size=1 << 40)
    with env.begin(write=True) as txn:
        for j, value in enumerate(values):
            txn.put(str(j).encode("ascii"), value)
    env.close()


def _image_records(jpegs: list[bytes]) -> list[bytes]:
    records = []
    for j, data in enumerate(jpegs):
        protos = caffe2_pb2.TensorProtos()
        image = protos.protos.add(data_type=DT.STRING, dims=[1])
        image.string_data.append(data)
        protos.protos.add(data_type=DT.INT32, int32_data=[j % 10])
        records.append(protos.SerializeToString())
    return records


class Rate:
    """Items per wall second and per CPU second of the whole process (all its threads)."""

    def __init__(self, items: int) -> None:
        self.items = items
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        return self.items / wall, self.items / max(cpu, 1e-9)


def _pillow_images(jpegs: list[bytes], rng: np.random.Generator) -> None:
    """A plain decode + resize (shorter side 256) + random crop loop."""
    for data in jpegs:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        width, height = image.size
        if min(width, height) != SIDE:
            scale = SIDE / min(width, height)
            image = image.resize((round(width * scale), round(height * scale)),
                                 Image.Resampling.BOX)
        x = int(rng.integers(0, image.size[0] - CROP + 1))
        y = int(rng.integers(0, image.size[1] - CROP + 1))
        np.asarray(image.crop((x, y, x + CROP, y + CROP)))


def pillow_loop(jpegs: list[bytes], rng: np.random.Generator) -> tuple[float, float]:
    """(images/s, images per CPU-second) of the plain loop in one thread."""
    _pillow_images(jpegs[:4], rng)  # warm-up
    rate = Rate(len(jpegs))
    _pillow_images(jpegs, rng)
    return rate.stop()


def pillow_loop_threads(jpegs: list[bytes], threads: int) -> float:
    """images/s of ``threads`` plain loops, each over its share of the images."""
    shares = [jpegs[t::threads] for t in range(threads)]
    workers = [threading.Thread(target=_pillow_images, args=(share, np.random.default_rng(t)))
               for t, share in enumerate(shares)]
    rate = Rate(len(jpegs))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return rate.stop()[0]


def image_input_rate(db: str, threads: int, batches: int) -> tuple[float, float]:
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["reader"], db=db,
                                                  db_type="lmdb"))
    net = core.Net(f"image_input_{threads}")
    net.ImageInput(["reader"], ["data", "label"], batch_size=BATCH, scale=SIDE, crop=CROP,
                   mirror=1, mean=128.0, std=64.0, is_test=0, decode_threads=threads)
    workspace.CreateNet(net)
    workspace.RunNet(net)  # warm-up: delivers one batch and starts the prefetch of the next
    rate = Rate(batches * BATCH)
    workspace.RunNet(net, batches)
    result = rate.stop()
    workspace.ResetWorkspace()  # destroys the op: waits for its prefetch and drops it
    return result


def _tensor_records(count: int) -> list[bytes]:
    rng = np.random.default_rng(1)
    records = []
    for j in range(count):
        protos = caffe2_pb2.TensorProtos()
        data = protos.protos.add(data_type=DT.FLOAT, dims=[3, 64, 32])
        data.float_data.extend(rng.random(3 * 64 * 32).astype(np.float32).tolist())
        protos.protos.add(data_type=DT.INT32, int32_data=[j % 10])
        records.append(protos.SerializeToString())
    return records


WARMUP_BATCHES = 2  # the first batches of a process pay page faults for fresh buffers


def raw_lmdb_loop(db: str, passes: int) -> float:
    """records/s of a raw cursor + ``ParseFromString`` loop over ``passes`` passes (after
    ``WARMUP_BATCHES`` batches of records, untimed, like the op's warm-up)."""
    env = lmdb.open(db, readonly=True, lock=False)
    with env.begin() as txn:
        for _, (_, value) in zip(range(WARMUP_BATCHES * BATCH), txn.cursor()):
            caffe2_pb2.TensorProtos().ParseFromString(value)
        count = 0
        start = time.perf_counter()
        for _ in range(passes):
            for _, value in txn.cursor():
                caffe2_pb2.TensorProtos().ParseFromString(value)
                count += 1
        rate = count / (time.perf_counter() - start)
    env.close()
    return rate


def db_input_rate(db: str, records: int, passes: int, no_prefetch: int = 0) -> float:
    """records/s of ``TensorProtosDBInput`` (batch ``BATCH``) over ``passes`` passes, after
    ``WARMUP_BATCHES`` untimed batches."""
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["reader"], db=db,
                                                  db_type="lmdb"))
    net = core.Net("db_input")
    net.TensorProtosDBInput(["reader"], ["data", "label"], batch_size=BATCH,
                            no_prefetch=no_prefetch)
    workspace.CreateNet(net)
    workspace.RunNet(net, WARMUP_BATCHES)
    runs = passes * records // BATCH
    start = time.perf_counter()
    workspace.RunNet(net, runs)
    rate = runs * BATCH / (time.perf_counter() - start)
    workspace.ResetWorkspace()  # closes the reader (py-lmdb opens an environment once)
    return rate


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=768)  # 24 batches a round
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="dpgraph_bench_input_")
    jpegs = _jpegs(args.images)
    image_db, tensor_db = os.path.join(workdir, "images"), os.path.join(workdir, "tensors")
    _write(image_db, _image_records(jpegs))
    _write(tensor_db, _tensor_records(args.records))
    rng = np.random.default_rng(0)
    batches = max(1, args.images // BATCH)
    load_before = os.getloadavg()[0]
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, measure in (("pillow", lambda: pillow_loop(jpegs, rng)),
                              ("t1", lambda: image_input_rate(image_db, 1, batches)),
                              ("pillow2", lambda: (pillow_loop_threads(jpegs, 2), 0.0)),
                              ("t2", lambda: image_input_rate(image_db, 2, batches))):
            wall, cpu = measure()
            rates.setdefault(name, []).append(wall)
            rates.setdefault(name + "_cpu", []).append(cpu)
        rates.setdefault("raw", []).append(raw_lmdb_loop(tensor_db, 2))
        rates.setdefault("op", []).append(db_input_rate(tensor_db, args.records, 2))
        rates.setdefault("op_sync", []).append(db_input_rate(tensor_db, args.records, 2, 1))
    best = {k: max(v) for k, v in rates.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "benchmark": "input",
        "cpu_count": os.cpu_count(),
        "image_input": {
            "images": args.images, "batch_size": BATCH, "jpeg_side": SIDE, "crop": CROP,
            "pillow_loop_images_per_s": round(best["pillow"], 1),
            "decode_threads_1_images_per_s": round(best["t1"], 1),
            "decode_threads_2_images_per_s": round(best["t2"], 1),
            "ratio_1_thread": round(best["t1"] / best["pillow"], 3),
            "ratio_2_threads": round(best["t2"] / best["pillow"], 3),
            "median_ratio_1_thread": round(med["t1"] / med["pillow"], 3),
            "median_ratio_2_threads": round(med["t2"] / med["pillow"], 3),
            "cpu_ratio_1_thread": round(med["t1_cpu"] / med["pillow_cpu"], 3),
            "pillow_loop_2_threads_images_per_s": round(best["pillow2"], 1),
            "pillow_2_thread_scaling": round(best["pillow2"] / best["pillow"], 3),
            "ratio_2_threads_to_pillow_2_threads": round(best["t2"] / best["pillow2"], 3),
            "targets": {"ratio_1_thread": 0.9, "ratio_2_threads": 1.6},
        },
        "tensor_protos_db_input": {
            "records": args.records, "batch_size": BATCH, "record_dims": [3, 64, 32],
            "raw_lmdb_parse_records_per_s": round(best["raw"], 1),
            "op_records_per_s": round(best["op"], 1),
            "ratio": round(best["op"] / best["raw"], 3),
            "median_ratio": round(med["op"] / med["raw"], 3),
            "op_no_prefetch_records_per_s": round(best["op_sync"], 1),
            "ratio_no_prefetch": round(best["op_sync"] / best["raw"], 3),
            "median_ratio_no_prefetch": round(med["op_sync"] / med["raw"], 3),
            "target": 0.8,
        },
        "rounds": args.rounds,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
