"""Data-parallel training across processes (and hosts) with ``Parallelize_CPU(rendezvous=...)``.

Each process (rank, Caffe2's *shard*) trains the same linear regression on its own shard of
synthetic data, a minibatch per step split over ``--devices`` local CPU devices, with
momentum SGD whose learning rate halves every ``--lr-halve-every`` steps.  ``Parallelize``
with a
rendezvous of several shards sums the gradients over every device of every rank (one Gloo
``Allreduce`` per gradient), starts every rank from rank 0's parameters (``Broadcast`` in
the init net) and runs a barrier before each ``RunNet``, so every rank holds the same model.

    torchrun --standalone --nproc-per-node=2 examples/train_distributed.py
    python examples/train_distributed.py --rank 0 --world-size 2 --store-path /tmp/rdv &
    python examples/train_distributed.py --rank 1 --world-size 2 --store-path /tmp/rdv
    python examples/train_distributed.py --spawn 3            # ranks as local processes

On several hosts, use torchrun's ``--nnodes/--node-rank/--master-addr``, or a
``--store-path`` on a shared file system (see docs/distributed.md).

Restart and resume: with ``--checkpoint-dir`` (on a file system every rank reaches) every rank
saves the model (parameters, momentum, iteration counter) each ``--checkpoint-every`` steps
and at the end, and a restarted job resumes from the newest complete checkpoint.  The data
of a step is a function of the step alone, so a resumed run ends with bitwise the same
parameters as an uninterrupted one::

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 examples/train_distributed.py \
        --checkpoint-dir /tmp/ckpt --checkpoint-every 10 --crash-at-step 25
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import socket
import sys
import time
from typing import Any

import numpy as np

from dpgraph import brew, checkpoint, core, data_parallel_model, workspace
from dpgraph.collectives import rendezvous_from_env
from dpgraph.model_helper import ModelHelper

FEATURES = 8
MOMENTUM = 0.5


def shard(rank: int, size: int, rows: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """This rank's slice of one synthetic data set, ``y = X w* + 0.5 + noise``."""
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal((FEATURES, 1)).astype(np.float32)
    x = rng.standard_normal((rows * size, FEATURES)).astype(np.float32)
    y = x @ true_w + 0.5 + 0.01 * rng.standard_normal((rows * size, 1)).astype(np.float32)
    return x[rank::size], y[rank::size]


def forward(model: ModelHelper, loss_scale: float) -> list[Any]:
    """Per device: prediction, squared error, and the loss scaled by 1/(devices * ranks)."""
    pred = brew.fc(model, "data", "pred", dim_in=FEATURES, dim_out=1,
                   weight_init=("XavierFill", {"random_seed": 7}))  # the same on every run
    dist = model.net.SquaredL2Distance([pred, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def batch(step: int, rows: int, size: int) -> np.ndarray:
    """The row indices of step ``step``'s minibatch (``size`` rows of ``rows``): a function
    of the step alone, so a resumed run sees the same data as an uninterrupted one."""
    per_epoch = max(rows // size, 1)
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([1234, epoch]).permutation(rows)
    return order[index * size:(index + 1) * size]


def sgd(lr: float, halve_every: int) -> Any:
    """Per device: momentum SGD, the learning rate halving every ``halve_every`` steps (the
    gradients are already summed everywhere)."""
    def update(model: ModelHelper) -> None:
        it = brew.iter(model, "ITER")
        rate = model.net.LearningRate([it], "LR", base_lr=lr, policy="step",
                                      stepsize=halve_every, gamma=0.5)
        for param in model.GetParams():
            grad = model.param_to_grad[param]
            name = str(param).rsplit("/", 1)[-1]  # the name scope adds the device prefix
            moment = model.param_init_net.ConstantFill([param], f"{name}_momentum", value=0.0)
            model.net.MomentumSGDUpdate([grad, moment, rate, param], [grad, moment, param],
                                        momentum=MOMENTUM)
    return update


def make_rendezvous(args: argparse.Namespace) -> Any:
    """Caffe2's dict over a FileStore handler (``--store-path``), torchrun's environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), or None for one process."""
    if not args.store_path and "RANK" not in os.environ and args.world_size == 1:
        return None
    if args.store_path:
        workspace.RunOperatorOnce(core.CreateOperator(
            "FileStoreHandlerCreate", [], ["store_handler"], path=args.store_path,
            prefix="train_distributed"))
        return {"kv_handler": "store_handler", "shard_id": args.rank,
                "num_shards": args.world_size, "engine": "GLOO"}
    return rendezvous_from_env(timeout=30)


def ranks_of(rdv: Any) -> tuple[int, int]:
    """(shard_id, num_shards) of either rendezvous form; (0, 1) without one."""
    if rdv is None:
        return 0, 1
    if isinstance(rdv, dict):
        return rdv["shard_id"], rdv["num_shards"]
    return rdv.shard_id, rdv.num_shards


def feed(devices: list[int], x: np.ndarray, y: np.ndarray) -> None:
    """Device i gets the i-th slice of this step's rows."""
    per = len(x) // len(devices)
    for i, device in enumerate(devices):
        rows = slice(i * per, (i + 1) * per)
        workspace.FeedBlob(f"cpu_{device}/data", x[rows])
        workspace.FeedBlob(f"cpu_{device}/label", y[rows])


def restart_count() -> int:
    """torchrun's attempt number (0 on the first run, and without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def checkpoint_set(args: argparse.Namespace, rdv: Any, rank: int,
                   size: int) -> checkpoint.CheckpointSet | None:
    """The job's checkpoints, the ranks meeting in barriers over the rendezvous store (one
    session per attempt: the store outlives torchrun restarts, a FileStore outlives runs)."""
    if not args.checkpoint_dir:
        return None
    barrier = None
    if size > 1:
        store = rdv["kv_handler"] if isinstance(rdv, dict) else rdv.store
        store = workspace.FetchBlob(store) if isinstance(store, str) else store
        barrier = checkpoint.StoreBarrier(store, size, rank=rank,
                                          prefix="train_distributed/checkpoint")
    return checkpoint.CheckpointSet(args.checkpoint_dir, rank, size,
                                    keep=args.keep_checkpoints, barrier=barrier)


def crash_if_asked(args: argparse.Namespace, rank: int, size: int, step: int) -> None:
    """Fault injection for the restart test: on the first attempt only, one rank dies."""
    crash_rank = size - 1 if args.crash_rank is None else args.crash_rank
    if step == args.crash_at_step and rank == crash_rank and restart_count() == 0:
        sys.stderr.write(f"rank {rank}: crashing at step {step} as asked\n")
        sys.stderr.flush()
        os._exit(3)


def params_digest(model: ModelHelper) -> str:
    """sha256 over the checkpointed blobs (name, dtype, shape, bytes) of the first device."""
    digest = hashlib.sha256()
    for name in checkpoint.checkpoint_blob_names(model):
        value = np.asarray(workspace.FetchBlob(name))
        digest.update(f"{name}{value.dtype}{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def train(args: argparse.Namespace) -> None:
    rdv = make_rendezvous(args)
    rank, size = ranks_of(rdv)
    devices = list(range(args.devices))
    model = ModelHelper(name="linreg")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
        param_update_builder_fun=sgd(args.lr, args.lr_halve_every), devices=devices,
        rendezvous=rdv)
    x, y = shard(rank, size)
    rows = args.batch_size * len(devices)
    feed(devices, x[:rows], y[:rows])
    data_parallel_model.RunInitNet(model)
    checkpoints = checkpoint_set(args, rdv, rank, size)
    begin = 0
    if checkpoints is not None:
        begin = checkpoint.resume_model_checkpoint_set(model, checkpoints) or 0
        sys.stdout.write(f"rank {rank}/{size}: attempt {restart_count()}, "
                         + (f"resumed from step {begin}\n" if begin else "starting fresh\n"))
    start = time.perf_counter()
    first = None
    for step in range(begin, args.steps):
        picked = batch(step, len(x), rows)
        feed(devices, x[picked], y[picked])
        data_parallel_model.RunNet(model, 1)
        first = float(workspace.FetchBlob("cpu_0/loss")) if first is None else first
        after_step(args, model, checkpoints, rank, size, step + 1)
    report(model, rank, size, args.steps - begin, first, time.perf_counter() - start)


def after_step(args: argparse.Namespace, model: ModelHelper,
               checkpoints: checkpoint.CheckpointSet | None, rank: int, size: int,
               done: int) -> None:
    """Save a checkpoint when one is due: this rank's file, then (for the restart test)
    the injected crash, then the commit that makes the step complete."""
    due = done % args.checkpoint_every == 0 or done == args.steps
    if checkpoints is None or not due:
        crash_if_asked(args, rank, size, done)
        return
    checkpoints.write_rank(done, checkpoint.checkpoint_blob_names(model))
    crash_if_asked(args, rank, size, done)
    checkpoints.commit(done)


def report(model: ModelHelper, rank: int, size: int, steps: int, first: float | None,
           seconds: float) -> None:
    weights = workspace.FetchBlob("cpu_0/pred_w")
    loss = float(workspace.FetchBlob("cpu_0/loss")) if first is not None else float("nan")
    first = loss if first is None else first
    sys.stdout.write(f"rank {rank}/{size}: loss {first:.4f} -> {loss:.5f} in {steps} steps "
                     f"({seconds:.2f}s), weights checksum "
                     f"{float(np.sum(weights * weights)):.6f}, params sha256 "
                     f"{params_digest(model)}\n")  # one write: no interleaving
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
    parser.add_argument("--batch-size", type=int, default=32,
                        help="rows per device and step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--lr-halve-every", type=int, default=100,
                        help="halve the learning rate every this many steps")
    parser.add_argument("--checkpoint-dir", default="",
                        help="save checkpoints here (every rank must reach it) and resume "
                             "from the newest complete one")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="steps between checkpoints (one is also saved at the end)")
    parser.add_argument("--keep-checkpoints", type=int, default=2,
                        help="complete checkpoints to keep (0: all)")
    parser.add_argument("--crash-at-step", type=int, default=-1,
                        help="fault injection: on torchrun's first attempt, one rank exits "
                             "after this step (after writing its own file when the step "
                             "saves a checkpoint, before the checkpoint is complete)")
    parser.add_argument("--crash-rank", type=int, default=None,
                        help="the rank --crash-at-step kills (default: the last one)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "lr_halve_every", "checkpoint_every"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.spawn:
        return spawn(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
