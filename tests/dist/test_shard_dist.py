"""Sharded optimizer state over 2 processes x 2 devices (CPU, with and without buckets; and
virtual GPUs), GLOO over a FileStore.

Parameters equal the unsharded one-process run over 4 devices (to 1e-6: the cross-host
``Reduce`` adds the hosts' sums in another order than one process's ``Sum``); each rank
holds only the optimizer state of the parameters its devices own; a checkpoint gathered on
every rank holds the complete state, equal to the unsharded master's; loading it on every
rank re-shards it, and 2 more steps equal 12 uninterrupted unsharded steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

import _launch  # noqa: E402
import _shard_worker as sw  # noqa: E402

from dpgraph.checkpoint import read_checkpoint  # noqa: E402

UPDATES = ["momentum", "adam"]
ITERS = 10


def launch(store: dict[str, Any], updates: list[str], **extra: Any) -> list[dict[str, Any]]:
    configs = _launch.rank_configs("shard", 2, store, 15000, devices=[0, 1], iters=ITERS,
                                   updates=updates, **extra)
    results = _launch.launch(sw.run_rank, configs, 90.0)
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
    return results


@pytest.mark.parametrize("bucket_mb,gpu,updates", [
    (None, False, UPDATES), (0.0001, False, UPDATES), (None, True, ["adam"])])
def test_two_processes_of_two_devices(file_store: dict[str, Any], bucket_mb: Any, gpu: bool,
                                      updates: list[str]) -> None:
    results = launch(file_store, updates, bucket_mb=bucket_mb, gpu=gpu)
    prefix = "gpu" if gpu else "cpu"
    for update in updates:
        ref = sw.reference([0, 1, 2, 3], update, ITERS, gpu)
        longer = sw.reference([0, 1, 2, 3], update, ITERS + 2, gpu)["params"]
        got = [r[update] for r in results]
        assert got[0]["owner"] == got[1]["owner"]  # one plan on every rank
        for rank, entry in enumerate(got):
            for device, params in entry["params"].items():
                for name, value in params.items():
                    assert sw.close(value, ref["params"][name]), (update, rank, device, name)
            # only the state of the params this rank's devices own (ranks 2r, 2r + 1)
            expected = sorted(f"{prefix}_{r % 2}/{s}" for s, p in entry["state"].items()
                              if (r := entry["owner"][p]) // 2 == rank)
            assert entry["held"] == expected == entry["held_after"], (update, rank)
            assert entry["held_resumed"] == expected, (update, rank)
            for name, value in entry["resumed"].items():
                assert sw.close(value, longer[name]), (update, rank, "resumed", name)
            assert entry["allreduces"] == 0 and entry["reduces"] >= 1
            # the gathered checkpoint: complete, equal to the unsharded master's state
            for name, value in entry["checkpoint"].items():
                assert sw.close(value, ref["blobs"][name]), (update, rank, name)
            assert {f"{prefix}_0/{s}" for s in entry["state"]} <= set(entry["checkpoint"])
        for rank in (0, 1):  # each rank's file: the complete, identical state
            saved = read_checkpoint(f"{file_store['path']}_{update}_rank{rank}.ckpt")
            for name, value in got[1 - rank]["checkpoint"].items():
                np.testing.assert_array_equal(saved[name],
                                              np.asarray(value, dtype=saved[name].dtype))
