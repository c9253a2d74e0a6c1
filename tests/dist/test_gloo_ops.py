"""Nets with CreateCommonWorld and Gloo collectives, run by 2 and 3 processes on loopback."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _launch import run_ranks

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist


def _check_collectives(results: list[dict[str, Any]], size: int) -> None:
    for result in results:
        assert result["ok"], result.get("message") or result.get("stderr")
    xs = [np.arange(6, dtype=np.float32) + rank for rank in range(size)]
    total = sum(x + 10 * x for x in xs)
    for rank, result in enumerate(results):
        np.testing.assert_array_equal(result["cpu_0/g"], total)
        np.testing.assert_array_equal(result["cpu_1/g"], total)
        # Broadcast from the last rank (value size), then an Allreduce on the cloned world.
        np.testing.assert_array_equal(result["w"], np.full((2, 3), size * size))
        expected_r = sum(range(1, size + 1)) if rank == 0 else rank + 1
        np.testing.assert_array_equal(result["r"], np.full(4, expected_r))
        np.testing.assert_array_equal(  # rank-major, then local copy
            result["gathered"], np.stack([part for x in xs for part in (x, 10 * x)]))
        s_total = np.arange(size * 2, dtype=np.float32).reshape(size, 2) * sum(
            range(1, size + 1))
        np.testing.assert_array_equal(result["s_mine"], s_total[rank:rank + 1])
        ranks_sum = size * (size + 1) / 2
        np.testing.assert_array_equal(result["dag"], np.outer(np.arange(1, 7) * ranks_sum,
                                                              np.ones(5)))
        np.testing.assert_array_equal(result["dpm"], np.outer(np.arange(1, 6) * ranks_sum,
                                                              np.ones(3)))


def test_two_ranks_file_store(file_store: dict[str, Any]) -> None:
    _check_collectives(run_ranks("collectives", 2, file_store), 2)


def test_three_ranks_tcp_store(tcp_store: dict[str, Any]) -> None:
    _check_collectives(run_ranks("collectives", 3, tcp_store), 3)
