"""The collective-schedule check across processes: ranks whose nets differ in one collective
(a renamed blob, a different shape, a missing op) all raise CollectiveMismatchError within a
second; identical ranks pass and pay a few milliseconds."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")
pytestmark = pytest.mark.dist

import _launch  # noqa: E402
import _worker  # noqa: E402

from dpgraph import core, workspace  # noqa: E402
from dpgraph.errors import CollectiveMismatchError  # noqa: E402
from dpgraph.parallel import schedule_check  # noqa: E402

SHAPES = {"a_grad": (4, 3), "b_grad": (5,), "c_grad": (2, 2)}


def _net(variant: str) -> core.Net:
    """Three all-reduces over two common worlds; ``variant`` changes one on this rank."""
    net = core.Net("step")
    net.Proto().type = "dag"
    blobs = list(SHAPES)
    if variant == "renamed":
        blobs[1] = "b2_grad"
    if variant == "missing":
        blobs = blobs[:2]
    for index, blob in enumerate(blobs):
        world = "cw" if index % 2 == 0 else "cw_1"
        net.Allreduce([world, blob], [blob], engine="GLOO")
    return net


def scenario_schedule(cfg: dict[str, Any]) -> dict[str, Any]:
    _worker.create_world(cfg)
    init = core.Net("clone")
    init.CloneCommonWorld(["cw"], ["cw_1"], engine="GLOO")
    workspace.RunNetOnce(init)
    variant = cfg["variants"][cfg["rank"]]
    for blob, shape in SHAPES.items():
        if variant == "shape" and blob == "c_grad":
            shape = (4,)
        workspace.FeedBlob(blob[:-len("_grad")], np.zeros(shape, np.float32))
        workspace.FeedBlob(blob, np.full(shape, cfg["rank"] + 1.0, np.float32))
    workspace.FeedBlob("b2_grad", np.ones(5, np.float32))
    net = _net(variant)
    _barrier()
    start = time.monotonic()
    try:
        _check(net)
    except CollectiveMismatchError as error:
        return {"raised": True, "message": str(error), "seconds": time.monotonic() - start}
    first = time.monotonic() - start
    again = []
    for _ in range(5):
        _barrier()
        start = time.monotonic()
        _check(net)
        again.append(time.monotonic() - start)
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    return {"raised": False, "seconds": first, "again": again,
            "sum": workspace.FetchBlob("a_grad").tolist()}


def _check(net: core.Net) -> None:
    from dpgraph.runtime.api import current

    schedule_check.check_net(current(), net.Proto())


def _barrier() -> None:
    barrier = core.Net("barrier")
    barrier.Barrier(["cw"], [], engine="GLOO")
    workspace.RunNetOnce(barrier)


def run_rank(cfg: dict[str, Any], out_path: str) -> dict[str, Any]:
    _worker.SCENARIOS["schedule"] = scenario_schedule
    return _worker.run_rank(cfg, out_path)


def launch(store: dict[str, Any], variants: list[str], **extra: Any) -> list[dict[str, Any]]:
    configs = _launch.rank_configs("schedule", len(variants), store, 5000, variants=variants,
                                   **extra)
    return _launch.launch(run_rank, configs, 30.0)


def test_identical_ranks_pass_quickly(file_store: dict[str, Any]) -> None:
    results = launch(file_store, ["same", "same"])
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
        assert result["raised"] is False
        assert result["sum"] == np.full((4, 3), 3.0).tolist()
    # the rank that arrives last waits for nobody: its time is the check's own cost
    costs = sorted(min(times) for times in zip(*(r["again"] for r in results)))
    assert costs[len(costs) // 2] < 0.005, costs


@pytest.mark.parametrize("variant, needle", [
    ("renamed", "b2_grad"), ("shape", "c_grad [4 float32]"), ("missing", "no collective left"),
])
def test_one_differing_collective_raises_on_every_rank(file_store: dict[str, Any],
                                                       variant: str, needle: str) -> None:
    results = launch(file_store, ["same", variant])
    for result in results:
        assert result["ok"] is True, result.get("traceback", result)
        assert result["raised"] is True, result
        assert result["seconds"] < 1.0, result
        message = result["message"]
        assert "collective #" in message and needle in message, message
        assert "Ranks [1] differ from ranks [0]" in message or "ranks [1]" in message, message
    assert results[0]["message"] == results[1]["message"]


def test_off_switch(file_store: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(schedule_check.ENV_VAR, "0")
    assert not schedule_check.enabled()
    monkeypatch.setenv(schedule_check.ENV_VAR, "1")
    assert schedule_check.enabled()
