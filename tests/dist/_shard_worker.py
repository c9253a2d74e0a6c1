"""Ranks of the sharded-optimizer-state tests (``shard_optimizer_state=True`` across hosts),
on the ``_worker`` harness and the ``_multihost_worker`` model and data: device ``i`` of rank
``r`` gets slice ``r * len(devices) + i`` of each global batch, so a one-process run over
``size * len(devices)`` devices is the reference."""

from __future__ import annotations

from typing import Any

import _multihost_worker as mh
import _worker
import numpy as np

from dpgraph import checkpoint, data_parallel_model, model_helper, optimizer, workspace


def optimizer_fun(update: str) -> Any:
    if update == "momentum":
        return lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9, nesterov=False)
    return lambda m: optimizer.build_adam(m, 0.01)


def train(cfg: dict[str, Any], update: str, shard: bool, bucket_mb: Any = None,
          start: int = 0) -> Any:
    """This rank's model after ``iters`` iterations from ``start`` (a one-process run
    without a store; ``cfg["resume"]``: load that checkpoint first)."""
    workspace.ResetWorkspace()
    if cfg.get("gpu"):
        workspace.SetVirtualGpus(len(cfg["devices"]))
    rdv = mh.rendezvous(cfg)
    if rdv is not None:
        data_parallel_model._DEFAULT_TIMEOUT_SEC = cfg["timeout_ms"] / 1000
    model = model_helper.ModelHelper(name=f"shard_{update}")
    data_parallel_model.Parallelize(
        model, lambda m: None, mh.forward, devices=cfg["devices"], rendezvous=rdv,
        cpu_device=not cfg.get("gpu"), barrier_net_timeout_sec=cfg["timeout_ms"] / 1000,
        optimizer_builder_fun=optimizer_fun(update), shard_optimizer_state=shard,
        gradient_bucket_mb=bucket_mb)
    mh.initialize(model, cfg)
    for iteration in range(start, start + cfg["iters"]):
        mh.feed(model, cfg, iteration)
        data_parallel_model.RunNet(model, 1)
    return model


def _listing(model: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Params of every local device, the state blobs this rank holds, the plan."""
    plan = model._shard_plan
    held = sorted(b for b in workspace.Blobs() if b.split("/", 1)[-1] in plan.state)
    return {
        "params": {str(d): {k: v.tolist() for k, v in mh._params(model, d).items()}
                   for d in cfg["devices"]},
        "held": held, "owner": dict(plan.owner), "state": dict(plan.state),
        "reduces": sum(op.type == "Reduce" for op in model.net.Proto().op),
        "allreduces": sum(op.type == "Allreduce" for op in model.net.Proto().op),
    }


def scenario_shard(cfg: dict[str, Any]) -> dict[str, Any]:
    """Per update: train sharded; list params and held state; save a checkpoint on every
    rank (the state is gathered from every host), then drop the gathered copies; optionally
    with buckets."""
    result: dict[str, Any] = {}
    for update in cfg["updates"]:
        model = train(cfg, update, True, cfg.get("bucket_mb"))
        entry = _listing(model, cfg)
        path = f"{cfg['store']['path']}_{update}_rank{cfg['rank']}.ckpt"
        names = checkpoint.save_model_checkpoint(model, path)
        entry["checkpoint"] = {n: workspace.FetchBlob(n).tolist() for n in names
                               if n.startswith(f"{model._device_prefix}_0/")}
        mh.feed(model, cfg, 0)
        data_parallel_model.RunNet(model, 1)  # releases the gathered copies
        entry["held_after"] = sorted(b for b in workspace.Blobs()
                                     if b.split("/", 1)[-1] in model._shard_plan.state)
        # a fresh process's view: load this rank's file (re-sharded), train 2 more steps
        resumed = train({**cfg, "resume": path, "iters": 2}, update, True,
                        cfg.get("bucket_mb"), start=cfg["iters"])
        entry["resumed"] = {k: v.tolist() for k, v in mh._params(resumed, 0).items()}
        entry["held_resumed"] = sorted(b for b in workspace.Blobs()
                                       if b.split("/", 1)[-1] in resumed._shard_plan.state)
        result[update] = entry
    return result


def reference(devices: list[int], update: str, iters: int, gpu: bool = False
              ) -> dict[str, Any]:
    """The unsharded one-process run over every device: master params and state."""
    cfg = {"rank": 0, "size": 1, "devices": devices, "iters": iters, "store": None,
           "timeout_ms": 20000, "gpu": gpu}
    model = train(cfg, update, False)
    master = f"{model._device_prefix}_0/"
    blobs = {n: workspace.FetchBlob(n) for n in workspace.Blobs() if n.startswith(master)}
    return {"params": mh._params(model, 0), "blobs": blobs}


def run_rank(cfg: dict[str, Any], out_path: str) -> dict[str, Any]:
    _worker.SCENARIOS["shard"] = scenario_shard
    return _worker.run_rank(cfg, out_path)


def close(a: Any, b: Any) -> bool:
    return bool(np.allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6))
