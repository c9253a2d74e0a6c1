"""Gradient accumulation and compression across 2 processes (GLOO over a FileStore):
k micro-batches per rank equal the one-process large-batch run, no collective runs on the
non-sync calls, and float16 gradients go over the wire."""

from __future__ import annotations

import json
import multiprocessing
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: one process per rank, started fresh (no threads inherited from the test process)
CONTEXT = multiprocessing.get_context("spawn")
DEVICES = [0, 1]


def _rank(cfg: dict[str, Any], out: str) -> None:
    """Parallelize over 2 CPU devices of this rank, train, write params and op counts."""
    try:
        sys.path[:0] = cfg["path"]
        from test_accumulate import OpLog, build, feed_micro_batch  # noqa: F401

        from dpgraph import data_parallel_model, workspace
        from dpgraph.runtime.operator import OpInstance

        workspace.ResetWorkspace()
        net = __import__("dpgraph").core.Net("store")
        net.FileStoreHandlerCreate([], "store", path=cfg["store"], prefix="acc")
        workspace.RunNetOnce(net)
        data_parallel_model._DEFAULT_TIMEOUT_SEC = 20
        rdv = {"kv_handler": "store", "shard_id": cfg["rank"], "num_shards": 2,
               "engine": "GLOO"}
        k = cfg["k"]
        model = build(DEVICES, k, rendezvous=rdv, barrier_net_timeout_sec=20,
                      reset=False, **cfg["extra"])
        result = _train(model, cfg, k, OpInstance)
        Path(out).write_text(json.dumps({"ok": True, **result}))
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
    per = 48 // (2 * len(DEVICES) * k)
    for step in range(2):
        full = data(step)
        for micro in range(k):
            for i, device in enumerate(DEVICES):
                start = ((cfg["rank"] * len(DEVICES) + i) * k + micro) * per
                with core.DeviceScope(device_option(False, device)):
                    for name in ("data", "label"):
                        workspace.FeedBlob(f"cpu_{device}/{name}", full[name][start:start + per])
            counts.append(0)
            data_parallel_model.RunNet(model, 1)
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


def _launch(tmp_path: Path, k: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    here = str(Path(__file__).parent)
    path = [here, str(Path(here).parent)]
    procs = []
    for rank in range(2):
        cfg = {"rank": rank, "k": k, "extra": extra, "store": str(tmp_path / "store"),
               "path": path}
        out = tmp_path / f"rank{rank}.json"
        proc = CONTEXT.Process(target=_rank, args=(cfg, str(out)), daemon=True)
        proc.start()
        procs.append((proc, out))
    results = []
    for proc, out in procs:
        proc.join(120)
        if proc.is_alive():
            proc.kill()
        results.append(json.loads(out.read_text()) if out.exists() else {"ok": None})
    return results


@pytest.mark.parametrize("k,extra", [
    (2, {}), (4, {"gradient_bucket_mb": 0.0001}),
])
def test_two_processes_equal_the_large_batch_run(tmp_path: Path, k: int,
                                                 extra: dict[str, Any]) -> None:
    results = _launch(tmp_path, k, extra)
    assert all(r["ok"] for r in results), [r.get("error") for r in results]
    ref = _reference()
    for result in results:
        for name, value in ref.items():
            np.testing.assert_allclose(np.asarray(result["params"][name], np.float32), value,
                                       rtol=0, atol=1e-6, err_msg=name)
        # collectives only on every k-th call (and on each of those)
        synced = [i for i, c in enumerate(result["collectives"]) if c]
        assert synced == [k - 1, 2 * k - 1], result["names"]
        barriers = [name for name in result["names"] if name[1] == "Barrier"]
        assert [call - 1 for call, _, _ in barriers] == [k - 1, 2 * k - 1]


def test_two_processes_float16_on_the_wire(tmp_path: Path) -> None:
    results = _launch(tmp_path, 2, {"gradient_dtype": "float16",
                                    "gradient_error_feedback": True})
    assert all(r["ok"] for r in results), [r.get("error") for r in results]
    ref = _reference()
    for result in results:
        assert result["wire_dtypes"] == ["float16"]
        for name, value in ref.items():
            np.testing.assert_allclose(np.asarray(result["params"][name], np.float32), value,
                                       rtol=0, atol=2e-3, err_msg=name)
    assert results[0]["params"] == results[1]["params"]
