"""Gradient accumulation and compression across 2 processes (GLOO over a FileStore):
k micro-batches per rank equal the one-process large-batch run, no collective runs on the
non-sync calls, and float16 gradients go over the wire."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "dist"))
from _launch import launch  # noqa: E402  (rank processes with a hard timeout)

DEVICES = [0, 1]


#: scenario -> (accumulate_steps, further Parallelize keywords); one pair of processes runs
#: them all in turn (starting processes dominates the time)
SCENARIOS: dict[str, tuple[int, dict[str, Any]]] = {
    "k2": (2, {}),
    "k4_buckets": (4, {"gradient_bucket_mb": 0.0001}),
    "k2_float16": (2, {"gradient_dtype": "float16", "gradient_error_feedback": True}),
}


def _rank(cfg: dict[str, Any], out: str) -> None:
    """Per scenario: Parallelize over 2 CPU devices of this rank, train, record params and
    collectives per call."""
    try:
        sys.path[:0] = cfg["path"]
        from test_accumulate import build

        from dpgraph import core, data_parallel_model, workspace
        from dpgraph.runtime.operator import OpInstance

        data_parallel_model._DEFAULT_TIMEOUT_SEC = 20
        results = {}
        for scenario, (k, extra) in SCENARIOS.items():
            workspace.ResetWorkspace()
            net = core.Net("store")
            net.FileStoreHandlerCreate([], "store", path=cfg["store"], prefix=scenario)
            workspace.RunNetOnce(net)
            rdv = {"kv_handler": "store", "shard_id": cfg["rank"], "num_shards": 2,
                   "engine": "GLOO"}
            model = build(DEVICES, k, rendezvous=rdv, barrier_net_timeout_sec=20,
                          reset=False, **extra)
            results[scenario] = _train(model, cfg, k, OpInstance)
        Path(out).write_text(json.dumps({"ok": True, "scenarios": results}))
    except BaseException:  # noqa: BLE001 - reported to the test
        Path(out).write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))


def _train(model: Any, cfg: dict[str, Any], k: int, op_instance: Any) -> dict[str, Any]:
    from _parallel_helpers import _set_params, data, device_option
    from test_accumulate import COLLECTIVES

    from dpgraph import core, data_parallel_model, workspace

    for net in model._data_parallel_model_init_nets:
        workspace.RunNetOnce(net)
    _set_params(model, DEVICES, False)
    data_parallel_model.CreateNet(model)
    counts: list[int] = []
    names: list[Any] = []
    original = op_instance.run

    def counted(self: Any, blobs: Any, placement: Any) -> None:
        # every collective, Caffe2's pre-training Barrier included (gated to sync calls)
        if self.type in COLLECTIVES:
            counts[-1] += 1
            names.append((len(counts), self.type, self.inputs))
        original(self, blobs, placement)

    op_instance.run = counted
    try:
        per = 48 // (2 * len(DEVICES) * k)
        for step in range(2):
            full = data(step)
            for micro in range(k):
                for i, device in enumerate(DEVICES):
                    start = ((cfg["rank"] * len(DEVICES) + i) * k + micro) * per
                    with core.DeviceScope(device_option(False, device)):
                        for name in ("data", "label"):
                            workspace.FeedBlob(f"cpu_{device}/{name}",
                                               full[name][start:start + per])
                counts.append(0)
                data_parallel_model.RunNet(model, 1)
    finally:
        op_instance.run = original
    params = {str(p)[len("cpu_0/"):]: workspace.FetchBlob(str(p)).tolist()
              for p in model.GetParams("cpu_0/")}
    wire = [b for b in workspace.Blobs() if b.endswith("_float16")]
    dtypes = sorted({str(workspace.FetchBlob(b).dtype) for b in wire})
    return {"params": params, "collectives": counts, "wire_dtypes": dtypes, "names": names}


def _reference(**extra: Any) -> dict[str, np.ndarray]:
    """One process, 4 CPU devices, the whole batch per step (k = 1)."""
    from test_accumulate import run

    _, params = run([0, 1, 2, 3], 1, steps=2, **extra)
    return params


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both ranks' results of every scenario."""
    tmp_path = tmp_path_factory.mktemp("accumulate_dist")
    here = str(Path(__file__).parent)
    cfgs = [{"rank": rank, "store": str(tmp_path / "store"), "path": [here, str(Path(here).parent)]}
            for rank in range(2)]
    results = launch(_rank, cfgs, hard_timeout=180.0)
    assert all(r["ok"] for r in results), [r.get("error") for r in results]
    return [r["scenarios"] for r in results]


@pytest.mark.parametrize("scenario", ["k2", "k4_buckets"])
def test_two_processes_equal_the_large_batch_run(ranks: list[dict[str, Any]],
                                                 scenario: str) -> None:
    k = SCENARIOS[scenario][0]
    ref = _reference()
    for rank in ranks:
        result = rank[scenario]
        for name, value in ref.items():
            np.testing.assert_allclose(np.asarray(result["params"][name], np.float32), value,
                                       rtol=0, atol=1e-6, err_msg=name)
        # collectives only on every k-th call (and on each of those)
        synced = [i for i, c in enumerate(result["collectives"]) if c]
        assert synced == [k - 1, 2 * k - 1], result["names"]
        barriers = [name for name in result["names"] if name[1] == "Barrier"]
        assert [call - 1 for call, _, _ in barriers] == [k - 1, 2 * k - 1]


def test_two_processes_float16_on_the_wire(ranks: list[dict[str, Any]]) -> None:
    ref = _reference()
    results = [rank["k2_float16"] for rank in ranks]
    for result in results:
        assert result["wire_dtypes"] == ["float16"]
        for name, value in ref.items():
            np.testing.assert_allclose(np.asarray(result["params"][name], np.float32), value,
                                       rtol=0, atol=2e-3, err_msg=name)
    assert results[0]["params"] == results[1]["params"]
