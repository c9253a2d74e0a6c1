"""Data-parallel scaling of a small CNN over 1, 2 and 3 processes on loopback (Gloo), with the
same batch per process; prints ONE JSON object.

For each process count and each synchronisation (``per_blob``: Caffe2's one Allreduce per
gradient; ``bucketed``: ``gradient_bucket_mb="auto"``), every process trains the model built
by ``data_parallel_model.Parallelize`` on one CPU device and times its main net (forward,
backward, synchronisation, SGD update; each iteration starts on the model's barrier net).
``independent`` runs the same processes without a rendezvous (no communication): the
compute time at that process count.  Reported: the median per-process step time, its ratio
to one process (target for 2 processes with buckets: <= 1.15) and to ``independent``, and
the planner's prediction for the same runs (cost model calibrated by a short probe at the
start on as many local ranks as the runs use, also given to the runs so their ``"auto"``
buckets come from it; compute time = the
measured ``independent`` step; the gradient timeline from the graph's FLOP counts) with its
relative error (target: within 25% for 2 and 3 processes).

Every configuration is measured ``--rounds`` times, the configurations interleaved (one
round runs each once), and the median round counts: on a shared machine a load swing then
hits every configuration alike instead of one.  The model and batch are unchanged.

Usage: ``python bench/scaling.py [--iters 8] [--batch 32] [--processes 1,2,3] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _bench_util import one_thread_per_process

MODES = {"per_blob": None, "bucketed": "auto"}
INDEPENDENT = "independent"


def _forward(model: Any, loss_scale: float) -> list[Any]:
    """conv 3->16, relu, pool, conv 16->32, relu, pool, FC 2048->256, relu, FC 256->10."""
    from dpgraph import brew

    x = brew.relu(model, brew.conv(model, "data", "conv1", 3, 16, 3, pad=1), "relu1")
    x = brew.max_pool(model, x, "pool1", kernel=2, stride=2)
    x = brew.relu(model, brew.conv(model, x, "conv2", 16, 32, 3, pad=1), "relu2")
    x = brew.max_pool(model, x, "pool2", kernel=2, stride=2)
    x = brew.relu(model, brew.fc(model, x, "fc1", 32 * 8 * 8, 256), "relu3")
    x = brew.fc(model, x, "fc2", 256, 10)
    _, loss = model.net.SoftmaxWithLoss([x, "label"], ["softmax", "loss"])
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def _sgd(model: Any) -> None:
    from dpgraph import brew

    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.01, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def _run(rank: int, size: int, store: str, bucket_mb: Any, batch: int, iters: int,
         queue: Any) -> None:
    from dpgraph import core, data_parallel_model, model_helper, workspace

    rendezvous = None
    if size > 1 and bucket_mb != INDEPENDENT:
        init = core.Net("store_init")
        init.FileStoreHandlerCreate([], "store", path=store, prefix=str(bucket_mb))
        workspace.RunNetOnce(init)
        rendezvous = {"kv_handler": "store", "shard_id": rank, "num_shards": size,
                      "engine": "GLOO"}
    model = model_helper.ModelHelper(name="scaling")
    data_parallel_model.Parallelize(
        model, lambda m: None, _forward, param_update_builder_fun=_sgd, devices=[0],
        cpu_device=True, rendezvous=rendezvous,
        gradient_bucket_mb=None if bucket_mb == INDEPENDENT else bucket_mb)
    data_parallel_model.RunInitNet(model)
    rs = np.random.RandomState(rank)
    with core.DeviceScope(core.DeviceOption(0, 0)):
        workspace.FeedBlob("cpu_0/data", rs.randn(batch, 3, 32, 32).astype(np.float32))
        workspace.FeedBlob("cpu_0/label", rs.randint(0, 10, size=batch).astype(np.int32))
    barrier = getattr(model, "_barrier_net", None)
    times = []
    for _ in range(iters + 2):
        if barrier is not None:
            workspace.RunNet(barrier.Proto().name)
        start = time.perf_counter()
        workspace.RunNet(model.net.Proto().name)
        times.append(time.perf_counter() - start)
    queue.put((rank, times[2:]))


def measure(size: int, bucket_mb: Any, batch: int, iters: int) -> float:
    """Median over iterations of the slowest process's step time."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="dpgraph-scaling-") as tmp:
        procs = [context.Process(target=_run, args=(r, size, tmp, bucket_mb, batch, iters,
                                                    queue)) for r in range(size)]
        for proc in procs:
            proc.start()
        results = dict(queue.get(timeout=600) for _ in procs)
        for proc in procs:
            proc.join(60)
    return statistics.median(max(ts) for ts in zip(*results.values()))


def _profile(batch: int) -> Any:
    from dpgraph import model_helper
    from dpgraph.parallel.plan import profile_from_nets

    model = model_helper.ModelHelper(name="scaling_profile")
    _forward(model, 1.0)
    return profile_from_nets(model.net.Proto(), model.param_init_net.Proto(),
                             {"data": [batch, 3, 32, 32], "label": [batch]}, name="small CNN")


def main() -> None:
    one_thread_per_process()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--processes", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from dpgraph.parallel.plan import predict
    from dpgraph.parallel.plan.calibrate import calibrate
    from dpgraph.parallel.plan.planner import best_bucket_bytes, sqrt_rule_bytes

    counts = [int(p) for p in args.processes.split(",")]
    # one calibration per process count, on as many local ranks as the runs use (as a job
    # calibrates on its own world); the runs' "auto" buckets come from the same file
    costs, files = {}, {}
    for size in [c for c in counts if c > 1]:
        costs[size] = calibrate(size)
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="dpgraph-cost-",
                                             delete=False)
        handle.close()
        costs[size].save(handle.name)
        files[size] = handle.name
    profile = _profile(args.batch)
    out: dict[str, Any] = {"model": profile.name, "batch_per_process": args.batch,
                           "gradients": len(profile.grads),
                           "gradient_mb": profile.grad_bytes / 2**20,
                           "cost_models": {str(k): v.to_json() for k, v in costs.items()},
                           "runs": []}
    configs = [(1, None)] + [(size, mode) for size in counts if size > 1
                             for mode in (INDEPENDENT, *MODES.values())]
    rounds: dict[tuple[int, Any], list[float]] = {c: [] for c in configs}
    for _ in range(args.rounds):  # interleaved: a load swing hits every configuration
        for size, bucket_mb in configs:
            if size in files:
                os.environ["DPGRAPH_COST_MODEL"] = files[size]
            rounds[(size, bucket_mb)].append(measure(size, bucket_mb, args.batch, args.iters))
    step_of = {c: statistics.median(v) for c, v in rounds.items()}
    one = step_of[(1, None)]
    out["one_process_step_s"] = one
    out["rounds"] = args.rounds
    for size in [c for c in counts if c > 1]:
        # the same processes training without communicating: the compute time at this
        # process count (on a machine with fewer free cores than processes, they contend)
        alone, cost = step_of[(size, INDEPENDENT)], costs[size]
        out["runs"].append({"processes": size, "sync": INDEPENDENT, "step_s": alone,
                            "vs_one_process": alone / one})
        for mode, bucket_mb in MODES.items():
            step = step_of[(size, bucket_mb)]
            size_bytes = (None if bucket_mb is None else
                          sqrt_rule_bytes(profile.grad_bytes, cost, "gloo", size, 1))
            guess = predict(profile, cost, size, size_bytes, compute_s=alone,
                            join_same_op=bucket_mb == "auto")
            predicted = guess.step_s
            out["runs"].append({
                "processes": size, "sync": mode, "step_s": step, "vs_one_process": step / one,
                "vs_independent": step / alone, "bucket_mb": guess.bucket_mb,
                "collectives": guess.collectives, "predicted_step_s": predicted,
                "predicted_contention_s": guess.contention_s,
                "prediction_error": abs(predicted - step) / step,
                "round_steps_s": rounds[(size, bucket_mb)],
                "best_predicted_bucket_mb": best_bucket_bytes(profile, cost, size,
                                                              compute_s=alone) / 2**20})
    two = [r for r in out["runs"] if r["processes"] == 2 and r["sync"] == "bucketed"]
    out["target_2proc_bucketed_le_1.15"] = bool(two and two[0]["vs_one_process"] <= 1.15)
    out["target_predictions_within_25pct"] = all(r["prediction_error"] <= 0.25
                                                 for r in out["runs"] if "prediction_error" in r)
    out["load_average"] = os.getloadavg()
    for name in files.values():
        os.unlink(name)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
