"""Multi-host Parallelize: barrier nets, AddDistributedBlobSync, Synchronize, AllCompareBlobs,
and a rank killed mid-run (dpm-distributed-facts.md)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

import _multihost_worker as mh  # noqa: E402  (after the importorskip)

TIMEOUT_S = 2.0
SLACK_S = 5.0


def test_barrier_blob_sync_synchronize_and_allcompare(file_store: dict[str, Any]) -> None:
    results = mh.launch("mh_sync", 2, file_store, devices=[0, 1], timeout_ms=5000)
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
        # fed 1 and 2, summed across hosts (not devices) on each of the two runs of the net
        assert result["synced"] == [6.0] * 3
        assert result["iter"] == 2
        assert "'mine' differs across hosts" in result["mismatch"]
        assert "[0.0, 2.0]" in result["mismatch"]


def test_killed_rank_makes_the_others_time_out(file_store: dict[str, Any]) -> None:
    results = mh.launch("mh_kill", 3, file_store, devices=[0], iters=3, victim=1,
                        timeout_ms=int(TIMEOUT_S * 1000), hard_timeout=40)
    assert results[1]["ok"] is None and results[1]["returncode"] == -9
    for result in (results[0], results[2]):
        assert result["ok"] is False, result
        assert result["is_timeout"], result["message"]
        assert result["stall"] < TIMEOUT_S + SLACK_S
