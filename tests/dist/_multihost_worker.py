"""Ranks of the multi-host Parallelize tests, on the ``_worker`` harness.

Every rank trains one small MLP with ``data_parallel_model.Parallelize`` and a rendezvous
dict (a FileStore or TCPStore handler blob named ``"store"``); device ``i`` of rank ``r``
gets slice ``r * len(devices) + i`` of one global batch per iteration, so any split of the
batch over processes and devices trains the same model.  :func:`train` with ``size=1`` and
no store is the single-process reference.
"""

from __future__ import annotations

import os
import signal
import time
import zlib
from typing import Any

import _launch
import _worker
import numpy as np
from _launch import rank_configs

from dpgraph import brew, checkpoint, core, data_parallel_model, model_helper, workspace
from dpgraph.errors import CollectiveError
from dpgraph.proto import caffe2_pb2

# tests/dist/conftest.py preloads dpgraph and torch.distributed into the forkserver
BATCH = 48
IN, HIDDEN, OUT = 6, 5, 3


def forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.relu(model, brew.fc(model, "data", "fc1", IN, HIDDEN), "relu1")
    out = brew.fc(model, hidden, "fc2", HIDDEN, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def forward_bn(model: Any, loss_scale: float) -> list[Any]:
    """With SpatialBN, whose running statistics are computed params."""
    bn = brew.spatial_bn(model, "image", "bn", 2, epsilon=1e-5, momentum=0.9, is_test=False)
    out = brew.fc(model, model.net.Flatten(bn, "flat"), "fc", 18, OUT)
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([out, "label"], "d"), "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sgd(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def rendezvous(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Caffe2's dict form over a store handler blob; None for the one-process reference."""
    if cfg.get("store") is None:
        return None
    workspace.RunNetOnce(_worker.store_net(cfg))
    return {"kv_handler": "store", "shard_id": cfg["rank"], "num_shards": cfg["size"],
            "engine": cfg.get("engine", "GLOO")}


def _option(cfg: dict[str, Any], device: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA if cfg.get("gpu") else caffe2_pb2.CPU, device)


def build(cfg: dict[str, Any]) -> Any:
    """A fresh workspace and the parallelized model of this rank."""
    workspace.ResetWorkspace()
    if cfg.get("gpu"):
        workspace.SetVirtualGpus(len(cfg["devices"]))
    rdv = rendezvous(cfg)
    if rdv is not None:  # a worker process (the reference runs inside pytest)
        data_parallel_model._DEFAULT_TIMEOUT_SEC = cfg["timeout_ms"] / 1000
    model = model_helper.ModelHelper(name="multihost")
    parallelize(model, cfg, rdv)
    if cfg.get("blob_sync"):
        data_parallel_model.AddDistributedBlobSync(model, ["synced"])
    return model


def parallelize(model: Any, cfg: dict[str, Any], rdv: dict[str, Any] | None) -> None:
    """Parallelize (or Parallelize_BMUF with ``bmuf``) over this rank's devices."""
    fwd = forward_bn if cfg.get("bn") else forward
    common = {"devices": cfg["devices"], "rendezvous": rdv, "cpu_device": not cfg.get("gpu"),
              "use_nccl": cfg.get("use_nccl", False),
              "barrier_net_timeout_sec": cfg["timeout_ms"] / 1000}
    if cfg.get("bmuf"):
        data_parallel_model.Parallelize_BMUF(model, lambda m: None, fwd, sgd, **common)
    else:
        data_parallel_model.Parallelize(model, lambda m: None, fwd,
                                        param_update_builder_fun=sgd, **common)


def feed(model: Any, cfg: dict[str, Any], iteration: int) -> None:
    """This rank's devices' slices of global batch ``iteration``."""
    rs = np.random.RandomState(iteration)
    batch = {"data": rs.randn(BATCH, IN).astype(np.float32),
             "label": rs.randn(BATCH, OUT).astype(np.float32),
             "image": rs.randn(BATCH, 2, 3, 3).astype(np.float32)}
    devices = cfg["devices"]
    per = BATCH // (cfg["size"] * len(devices))
    for i, device in enumerate(devices):
        start = (cfg["rank"] * len(devices) + i) * per
        with core.DeviceScope(_option(cfg, device)):
            for name, value in batch.items():
                workspace.FeedBlob(f"{model._device_prefix}_{device}/{name}",
                                   value[start:start + per])


def _params(model: Any, device: int, computed: bool = False) -> dict[str, Any]:
    """The params (and with ``computed``, the computed params) of one device, by name."""
    prefix = f"{model._device_prefix}_{device}/"
    blobs = model.GetParams(prefix) + (model.GetComputedParams(prefix) if computed else [])
    return {str(p)[len(prefix):]: workspace.FetchBlob(str(p)) for p in blobs}


def set_params(model: Any, cfg: dict[str, Any]) -> None:
    """The same deterministic values on every device of every rank."""
    for device in cfg["devices"]:
        for name, value in _params(model, device).items():
            rs = np.random.RandomState(zlib.crc32(name.encode()))
            with core.DeviceScope(_option(cfg, device)):
                workspace.FeedBlob(f"{model._device_prefix}_{device}/{name}",
                                   (0.5 * rs.randn(*value.shape)).astype(np.float32))


def init_checksums(model: Any, cfg: dict[str, Any]) -> dict[str, list[float]]:
    """Sum of squares of every param on every local device, after the init nets."""
    sums: dict[str, list[float]] = {}
    for device in cfg["devices"]:
        for name, value in _params(model, device).items():
            sums.setdefault(name, []).append(float(np.sum(np.square(value, dtype=np.float64))))
    return sums


def initialize(model: Any, cfg: dict[str, Any]) -> dict[str, list[float]]:
    """``RunInitNet``, with deterministic (or checkpointed) params put in after the param
    sync and before BMUF's global init net copies them; returns the synced checksums."""
    global_init = getattr(model, "_global_model_init_net", None)
    for net in model._data_parallel_model_init_nets:
        if net is not global_init:
            workspace.RunNetOnce(net)
    checksums = init_checksums(model, cfg)
    if cfg.get("resume"):
        checkpoint.load_model_checkpoint(model, cfg["resume"])
    else:
        set_params(model, cfg)
    if global_init is not None:
        workspace.RunNetOnce(global_init)
    data_parallel_model.CreateNet(model)
    return checksums


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train ``iters`` iterations from ``start`` (fresh params, or ``resume`` from a
    checkpoint); rank 0 saves one after ``save_at`` iterations."""
    model = build(cfg)
    result: dict[str, Any] = {"init": initialize(model, cfg)}
    start = cfg.get("start", 0)
    for iteration in range(start, start + cfg["iters"]):
        feed(model, cfg, iteration)
        data_parallel_model.RunNet(model, 1)
        if iteration + 1 == cfg.get("save_at") and cfg["rank"] == 0:
            checkpoint.save_model_checkpoint(model, cfg["checkpoint"])
    master = _params(model, cfg["devices"][0], computed=True)
    prefix = f"{model._device_prefix}_{cfg['devices'][0]}/"
    data_parallel_model.AllCompareBlobs(model, [prefix + name for name in master])
    result["params"] = {k: v.tolist() for k, v in master.items()}
    copies = [_params(model, device, computed=True) for device in cfg["devices"]]
    result["devices_agree"] = all(np.array_equal(value, copy[name])
                                  for copy in copies for name, value in master.items())
    return result


def scenario_train(cfg: dict[str, Any]) -> dict[str, Any]:
    return train(cfg)


def scenario_kill(cfg: dict[str, Any]) -> dict[str, Any]:
    """Rank ``victim`` dies after ``iters`` iterations; the others keep training."""
    model = build(cfg)
    data_parallel_model.RunInitNet(model)
    for iteration in range(cfg["iters"]):
        feed(model, cfg, iteration)
        data_parallel_model.RunNet(model, 1)
    if cfg["rank"] == cfg["victim"]:
        os.kill(os.getpid(), signal.SIGKILL)
    start = last_ok = time.monotonic()
    while time.monotonic() - start < 60:
        try:
            data_parallel_model.RunNet(model, 1)
        except Exception:
            _worker.EXTRA["stall"] = time.monotonic() - last_ok
            raise
        last_ok = time.monotonic()
    return {"error": "no failure"}


def scenario_sync(cfg: dict[str, Any]) -> dict[str, Any]:
    """The barrier nets, AddDistributedBlobSync, Synchronize and AllCompareBlobs."""
    model = build({**cfg, "blob_sync": True})
    data_parallel_model.RunInitNet(model)
    rank = cfg["rank"]
    workspace.FeedBlob("synced", np.full(3, rank + 1.0, np.float32))
    feed(model, cfg, 0)
    data_parallel_model.RunNet(model, 2)  # the barrier net twice, then the main net twice
    data_parallel_model.Synchronize(model, timeout_sec=cfg["timeout_ms"] / 1000)
    data_parallel_model.Synchronize(model, timeout_sec=cfg["timeout_ms"] / 1000)
    data_parallel_model.AllCompareBlobs(model, ["cpu_0/fc1_w", "cpu_0/ITER"])
    workspace.FeedBlob("mine", np.full(2, float(rank), np.float32))
    try:
        data_parallel_model.AllCompareBlobs(model, ["mine"])
        mismatch = ""
    except CollectiveError as error:
        mismatch = str(error)
    return {"synced": workspace.FetchBlob("synced").tolist(), "mismatch": mismatch,
            "iter": int(workspace.FetchBlob("cpu_0/ITER")[0])}


SCENARIOS = {"mh_train": scenario_train, "mh_kill": scenario_kill, "mh_sync": scenario_sync}


def run_rank(cfg: dict[str, Any], out_path: str) -> dict[str, Any]:
    _worker.SCENARIOS.update(SCENARIOS)
    return _worker.run_rank(cfg, out_path)


def launch(scenario: str, size: int, store: dict[str, Any], hard_timeout: float = 30.0,
           timeout_ms: int = 5000, **extra: Any) -> list[dict[str, Any]]:
    """Start ``size`` ranks running these scenarios; see ``_launch.launch``."""
    return _launch.launch(run_rank, rank_configs(scenario, size, store, timeout_ms, **extra),
                          hard_timeout)
