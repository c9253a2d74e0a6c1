"""Memory benchmark: planned peak activation + gradient bytes of a ResNet-50 training step.

Prints ONE JSON object.  The model is ResNet-50 (brew conv/spatial_bn/relu/max_pool/
average_pool/fc, softmax cross-entropy, plain SGD updates) replicated by
``data_parallel_model.Parallelize`` on 2 CPU devices, 224x224 inputs, batch 32 per device.
Nothing is run: blob sizes come from ``workspace.InferShapesAndTypes`` on the baseline net,
and each variant's peak comes from a sweep over its op order that models Caffe2's
workspace (a blob keeps its buffer, at the largest size written to it, across iterations
until a ``Free`` op releases it; the steady-state iteration is measured).  Counted: every
blob the training net writes except params, computed params and other init-net outputs.

Variants: ``baseline``; ``optimize_gradient_memory`` (Parallelize flag: gradients share
buffers per device); ``dynamic_memory_management`` (Parallelize flag: Free after last use);
``optimize_gradient_memory+recycle_activations`` (``OptimizeGradientMemory(model,
input_shapes, [], recycle_activations=True)``: gradients and activations share buffers).
``reduction`` is ``1 - peak / baseline_peak``.

``optimizer_state``: ResNet-50 with Adam (``optimizer.build_adam``) parallelized over 1, 2,
4 and 8 ranks (CPU devices) with ``shard_optimizer_state=True``; per rank, the bytes of the
optimizer-state blobs its param init net creates (Adam's two moments; shapes from
``workspace.InferShapesAndTypes``), against the unsharded graph, where every rank holds the
full state.  ``ratio_to_ideal`` is ``max per-rank bytes / (unsharded bytes / N)``; the
target is at most 1.05.

Run: ``python bench/memory.py [--batch 32] [--devices 2] [--image 224]
[--section all|activations|optimizer_state] [--ranks 1 2 4 8]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph import brew, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.memory import liveness
from dpgraph.memory.dpm import OptimizeGradientMemory
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime.serialization import DATA_TYPE_TO_NUMPY

STAGES = ((3, 64, 256, 1), (4, 128, 512, 2), (6, 256, 1024, 2), (3, 512, 2048, 2))


def _conv_bn(model: Any, x: Any, name: str, dim_in: int, dim_out: int, kernel: int,
             stride: int = 1, relu: bool = True) -> Any:
    y = brew.conv(model, x, name, dim_in, dim_out, kernel, stride=stride, pad=kernel // 2,
                  no_bias=True)
    y = brew.spatial_bn(model, y, name + "_bn", dim_out, epsilon=1e-5, momentum=0.9,
                        is_test=False)
    return brew.relu(model, y, y) if relu else y


def _bottleneck(model: Any, x: Any, name: str, dim_in: int, inner: int, dim_out: int,
                stride: int) -> Any:
    y = _conv_bn(model, x, name + "_1", dim_in, inner, 1)
    y = _conv_bn(model, y, name + "_2", inner, inner, 3, stride)
    y = _conv_bn(model, y, name + "_3", inner, dim_out, 1, relu=False)
    shortcut = x
    if dim_in != dim_out or stride != 1:
        shortcut = _conv_bn(model, x, name + "_proj", dim_in, dim_out, 1, stride, relu=False)
    total = brew.sum(model, [y, shortcut], name + "_sum")
    return brew.relu(model, total, total)


def resnet50(model: Any, loss_scale: float) -> list[Any]:
    x = _conv_bn(model, "data", "conv1", 3, 64, 7, 2)
    x = brew.max_pool(model, x, "pool1", kernel=3, stride=2, pad=1)
    dim = 64
    for s, (blocks, inner, out, stride) in enumerate(STAGES):
        for b in range(blocks):
            x = _bottleneck(model, x, f"res{s + 2}_{b}", dim, inner, out,
                            stride if b == 0 else 1)
            dim = out
    x = brew.average_pool(model, x, "pool5", kernel=7, stride=1)
    logits = brew.fc(model, x, "pred", 2048, 1000)
    softmax, loss = model.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sgd(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def build(devices: int, after: Callable[[Any], None] | None = None, **flags: Any) -> Any:
    model = model_helper.ModelHelper(name="resnet50")
    data_parallel_model.Parallelize(model, lambda m: None, resnet50,
                                    param_update_builder_fun=sgd, devices=range(devices),
                                    cpu_device=True, **flags)
    if after is not None:
        after(model)
    return model


def blob_bytes(model: Any, devices: int, batch: int, image: int) -> dict[str, int]:
    dims: dict[str, list[int]] = {}
    types: dict[str, int] = {}
    for d in range(devices):
        dims[f"cpu_{d}/data"] = [batch, 3, image, image]
        dims[f"cpu_{d}/label"] = [batch]
        types[f"cpu_{d}/label"] = caffe2_pb2.TensorProto.INT32
    shapes, dtypes = workspace.InferShapesAndTypes([model.param_init_net, model.net], dims,
                                                   blob_types=types)
    return {name: math.prod(shape) * DATA_TYPE_TO_NUMPY[dtypes[name]].itemsize
            for name, shape in shapes.items()}


def measure(baseline: Any, model: Any, sizes: dict[str, int]) -> dict[str, Any]:
    init_outputs = {o for op in baseline.param_init_net.Proto().op for o in op.output}
    base_proto, proto = baseline.net.Proto(), model.net.Proto()
    writes = liveness.aligned_write_sizes(base_proto, sizes, proto)
    peak = liveness.peak_bytes(list(proto.op), writes, lambda b: b not in init_outputs)
    names = {b for op in proto.op for b in op.output if b not in init_outputs}
    return {"peak_bytes": peak, "blobs": len(names),
            "free_ops": sum(op.type == "Free" for op in proto.op)}


def _state_bytes_per_rank(ranks: int, shard: bool) -> tuple[list[int], int]:
    """Optimizer-state bytes each device's param init net creates (Adam), and the params'
    bytes of one device."""
    model = model_helper.ModelHelper(name="resnet50_adam")
    data_parallel_model.Parallelize(
        model, lambda m: None, resnet50, devices=range(ranks), cpu_device=True,
        optimizer_builder_fun=lambda m: optimizer.build_adam(m, 0.01),
        shard_optimizer_state=shard)
    shapes, dtypes = workspace.InferShapesAndTypes([model.param_init_net])
    params = {str(p) for p in model.GetParams()}
    per_rank = [0] * ranks
    param_bytes = 0
    for name, shape in shapes.items():
        head, _, stripped = name.partition("/")
        if not head.startswith("cpu_") or not stripped:
            continue
        nbytes = math.prod(shape) * DATA_TYPE_TO_NUMPY[dtypes[name]].itemsize
        if name in params:
            param_bytes += nbytes if head == "cpu_0" else 0
        elif stripped.endswith(("_first_moment", "_second_moment")):
            per_rank[int(head[4:])] += nbytes
    return per_rank, param_bytes


def optimizer_state(ranks_list: list[int]) -> dict[str, Any]:
    """Adam state bytes per rank, sharded over each rank count, against unsharded."""
    unsharded, param_bytes = _state_bytes_per_rank(2, False)
    full = unsharded[0]
    rows = {}
    for ranks in ranks_list:
        per_rank, _ = _state_bytes_per_rank(ranks, True)
        ideal = full / ranks
        rows[str(ranks)] = {
            "per_rank_bytes": per_rank, "max_mib": round(max(per_rank) / 2**20, 2),
            "total_bytes": sum(per_rank),
            "ratio_to_ideal": round(max(per_rank) / ideal, 4),
        }
    return {
        "optimizer": "adam", "param_bytes": param_bytes,
        "unsharded_per_rank_bytes": unsharded, "unsharded_mib": round(full / 2**20, 2),
        "sharded": rows, "target_ratio": 1.05,
        "target_met": all(r["ratio_to_ideal"] <= 1.05 for r in rows.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--section", default="all",
                        choices=("all", "activations", "optimizer_state"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    start = time.perf_counter()
    if args.section == "optimizer_state":
        print(json.dumps({"benchmark": "memory", "model": "resnet50",
                          "optimizer_state": optimizer_state(args.ranks),
                          "seconds": round(time.perf_counter() - start, 1)}, indent=1))
        return
    baseline = build(args.devices)
    sizes = blob_bytes(baseline, args.devices, args.batch, args.image)
    input_shapes = {"data": [args.batch, 3, args.image, args.image], "label": [args.batch]}
    variants: dict[str, Any] = {
        "baseline": baseline,
        "optimize_gradient_memory": build(args.devices, optimize_gradient_memory=True),
        "dynamic_memory_management": build(args.devices, dynamic_memory_management=True),
        "optimize_gradient_memory+recycle_activations": build(
            args.devices, after=lambda m: OptimizeGradientMemory(m, input_shapes, [], True)),
    }
    results = {name: measure(baseline, model, sizes) for name, model in variants.items()}
    base_peak = results["baseline"]["peak_bytes"]
    for result in results.values():
        result["peak_mib"] = round(result["peak_bytes"] / 2**20, 1)
        result["reduction"] = round(1.0 - result["peak_bytes"] / base_peak, 4)
    ops = len(baseline.net.Proto().op)
    unknown = sum(1 for op in baseline.net.Proto().op for b in op.output if b not in sizes)
    extra = {} if args.section == "activations" else {
        "optimizer_state": optimizer_state(args.ranks)}
    print(json.dumps({
        "benchmark": "memory", "model": "resnet50", "devices": args.devices,
        "batch_per_device": args.batch, "image": args.image, "ops": ops,
        "outputs_without_shape": unknown, "variants": results,
        "target_reduction": 0.4,
        "target_met": results["optimize_gradient_memory+recycle_activations"]["reduction"]
        >= 0.4,
        **extra,
        "seconds": round(time.perf_counter() - start, 1),
        "numpy": np.__version__,
    }, indent=1))


if __name__ == "__main__":
    main()
