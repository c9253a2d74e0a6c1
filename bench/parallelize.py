"""Benchmark: Parallelize a ResNet-50 training model on 1..64 devices.

Prints one JSON object: per device count, the Parallelize wall time (the whole call:
per-device forward build, backward pass, all-reduce, momentum-SGD updates, sync), the
number of ops it outputs (net + param init net), the time per output op, and the ratio to
a plain protobuf copy of the resulting NetDefs.  Targets: <= 1 s for 16 devices, and time
per output op flat (within 1.5x) from 2 to 64 devices.

    python bench/parallelize.py [--devices 1 2 4 8 16 32 64] [--repeat 1] [--gpu]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from typing import Any

from dpgraph import brew, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.proto import caffe2_pb2

STAGES = [(3, 64, 256, 1), (4, 128, 512, 2), (6, 256, 1024, 2), (3, 512, 2048, 2)]


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


def measure(ndev: int, gpu: bool) -> dict[str, Any]:
    model = model_helper.ModelHelper(name=f"resnet50_{ndev}")
    start = time.perf_counter()
    data_parallel_model.Parallelize(model, lambda m: None, resnet50_forward,
                                    optimizer_builder_fun=add_optimizer,
                                    devices=list(range(ndev)), cpu_device=not gpu)
    seconds = time.perf_counter() - start
    protos = [model.net.Proto(), model.param_init_net.Proto()]
    start = time.perf_counter()
    for proto in protos:
        caffe2_pb2.NetDef().CopyFrom(proto)
    copy_seconds = time.perf_counter() - start
    ops = sum(len(p.op) for p in protos)
    return {"devices": ndev, "parallelize_s": round(seconds, 4), "output_ops": ops,
            "net_ops": len(protos[0].op), "init_ops": len(protos[1].op),
            "us_per_output_op": round(1e6 * seconds / ops, 2),
            "protobuf_copy_s": round(copy_seconds, 5),
            "ratio_to_protobuf_copy": round(seconds / copy_seconds, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs")
    parser.add_argument("--gpu", action="store_true", help="virtual GPUs instead of CPUs")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    if args.gpu:
        workspace.SetVirtualGpus(max(args.devices))
    rows = []
    for ndev in args.devices:
        runs = [measure(ndev, args.gpu) for _ in range(args.repeat)]
        rows.append(min(runs, key=lambda r: r["parallelize_s"]))
    per_op = {r["devices"]: r["us_per_output_op"] for r in rows}
    flat = [v for k, v in per_op.items() if k >= 2]
    result = {
        "benchmark": "parallelize_resnet50",
        "device_type": "gpu (virtual)" if args.gpu else "cpu",
        "python": platform.python_version(),
        "results": rows,
        "per_op_spread_2_to_64": round(max(flat) / min(flat), 2) if flat else None,
        "target_16_devices_s": 1.0,
        "meets_16_device_target": next((r["parallelize_s"] <= 1.0 for r in rows
                                        if r["devices"] == 16), None),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
