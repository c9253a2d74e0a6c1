"""Data-parallel training across processes with dpgraph's Gloo collectives.

Each process (rank) trains the same linear regression on its own shard of synthetic data;
gradients are summed across ranks with ``Allreduce`` ops and parameters start from rank 0's
values (``Broadcast``), so every rank holds the same model after every step.

    torchrun --nproc_per_node 2 examples/train_distributed.py     # torchrun's environment
    python examples/train_distributed.py --spawn 3                # or spawn ranks locally

This is the explicit form (ops written by hand).  ``data_parallel_model.Parallelize`` with a
``rendezvous`` emits the same ops for you (multi-host wiring: see docs/distributed.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time

import numpy as np

from dpgraph import brew, workspace
from dpgraph.collectives import rendezvous_from_env
from dpgraph.model_helper import ModelHelper

FEATURES = 8


def shard(rank: int, size: int, rows: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """This rank's slice of one synthetic data set, ``y = X w* + 0.5 + noise``."""
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal((FEATURES, 1)).astype(np.float32)
    x = rng.standard_normal((rows * size, FEATURES)).astype(np.float32)
    y = x @ true_w + 0.5 + 0.01 * rng.standard_normal((rows * size, 1)).astype(np.float32)
    return x[rank::size], y[rank::size]


def build(rdv: object, lr: float) -> ModelHelper:
    """Forward, loss, gradients, then one Allreduce per gradient and an SGD step."""
    model = ModelHelper(name="linreg")
    pred = brew.fc(model, "data", "pred", dim_in=FEATURES, dim_out=1)
    dist = model.net.SquaredL2Distance([pred, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    grads = model.AddGradientOperators([loss])
    init = model.param_init_net
    init.CreateCommonWorld([rdv.store], "cw", size=rdv.num_shards, rank=rdv.shard_id,
                           engine=rdv.engine, timeout_ms=int(rdv.timeout * 1000))
    init.ConstantFill([], "lr", shape=[1], value=-lr / rdv.num_shards)  # mean of the sums
    init.ConstantFill([], "one", shape=[1], value=1.0)
    for param in model.params:
        init.Broadcast(["cw", param], [param], root=0, engine=rdv.engine)
        grad = grads[param]
        model.net.Allreduce(["cw", grad], [grad], engine=rdv.engine)
        model.net.WeightedSum([param, "one", grad, "lr"], [param])
    return model


def train(steps: int, lr: float) -> None:
    rdv = rendezvous_from_env(timeout=30)
    x, y = shard(rdv.shard_id, rdv.num_shards)
    model = build(rdv, lr)
    workspace.FeedBlob("data", x)
    workspace.FeedBlob("label", y)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    start = time.perf_counter()
    first = None
    for _ in range(steps):
        workspace.RunNet(model.net.Name())
        first = float(workspace.FetchBlob("loss")) if first is None else first
    weights = workspace.FetchBlob("pred_w")
    sys.stdout.write(f"rank {rdv.shard_id}/{rdv.num_shards}: loss {first:.4f} -> "
                     f"{float(workspace.FetchBlob('loss')):.5f} in {steps} steps "
                     f"({time.perf_counter() - start:.2f}s), weights checksum "
                     f"{float(np.sum(weights * weights)):.6f}\n")  # one write: no interleaving
    sys.stdout.flush()


def _spawned(rank: int, size: int, port: int, steps: int, lr: float) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(steps, lr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawn", type=int, default=0,
                        help="start this many ranks locally instead of reading torchrun's env")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args(argv)
    if not args.spawn:
        train(args.steps, args.lr)
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(r, args.spawn, port, args.steps, args.lr))
             for r in range(args.spawn)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    return max(abs(proc.exitcode or 0) for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
