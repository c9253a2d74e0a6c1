"""Faults never hang: dead, silent or missing peers raise CollectiveTimeoutError within the
timeout plus a few seconds; mismatched settings raise RendezvousError at creation."""

from __future__ import annotations

from typing import Any

import pytest
from _launch import run_ranks

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

TIMEOUT_S = 3.0
SLACK_S = 5.0


def _survivors(results: list[dict[str, Any]], victim: int) -> list[dict[str, Any]]:
    return [r for r in results if r["rank"] != victim]


def test_killed_rank_makes_the_others_time_out(file_store: dict[str, Any]) -> None:
    results = run_ranks("kill", 3, file_store, timeout_ms=int(TIMEOUT_S * 1000), victim=1,
                        iters=3, mode="kill")
    assert results[1]["ok"] is None and results[1]["returncode"] == -9
    for result in _survivors(results, 1):
        assert result["ok"] is False, result
        assert result["is_timeout"], result["message"]
        assert "'cw'" in result["message"] and "allreduce" in result["message"]
        assert "rank" in result["message"] and "1 (pid" in result["message"]
        assert f"timeout {TIMEOUT_S:g}s" in result["message"]
        assert result["stall"] < TIMEOUT_S + SLACK_S


def test_silent_rank_makes_the_others_time_out(tcp_store: dict[str, Any]) -> None:
    results = run_ranks("kill", 2, tcp_store, timeout_ms=2000, victim=0, iters=2,
                        mode="hang", hard_timeout=20)
    assert results[0]["silent"]
    (survivor,) = _survivors(results, 0)
    assert survivor["ok"] is False and survivor["is_timeout"], survivor
    assert "still running" in survivor["message"]
    assert 1.5 < survivor["stall"] < 2.0 + SLACK_S


def test_rank_that_never_joins(file_store: dict[str, Any]) -> None:
    results = run_ranks("create_only", 3, file_store, processes=2, timeout_ms=1500)
    for result in results:
        assert result["ok"] is False and result["is_timeout"], result
        assert "ranks [2] did not join" in result["message"]
        assert 1.4 < result["create_s"] < 1.5 + SLACK_S


@pytest.mark.parametrize("what", ["size", "engine"])
def test_mismatched_settings(file_store: dict[str, Any], what: str) -> None:
    extra = ({"sizes": {"1": 3}} if what == "size" else {"engines": {"1": "NCCL"}})
    results = run_ranks("create_only", 2, file_store, timeout_ms=20000, **extra)
    for result in results:
        assert result["ok"] is False and result["is_rendezvous"], result
        label = "num_shards (size)" if what == "size" else "engine"
        assert label in result["message"]
        assert result["create_s"] < 10.0  # found as soon as the peer arrives, no timeout

