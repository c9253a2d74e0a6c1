"""Data-parallel training across processes (and hosts) with ``Parallelize_CPU(rendezvous=...)``.

Each process (rank, Caffe2's *shard*) trains the same linear regression on its own shard of
synthetic data, split over ``--devices`` local CPU devices.  ``Parallelize`` with a
rendezvous of several shards sums the gradients over every device of every rank (one Gloo
``Allreduce`` per gradient), starts every rank from rank 0's parameters (``Broadcast`` in
the init net) and runs a barrier before each ``RunNet``, so every rank holds the same model.

    torchrun --standalone --nproc-per-node=2 examples/train_distributed.py
    python examples/train_distributed.py --rank 0 --world-size 2 --store-path /tmp/rdv &
    python examples/train_distributed.py --rank 1 --world-size 2 --store-path /tmp/rdv
    python examples/train_distributed.py --spawn 3            # ranks as local processes

On several hosts, use torchrun's ``--nnodes/--node-rank/--master-addr``, or a
``--store-path`` on a shared file system (see docs/distributed.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time
from typing import Any

import numpy as np

from dpgraph import brew, core, data_parallel_model, workspace
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


def forward(model: ModelHelper, loss_scale: float) -> list[Any]:
    """Per device: prediction, squared error, and the loss scaled by 1/(devices * ranks)."""
    pred = brew.fc(model, "data", "pred", dim_in=FEATURES, dim_out=1)
    dist = model.net.SquaredL2Distance([pred, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sgd(lr: float) -> Any:
    """Per device: ``param -= lr * grad`` (the gradients are already summed everywhere)."""
    def update(model: ModelHelper) -> None:
        it = brew.iter(model, "ITER")
        rate = model.net.LearningRate([it], "LR", base_lr=-lr, policy="fixed")
        one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in model.GetParams():
            model.net.WeightedSum([param, one, model.param_to_grad[param], rate], param)
    return update


def make_rendezvous(args: argparse.Namespace) -> Any:
    """Caffe2's dict over a FileStore handler (``--store-path``), or torchrun's env."""
    if args.store_path:
        workspace.RunOperatorOnce(core.CreateOperator(
            "FileStoreHandlerCreate", [], ["store_handler"], path=args.store_path,
            prefix="train_distributed"))
        return {"kv_handler": "store_handler", "shard_id": args.rank,
                "num_shards": args.world_size, "engine": "GLOO"}
    return rendezvous_from_env(timeout=30)


def feed(model: ModelHelper, devices: list[int], x: np.ndarray, y: np.ndarray) -> None:
    """Device i gets the i-th slice of this rank's shard."""
    per = len(x) // len(devices)
    for i, device in enumerate(devices):
        rows = slice(i * per, (i + 1) * per)
        workspace.FeedBlob(f"cpu_{device}/data", x[rows])
        workspace.FeedBlob(f"cpu_{device}/label", y[rows])


def train(args: argparse.Namespace) -> None:
    rdv = make_rendezvous(args)
    rank = rdv["shard_id"] if isinstance(rdv, dict) else rdv.shard_id
    size = rdv["num_shards"] if isinstance(rdv, dict) else rdv.num_shards
    devices = list(range(args.devices))
    model = ModelHelper(name="linreg")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
        param_update_builder_fun=sgd(args.lr), devices=devices, rendezvous=rdv)
    x, y = shard(rank, size)
    feed(model, devices, x, y)
    data_parallel_model.RunInitNet(model)
    start = time.perf_counter()
    first = None
    for _ in range(args.steps):
        data_parallel_model.RunNet(model, 1)
        first = float(workspace.FetchBlob("cpu_0/loss")) if first is None else first
    weights = workspace.FetchBlob("cpu_0/pred_w")
    sys.stdout.write(f"rank {rank}/{size}: loss {first:.4f} -> "
                     f"{float(workspace.FetchBlob('cpu_0/loss')):.5f} in {args.steps} steps "
                     f"({time.perf_counter() - start:.2f}s), weights checksum "
                     f"{float(np.sum(weights * weights)):.6f}\n")  # one write: no interleaving
    sys.stdout.flush()


def _spawned(rank: int, size: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(args)


def spawn(args: argparse.Namespace) -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(r, args.spawn, port, args))
             for r in range(args.spawn)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    return max(abs(proc.exitcode or 0) for proc in procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=0, help="this process's rank (shard_id)")
    parser.add_argument("--world-size", type=int, default=1, help="number of ranks")
    parser.add_argument("--store-path", default="",
                        help="a directory every rank reaches (FileStore); default: torchrun's "
                             "environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    parser.add_argument("--spawn", type=int, default=0,
                        help="start this many ranks as local processes")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per rank")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args(argv)
    if args.spawn:
        return spawn(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
