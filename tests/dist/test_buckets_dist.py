"""Gradient buckets across processes over Gloo on loopback: bucketed training equals the
per-blob graph bitwise for 2 processes x 2 devices (SGD, momentum, Adam; GLOO and the staged
other-engine path), and within float32 reassociation error for 3 processes.

Bound for more than 2 ranks: a ring all-reduce adds the ranks' values in an order that
depends on where an element falls in the buffer's chunks, so a gradient inside a bucket may
be summed in another order than alone: per element the difference is at most
``2 (p - 1) eps sum_r |g_r|`` (eps = 2^-24 for float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

import _launch  # noqa: E402
import _multihost_worker as mh  # noqa: E402
import _worker  # noqa: E402

from dpgraph import data_parallel_model, model_helper, optimizer, workspace  # noqa: E402

UPDATES = ("sgd", "momentum", "adam")


def _update_kwargs(update: str) -> dict[str, Any]:
    if update == "sgd":
        return {"param_update_builder_fun": mh.sgd}
    if update == "momentum":
        return {"optimizer_builder_fun":
                lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9, nesterov=False)}
    return {"optimizer_builder_fun": lambda m: optimizer.build_adam(m, 0.01)}


def _train(cfg: dict[str, Any], update: str, bucket_mb: Any) -> tuple[dict[str, Any], Any]:
    workspace.ResetWorkspace()
    if cfg.get("gpu"):
        workspace.SetVirtualGpus(len(cfg["devices"]))
    rdv = mh.rendezvous(cfg)
    data_parallel_model._DEFAULT_TIMEOUT_SEC = cfg["timeout_ms"] / 1000
    if rdv is not None and cfg.get("engine"):
        rdv["engine"] = cfg["engine"]
    model = model_helper.ModelHelper(name=f"buckets_{update}")
    data_parallel_model.Parallelize(
        model, lambda m: None, mh.forward, devices=cfg["devices"], rendezvous=rdv,
        cpu_device=not cfg.get("gpu"), use_nccl=cfg.get("use_nccl", False),
        barrier_net_timeout_sec=cfg["timeout_ms"] / 1000, gradient_bucket_mb=bucket_mb,
        **_update_kwargs(update))
    mh.initialize(model, cfg)
    for iteration in range(cfg["iters"]):
        mh.feed(model, cfg, iteration)
        data_parallel_model.RunNet(model, 1)
    return mh._params(model, cfg["devices"][0]), model


def scenario_buckets(cfg: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for update in cfg["updates"]:
        ref, _ = _train(cfg, update, None)
        got, model = _train(cfg, update, cfg["bucket_mb"])
        result[update] = {
            "bitwise": all(np.array_equal(ref[k], got[k]) for k in ref),
            "max_diff": max(float(np.max(np.abs(ref[k] - got[k]))) for k in ref),
            "scale": max(float(np.max(np.abs(ref[k]))) for k in ref),
            "buckets": model._gradient_buckets,
            "packs": sum(op.type == "GradientBucketPack" for op in model.net.Proto().op),
            "params": {k: v.tolist() for k, v in got.items()},
        }
    return result


def scenario_mismatch(cfg: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 buckets its gradients, rank 0 does not: the first run must refuse."""
    from dpgraph.errors import CollectiveMismatchError

    bucket_mb = 1 if cfg["rank"] == 1 else None
    try:
        _train(cfg, "sgd", bucket_mb)
    except CollectiveMismatchError as error:
        return {"raised": True, "message": str(error)}
    return {"raised": False}


def run_rank(cfg: dict[str, Any], out_path: str) -> dict[str, Any]:
    _worker.SCENARIOS["buckets"] = scenario_buckets
    _worker.SCENARIOS["mismatch"] = scenario_mismatch
    return _worker.run_rank(cfg, out_path)


def launch(store: dict[str, Any], size: int, scenario: str = "buckets",
           **extra: Any) -> list[dict[str, Any]]:
    configs = _launch.rank_configs(scenario, size, store, 15000, iters=3, **extra)
    results = _launch.launch(run_rank, configs, 90.0)
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
    return results


def test_two_processes_of_two_devices_bitwise(file_store: dict[str, Any]) -> None:
    results = launch(file_store, 2, devices=[0, 1], updates=list(UPDATES), bucket_mb=1e-4)
    for update in UPDATES:
        for result in results:
            assert result[update]["bitwise"], (update, result[update]["max_diff"])
            assert len(result[update]["buckets"]) == 2  # 104-byte buckets: 3 grads, then 1
            assert result[update]["packs"] == 4  # per bucket and device
        assert results[0][update]["params"] == results[1][update]["params"]


def test_staged_other_engine_on_virtual_gpus_bitwise(file_store: dict[str, Any]) -> None:
    results = launch(file_store, 2, devices=[0, 1], updates=["sgd"], bucket_mb=1, gpu=True,
                     use_nccl=True, engine="NCCL")
    for result in results:
        assert result["sgd"]["bitwise"], result["sgd"]["max_diff"]
        assert len(result["sgd"]["buckets"]) == 1


def test_three_processes_within_the_reassociation_bound(file_store: dict[str, Any]) -> None:
    results = launch(file_store, 3, devices=[0], updates=["sgd"], bucket_mb="auto")
    eps = 2.0 ** -24
    for result in results:
        # 3 SGD steps of lr 0.1 on gradients bounded by the params' scale
        bound = 3 * 0.1 * 2 * (3 - 1) * eps * 3 * max(1.0, result["sgd"]["scale"]) * 10
        assert result["sgd"]["max_diff"] <= bound, (result["sgd"]["max_diff"], bound)
    assert results[0]["sgd"]["params"] == results[1]["sgd"]["params"] == \
        results[2]["sgd"]["params"]


def test_runnet_runs_the_schedule_check(file_store: dict[str, Any]) -> None:
    """With the runtime's first-run hook wired, running the nets compares the schedules:
    here the init nets already differ (bucketing needs fewer common worlds), which is
    caught before any world is created instead of timing out in CreateCommonWorld."""
    from dpgraph.runtime import workspace as runtime_workspace

    if "run_first_run_checks" not in vars(runtime_workspace):
        pytest.skip("the runtime does not call dpgraph.runtime.first_run yet "
                    "(H-requests.md #2)")
    results = launch(file_store, 2, "mismatch", devices=[0])
    for result in results:
        assert result["raised"], result
        message = result["message"]
        assert "'allreduce_1_cw'" in message and "CloneCommonWorld" in message, message
        assert "ranks [1]: <nothing" in message, message


def test_calibrate_two_local_processes(tmp_path: Any) -> None:
    """``dpgraph plan --calibrate``: Gloo figures from two local ranks, saved and reloaded."""
    from dpgraph import cli
    from dpgraph.parallel.plan import load

    path = tmp_path / "cost.json"
    assert cli.main(["plan", "--calibrate", str(path), "--processes", "2"]) == 0
    model = load(path)
    gloo = model.backend("gloo")
    assert 0 <= gloo.alpha < 0.1 and 0 < gloo.beta < 1e-6  # faster than 1 MB/s
    assert model.flops_per_sec > 1e6 and model.backend("local").beta > 0
