"""Benchmark: Parallelize a ResNet-50 training model (momentum SGD) on 1..64 devices.

Prints one JSON object: per device count, the median Parallelize wall and CPU time (the whole
call: forward builders or clones, backward pass, all-reduce, updates, sync), the output op
count (net + param init net), the time per output op, and the protobuf ``CopyFrom`` time of
the same output NetDefs (the floor: copying the result); plus, for 16 devices, the time of
each pass.  Targets (issue 14): 16 devices <= 0.4 s and <= 30x the CopyFrom floor; time
per output op flat from 2 to 64 devices (max/min <= 1.2).  The machine may be shared:
medians of ``--repeat`` runs (small configurations run more, until they took
``MIN_SECONDS``; ``runs_s`` lists the first ten), and CPU time next to wall time.

    python bench/parallelize.py [--devices 1 2 4 16 64] [--repeat 3] [--gpu]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import time
from collections import defaultdict
from typing import Any

from dpgraph import brew, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.parallel import passes
from dpgraph.proto import caffe2_pb2

STAGES = [(3, 64, 256, 1), (4, 128, 512, 2), (6, 256, 1024, 2), (3, 512, 2048, 2)]
TARGET_16_S = 0.4
TARGET_COPY_RATIO = 30.0
TARGET_SPREAD = 1.2


def conv_bn(model: Any, blob: Any, name: str, dim_in: int, dim_out: int, kernel: int,
            stride: int = 1, relu: bool = True) -> Any:
    pad = (kernel - 1) // 2
    blob = brew.conv(model, blob, name, dim_in, dim_out, kernel, stride=stride, pad=pad,
                     no_bias=1)
    blob = brew.spatial_bn(model, blob, name + "_bn", dim_out, epsilon=1e-5, is_test=False)
    return brew.relu(model, blob, blob) if relu else blob


def bottleneck(model: Any, blob: Any, prefix: str, dim_in: int, dim_mid: int,
               dim_out: int, stride: int) -> Any:
    branch = conv_bn(model, blob, prefix + "_a", dim_in, dim_mid, 1, stride)
    branch = conv_bn(model, branch, prefix + "_b", dim_mid, dim_mid, 3)
    branch = conv_bn(model, branch, prefix + "_c", dim_mid, dim_out, 1, relu=False)
    if dim_in != dim_out or stride != 1:
        blob = conv_bn(model, blob, prefix + "_proj", dim_in, dim_out, 1, stride, relu=False)
    total = brew.sum(model, [branch, blob], prefix + "_sum")
    return brew.relu(model, total, total)


def resnet50_forward(model: Any, loss_scale: float) -> list[Any]:
    blob = conv_bn(model, "data", "conv1", 3, 64, 7, 2)
    blob = brew.max_pool(model, blob, "pool1", kernel=3, stride=2)
    dim_in = 64
    for stage, (blocks, dim_mid, dim_out, stride) in enumerate(STAGES, start=2):
        for block in range(blocks):
            blob = bottleneck(model, blob, f"res{stage}_{block}", dim_in, dim_mid, dim_out,
                              stride if block == 0 else 1)
            dim_in = dim_out
    blob = brew.average_pool(model, blob, "pool5", kernel=7, stride=1)
    logits = brew.fc(model, blob, "pred", 2048, 1000)
    _, loss = model.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def add_optimizer(model: Any) -> Any:
    return optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=False)


class PassTimer:
    """Seconds spent in each Parallelize pass (wraps the driver's per-pass step)."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self._original = passes._run_one

    def __enter__(self) -> PassTimer:
        def timed(pass_: Any, state: Any, debug: bool) -> None:
            start = time.perf_counter()
            self._original(pass_, state, debug)
            self.seconds[pass_.name].append(time.perf_counter() - start)

        passes._run_one = timed  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        passes._run_one = self._original  # type: ignore[assignment]


def parallelize_once(ndev: int, gpu: bool) -> tuple[float, float, Any]:
    model = model_helper.ModelHelper(name=f"resnet50_{ndev}")
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    data_parallel_model.Parallelize(model, lambda m: None, resnet50_forward,
                                    optimizer_builder_fun=add_optimizer,
                                    devices=list(range(ndev)), cpu_device=not gpu)
    return time.perf_counter() - wall, time.process_time() - cpu, model


def copy_seconds(protos: list[caffe2_pb2.NetDef], repeat: int) -> float:
    runs = []
    for _ in range(max(repeat, 21)):
        start = time.perf_counter()
        for proto in protos:
            caffe2_pb2.NetDef().CopyFrom(proto)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


#: Small configurations run until they have taken this long (at most MAX_RUNS runs), so
#: their median is not one burst of another process's load.
MIN_SECONDS = 1.0
MAX_RUNS = 40


def measure(ndev: int, gpu: bool, repeat: int) -> dict[str, Any]:
    walls, cpus = [], []
    model = None
    while len(walls) < repeat or (sum(walls) < MIN_SECONDS and len(walls) < MAX_RUNS):
        wall, cpu, model = parallelize_once(ndev, gpu)
        walls.append(wall)
        cpus.append(cpu)
    assert model is not None
    protos = [model.net.Proto(), model.param_init_net.Proto()]
    ops = sum(len(p.op) for p in protos)
    seconds = statistics.median(walls)
    floor = copy_seconds(protos, repeat)
    return {"devices": ndev, "parallelize_s": round(seconds, 4),
            "parallelize_cpu_s": round(statistics.median(cpus), 4),
            "runs": len(walls), "runs_s": [round(w, 4) for w in walls[:10]],
            "output_ops": ops,
            "net_ops": len(protos[0].op), "init_ops": len(protos[1].op),
            "us_per_output_op": round(1e6 * seconds / ops, 2),
            "us_per_output_op_cpu": round(1e6 * statistics.median(cpus) / ops, 2),
            "copyfrom_s": round(floor, 5), "ratio_to_copyfrom": round(seconds / floor, 1)}


def pass_breakdown(gpu: bool, repeat: int) -> dict[str, float]:
    """Per pass, the median over runs of its seconds in one Parallelize call (a pass the
    pipeline runs twice, such as ``_infer_devices``, counts both times)."""
    per_run: list[dict[str, float]] = []
    for _ in range(repeat):
        with PassTimer() as timer:
            parallelize_once(16, gpu)
        per_run.append({name: sum(times) for name, times in timer.seconds.items()})
    names = {name for run in per_run for name in run}
    medians = {name: statistics.median(run.get(name, 0.0) for run in per_run)
               for name in names}
    return {name: round(seconds, 4)
            for name, seconds in sorted(medians.items(), key=lambda kv: -kv[1])}


def _spread(values: list[float]) -> float | None:
    return round(max(values) / min(values), 2) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    parser.add_argument("--repeat", type=int, default=3, help="median of N runs")
    parser.add_argument("--gpu", action="store_true", help="virtual GPUs instead of CPUs")
    parser.add_argument("--no-passes", action="store_true",
                        help="skip the per-pass breakdown for 16 devices")
    args = parser.parse_args(argv)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # restored after: main() also runs inside pytest
    try:
        print(json.dumps(_run(args), indent=2))
    finally:
        logging.disable(previous)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.gpu:
        workspace.SetVirtualGpus(max(args.devices))
    parallelize_once(2, args.gpu)  # warm up imports and registries
    load_before = os.getloadavg()
    rows = [measure(ndev, args.gpu, args.repeat) for ndev in args.devices]
    multi = [r for r in rows if r["devices"] >= 2]
    row16 = next((r for r in rows if r["devices"] == 16), None)
    spread = _spread([r["us_per_output_op"] for r in multi])
    result: dict[str, Any] = {
        "benchmark": "parallelize_resnet50",
        "device_type": "gpu (virtual)" if args.gpu else "cpu",
        "python": platform.python_version(), "repeat": args.repeat,
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()],
                                "cpus": os.cpu_count()},
        "results": rows,
        "per_op_spread_2_to_64": spread,
        "per_op_spread_2_to_64_cpu": _spread([r["us_per_output_op_cpu"] for r in multi]),
        "targets": {"16_devices_s": TARGET_16_S, "ratio_to_copyfrom": TARGET_COPY_RATIO,
                    "per_op_spread": TARGET_SPREAD},
        "meets": {
            "16_devices_s": None if row16 is None else row16["parallelize_s"] <= TARGET_16_S,
            "ratio_to_copyfrom": None if row16 is None
            else row16["ratio_to_copyfrom"] <= TARGET_COPY_RATIO,
            "per_op_spread": None if spread is None else spread <= TARGET_SPREAD,
        },
    }
    if not args.no_passes and row16 is not None:
        result["passes_16_devices_s"] = pass_breakdown(args.gpu, args.repeat)
    return result


if __name__ == "__main__":
    main()
