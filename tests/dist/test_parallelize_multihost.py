"""Multi-host Parallelize, run: several processes on loopback train the same model as one
process with the whole batch (dpm-distributed-facts.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

import _multihost_worker as mh  # noqa: E402  (after the importorskip)

TIMEOUT_MS = 5000


def reference(devices: list[int], **extra: Any) -> dict[str, np.ndarray]:
    """One process, no rendezvous, the whole batch over ``devices``."""
    cfg = {"rank": 0, "size": 1, "store": None, "devices": devices, "iters": 10,
           "timeout_ms": TIMEOUT_MS, **extra}
    return {k: np.asarray(v) for k, v in mh.train(cfg)["params"].items()}


@pytest.fixture(scope="module")
def ref_4_devices() -> dict[str, np.ndarray]:
    return reference([0, 1, 2, 3])


def check_ranks(results: list[dict[str, Any]], ref: dict[str, np.ndarray]) -> None:
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
        assert result["devices_agree"]
        assert sorted(result["params"]) == sorted(ref)
        for name, value in ref.items():
            np.testing.assert_allclose(result["params"][name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=name)
    first = results[0]["params"]
    for result in results[1:]:  # every host holds bitwise the same model
        assert result["params"] == first
    inits = [result["init"] for result in results]  # the init nets synced rank 0's params
    for name in inits[0]:
        values = {v for init in inits for v in init[name]}
        assert len(values) == 1, (name, values)


def test_two_hosts_of_two_devices_match_one_host(file_store: dict[str, Any],
                                                 ref_4_devices: dict[str, np.ndarray]) -> None:
    results = mh.launch("mh_train", 2, file_store, devices=[0, 1], iters=10)
    check_ranks(results, ref_4_devices)
    check_ranks(results, reference([0]))  # and one device with the whole batch


def test_three_hosts_of_one_device_over_tcp(tcp_store: dict[str, Any],
                                            ref_4_devices: dict[str, np.ndarray]) -> None:
    results = mh.launch("mh_train", 3, tcp_store, devices=[0], iters=10)
    check_ranks(results, ref_4_devices)


def test_other_engine_on_virtual_gpus(file_store: dict[str, Any],
                                      ref_4_devices: dict[str, np.ndarray]) -> None:
    """engine NCCL: NCCLAllreduce across the local virtual GPUs, the staged ``_red``
    all-reduce across hosts (host buffers: the nccl backend's Gloo world), then local
    broadcasts."""
    results = mh.launch("mh_train", 2, file_store, devices=[0, 1], iters=10, gpu=True,
                        use_nccl=True, engine="NCCL")
    check_ranks(results, ref_4_devices)


def test_computed_params_are_broadcast_across_hosts(file_store: dict[str, Any]) -> None:
    """SpatialBN running statistics: rank 0's first device's, everywhere, as on one host."""
    results = mh.launch("mh_train", 2, file_store, devices=[0, 1], iters=10, bn=True)
    check_ranks(results, reference([0, 1, 2, 3], bn=True))
    assert {"bn_rm", "bn_riv"} <= set(results[0]["params"])


def test_bmuf_over_two_hosts_matches_one_host(file_store: dict[str, Any]) -> None:
    """Parallelize_BMUF: params all-reduced over devices and hosts after every block."""
    results = mh.launch("mh_train", 2, file_store, devices=[0, 1], iters=5, bmuf=True)
    check_ranks(results, reference([0, 1, 2, 3], iters=5, bmuf=True))


def test_resume_from_checkpoint_is_bitwise(file_store: dict[str, Any], tmp_path: Any) -> None:
    path = str(tmp_path / "ckpt.pb")
    whole = mh.launch("mh_train", 2, file_store, devices=[0, 1], iters=20, save_at=10,
                      checkpoint=path)
    assert all(r["ok"] is True for r in whole), whole
    store = {"kind": "file", "path": str(tmp_path / "rendezvous2")}
    resumed = mh.launch("mh_train", 2, store, devices=[0, 1], iters=10, start=10,
                        resume=path)
    for before, after in zip(whole, resumed):
        assert after["ok"] is True, after.get("traceback", after)
        assert after["params"] == before["params"]  # bitwise
