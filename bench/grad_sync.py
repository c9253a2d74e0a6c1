"""Gradient synchronisation of ResNet-50's gradients (161 float32 tensors, 25.6 M values)
over 2 processes on loopback; prints ONE JSON object.

Measured in one run, in the same processes, each as the median seconds of one whole
synchronisation (every rank starts it on a barrier; the slower rank's time counts):

* ``per_blob``: dpgraph's Parallelize graph (one GLOO ``Allreduce`` per gradient, spread
  over ``max_concurrent_distributed_ops`` common worlds), its collective ops run as one
  ``dag`` net through ``RunNet``;
* ``bucket_auto`` / ``bucket_25mb``: the same with ``gradient_bucket_mb="auto"`` / ``25``
  (pack, one Allreduce per bucket, unpack into views); ``bucket_25mb_copy`` unpacks by copy;
* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (Gloo, default 25 MB buckets) on a
  module with the same parameter shapes: a forward+backward step with synchronisation
  minus the same step under ``no_sync()`` (interleaved);
* ``bucket_25mb_float16`` / ``bucket_25mb_bfloat16``: 25 MB buckets with
  ``gradient_dtype`` (cast, Allreduce, cast back; ``<mode>_wire_bytes`` is what the
  Allreduces move per rank: 16-bit words for both, as the cross-rank Allreduce of bfloat16
  blobs is marked ``wire_dtype="bfloat16"``); target ``<= 0.6x`` of the float32 bucket time;
* ``raw_per_tensor``: ``torch.distributed.all_reduce`` on each tensor in turn;
  ``raw_one_flat_tensor``: one all_reduce of all 25.6 M values (the bandwidth floor).

``<mode>_cpu`` is the CPU time (every thread of the process, Gloo's included) one rank spends
on one synchronisation: on a loaded 2-core host the wall times follow it.

``<mode>_step`` runs the whole Parallelized net (forward, backward, synchronisation) and
``<mode>_exposed`` subtracts the same net without its synchronisation ops: the time the
synchronisation adds to a step once overlapped with the backward pass (DDP's figure is of
this kind).  Targets: ``bucket / ddp <= 0.9`` and ``bucket / per_blob <= 0.5``.  The planner's
predictions (cost model from ``$DPGRAPH_COST_MODEL`` or the defaults) are included.

Usage: ``python bench/grad_sync.py [--iters 5] [--processes 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _bench_util import one_thread_per_process

SYNC_OPS = ("Allreduce", "GradientBucketPack", "GradientBucketUnpack", "GradientCompress",
            "GradientDecompress")
#: mode -> (gradient_bucket_mb, gradient_dtype)
MODES = {"per_blob": (None, None), "bucket_auto": ("auto", None), "bucket_25mb": (25.0, None),
         "bucket_25mb_copy": (25.0, None), "bucket_25mb_float16": (25.0, "float16"),
         "bucket_25mb_bfloat16": (25.0, "bfloat16")}


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    from dpgraph.parallel.plan.profile import resnet50_shapes

    return resnet50_shapes()


def _forward(model: Any, loss_scale: float) -> list[Any]:
    """Every ResNet-50 param, summed into the loss (the backward pass writes every grad)."""
    from dpgraph.modeling.initializers import Initializer

    sums = []
    for name, shape in _shapes():
        param = model.create_param(name, list(shape), Initializer("ConstantFill", value=0.01))
        sums.append(model.net.SumElements(param, f"{name}_sum"))
    loss = model.net.Sum(sums, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def _build(rank: int, size: int, store_path: str, mode: str) -> Any:
    """This rank's Parallelized model (one CPU device) and its synchronisation net."""
    bucket_mb, dtype = MODES[mode]
    from dpgraph import core, data_parallel_model, model_helper, workspace

    workspace.ResetWorkspace()
    init = core.Net("store_init")
    init.FileStoreHandlerCreate([], "store", path=store_path, prefix=f"m{mode}")
    workspace.RunNetOnce(init)
    model = model_helper.ModelHelper(name="grad_sync")
    rendezvous = {"kv_handler": "store", "shard_id": rank, "num_shards": size,
                  "engine": "GLOO"}
    data_parallel_model.Parallelize(
        model, lambda m: None, _forward, param_update_builder_fun=lambda m: None,
        devices=[0], cpu_device=True, rendezvous=rendezvous, gradient_bucket_mb=bucket_mb,
        gradient_dtype=dtype)
    data_parallel_model.RunInitNet(model)
    return model, _subnet(model, f"sync_{mode}", sync=True)


def _subnet(model: Any, name: str, sync: bool) -> Any:
    """The main net's synchronisation ops (``sync``) or all its other ops, as a dag net."""
    from dpgraph import core

    net = core.Net(name)
    net.Proto().type = "dag"
    net.Proto().num_workers = model.net.Proto().num_workers
    net.Proto().op.extend(op for op in model.net.Proto().op if (op.type in SYNC_OPS) == sync)
    return net


def _wire_bytes(op: Any, value: Any) -> int:
    """Bytes an Allreduce moves for one input: 16-bit words when it carries bfloat16."""
    marked = any(a.name == "wire_dtype" and a.s == b"bfloat16" for a in op.arg)
    return int(value.size) * 2 if marked else int(value.nbytes)


def _cpu_seconds(fn: Any, iters: int, barrier: Any) -> list[float]:
    """Process CPU seconds (all threads) of each of ``iters`` calls."""
    spent = []
    for _ in range(iters):
        barrier()
        start = time.process_time()
        fn()
        spent.append(time.process_time() - start)
    return spent


def _timed(fn: Any, iters: int, barrier: Any) -> list[float]:
    times = []
    for _ in range(iters + 1):
        barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times[1:]  # the first is a warm-up


def _dpgraph(rank: int, size: int, store_path: str, iters: int, barrier: Any
             ) -> dict[str, Any]:
    from dpgraph import workspace

    rs = np.random.RandomState(rank)
    grads = {f"cpu_0/{name}_grad": rs.randn(*shape).astype(np.float32)
             for name, shape in _shapes()}
    results: dict[str, Any] = {}
    for mode in MODES:
        model, sync = _build(rank, size, store_path, mode)
        if mode.endswith("_copy"):
            for op in sync.Proto().op:
                if op.type == "GradientBucketUnpack":
                    op.arg.add(name="copy", i=1)
        for name, value in grads.items():
            workspace.FeedBlob(name, value)
        compute = _subnet(model, f"compute_{mode}", sync=False)
        for net in (sync, compute):
            workspace.CreateNet(net)
        names = (sync.Name(), model.net.Name(), compute.Name())
        times = _timed(lambda n=names[0]: workspace.RunNet(n), iters, barrier)
        full, alone = [], []
        for _ in range(iters):  # interleaved: the whole step, and the step without sync
            full += _timed(lambda n=names[1]: workspace.RunNet(n), 1, barrier)
            alone += _timed(lambda n=names[2]: workspace.RunNet(n), 1, barrier)
        allreduces = [op for op in sync.Proto().op if op.type == "Allreduce"]
        wire = sum(_wire_bytes(op, workspace.FetchBlob(b)) for op in allreduces
                   for b in op.input[1:])
        cpu = _cpu_seconds(lambda n=names[0]: workspace.RunNet(n), iters, barrier)
        results[mode] = {"times": times, "cpu": cpu, "step": full, "step_without_sync": alone,
                         "collectives": len(allreduces), "wire_bytes": wire,
                         "buckets_mb": [round(sum(int(np.prod(dict(_shapes())[g[:-5]])) * 4
                                                  for g in bucket) / 2**20, 2)
                                        for bucket in getattr(model, "_gradient_buckets", [])]}
    return results


def _module(torch: Any) -> Any:
    shapes = _shapes()

    class Params(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.params = torch.nn.ParameterList(
                torch.nn.Parameter(torch.full(shape, 0.01)) for _, shape in shapes)

        def forward(self) -> Any:
            return sum(p.sum() for p in self.params)

    return Params()


def _torch(iters: int, barrier: Any) -> dict[str, Any]:
    """DDP (forward through the wrapper, so its reducer runs): each iteration once with
    synchronisation and once under ``no_sync()``, interleaved; and raw all_reduce."""
    import torch
    import torch.distributed as dist

    ddp = torch.nn.parallel.DistributedDataParallel(_module(torch))

    def step() -> None:
        ddp.zero_grad(set_to_none=True)
        ddp().backward()

    def unsynced() -> None:
        with ddp.no_sync():
            step()

    for _ in range(2):  # DDP rebuilds its buckets after the first iteration
        step()
    with_sync, without = [], []
    for _ in range(iters):
        with_sync += _timed(step, 1, barrier)
        without += _timed(unsynced, 1, barrier)
    tensors = [torch.randn(shape) for _, shape in _shapes()]

    def raw() -> None:
        for tensor in tensors:
            dist.all_reduce(tensor)

    flat = torch.randn(sum(t.numel() for t in tensors))
    return {"ddp_step_synced": with_sync, "ddp_step_unsynced": without,
            "raw_per_tensor": _timed(raw, iters, barrier),
            "raw_one_flat_tensor": _timed(lambda: dist.all_reduce(flat), iters, barrier)}


def _rank(rank: int, size: int, port: int, store_path: str, iters: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    result = {"dpgraph": _dpgraph(rank, size, store_path, iters, dist.barrier),
              "torch": _torch(iters, dist.barrier)}
    queue.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


def _slowest_median(per_rank: list[list[float]]) -> float:
    """Per iteration the slower rank's time; the median over iterations."""
    return statistics.median(max(ts) for ts in zip(*per_rank))


def _predictions(size: int) -> dict[str, Any]:
    from dpgraph.parallel.plan import load, predict
    from dpgraph.parallel.plan.planner import MB, sqrt_rule_bytes
    from dpgraph.parallel.plan.profile import GradTiming, StepProfile

    grads = tuple(GradTiming(n, 4 * int(np.prod(s)), 0.0) for n, s in reversed(_shapes()))
    profile = StepProfile("resnet50 gradients", 0.0, 0.0, grads)
    model = load()
    auto = sqrt_rule_bytes(profile.grad_bytes, model, "gloo", size, 1)
    sizes: dict[str, float | None] = {"per_blob": None, "bucket_auto": auto,
                                      "bucket_25mb": 25.0 * MB}
    result: dict[str, Any] = {mode: predict(profile, model, size, nbytes).comm_s
                              for mode, nbytes in sizes.items()}
    return {**result, "auto_bucket_mb": auto / MB, "cost_model": model.to_json()}


def main() -> None:
    one_thread_per_process()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="dpgraph-grad-sync-") as tmp:
        procs = [context.Process(target=_rank, args=(r, args.processes, port, tmp, args.iters,
                                                     queue)) for r in range(args.processes)]
        for proc in procs:
            proc.start()
        results = dict(queue.get(timeout=900) for _ in procs)
        for proc in procs:
            proc.join(60)
    ranks = [results[r] for r in sorted(results)]
    out: dict[str, Any] = {"processes": args.processes, "iters": args.iters,
                           "gradients": len(_shapes()),
                           "values": int(sum(np.prod(s) for _, s in _shapes()))}
    for mode in MODES:
        out[mode] = _slowest_median([r["dpgraph"][mode]["times"] for r in ranks])
        step = _slowest_median([r["dpgraph"][mode]["step"] for r in ranks])
        alone = _slowest_median([r["dpgraph"][mode]["step_without_sync"] for r in ranks])
        out[f"{mode}_step"], out[f"{mode}_exposed"] = step, step - alone
        out[f"{mode}_collectives"] = ranks[0]["dpgraph"][mode]["collectives"]
        out[f"{mode}_wire_bytes"] = ranks[0]["dpgraph"][mode]["wire_bytes"]
        out[f"{mode}_cpu"] = _slowest_median([r["dpgraph"][mode]["cpu"] for r in ranks])
    out["bucket_auto_sizes_mb"] = ranks[0]["dpgraph"]["bucket_auto"]["buckets_mb"]
    synced = [r["torch"]["ddp_step_synced"] for r in ranks]
    unsynced = [r["torch"]["ddp_step_unsynced"] for r in ranks]
    out["ddp_step"] = _slowest_median(synced)
    out["ddp_step_without_sync"] = _slowest_median(unsynced)
    out["ddp"] = out["ddp_step"] - out["ddp_step_without_sync"]
    for key in ("raw_per_tensor", "raw_one_flat_tensor"):
        out[key] = _slowest_median([r["torch"][key] for r in ranks])
    best = min(out["bucket_auto"], out["bucket_25mb"])
    exposed = min(out["bucket_auto_exposed"], out["bucket_25mb_exposed"])
    out["ratio_bucket_vs_ddp"] = best / out["ddp"] if out["ddp"] > 0 else None
    out["ratio_bucket_vs_per_blob"] = best / out["per_blob"]
    out["ratio_exposed_bucket_vs_ddp"] = exposed / out["ddp"] if out["ddp"] > 0 else None
    out["ratio_exposed_bucket_vs_per_blob"] = (exposed / out["per_blob_exposed"]
                                               if out["per_blob_exposed"] > 0 else None)
    out["views_vs_copy"] = out["bucket_25mb"] / out["bucket_25mb_copy"]
    for dtype in ("float16", "bfloat16"):
        out[f"ratio_{dtype}_vs_float32"] = out[f"bucket_25mb_{dtype}"] / out["bucket_25mb"]
        out[f"ratio_{dtype}_vs_float32_cpu"] = (out[f"bucket_25mb_{dtype}_cpu"]
                                                / out["bucket_25mb_cpu"])
    def met(ratio: float | None, target: float) -> bool:
        return ratio is not None and ratio <= target

    out["targets_met"] = {
        "sync_only": {"vs_ddp_le_0.9": met(out["ratio_bucket_vs_ddp"], 0.9),
                      "vs_per_blob_le_0.5": met(out["ratio_bucket_vs_per_blob"], 0.5)},
        "exposed_in_step": {"vs_ddp_le_0.9": met(out["ratio_exposed_bucket_vs_ddp"], 0.9),
                            "vs_per_blob_le_0.5": met(out["ratio_exposed_bucket_vs_per_blob"],
                                                      0.5)},
        "compressed": {f"{dtype}_le_0.6": met(out[f"ratio_{dtype}_vs_float32"], 0.6)
                       for dtype in ("float16", "bfloat16")}}
    out["predicted"] = _predictions(args.processes)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
