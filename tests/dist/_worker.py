"""One rank of a multi-process test: ``python _worker.py '<json config>'``.

Runs a scenario through the dpgraph workspace (nets with CreateCommonWorld and collectives)
and prints one JSON line ``{"rank": ..., "ok": ..., ...}`` on stdout.  Config keys: ``rank``,
``size``, ``scenario``, ``store`` (``{"kind": "file", "path": ...}`` or ``{"kind": "tcp",
"port": ...}``), ``timeout_ms`` and scenario extras.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np

from dpgraph import core, workspace
from dpgraph.errors import CollectiveTimeoutError, RendezvousError

EXTRA: dict[str, Any] = {}


def store_net(cfg: dict[str, Any]) -> core.Net:
    net = core.Net("store_init")
    store = cfg["store"]
    if store["kind"] == "file":
        net.FileStoreHandlerCreate([], "store", path=store["path"], prefix="test")
    else:
        net.TCPStoreHandlerCreate([], "store", host="127.0.0.1", port=store["port"],
                                  is_master=int(cfg["rank"] == 0), prefix="test",
                                  timeout_ms=cfg["timeout_ms"])
    return net


def create_world(cfg: dict[str, Any], name: str = "cw", size: int | None = None,
                 engine: str = "GLOO") -> None:
    workspace.RunNetOnce(store_net(cfg))
    net = core.Net("create_world")
    net.CreateCommonWorld("store", name, size=cfg["size"] if size is None else size,
                          rank=cfg["rank"], engine=engine, timeout_ms=cfg["timeout_ms"])
    start = time.monotonic()
    try:
        workspace.RunNetOnce(net)
    finally:
        EXTRA["create_s"] = time.monotonic() - start


def scenario_collectives(cfg: dict[str, Any]) -> dict[str, Any]:
    """Allreduce over two local copies, Broadcast, Reduce, Allgather, ReduceScatter, Barrier,
    and an Allreduce on a cloned world, all as nets in the workspace."""
    rank, size = cfg["rank"], cfg["size"]
    create_world(cfg)
    x = np.arange(6, dtype=np.float32) + rank
    workspace.FeedBlob("cpu_0/g", x)
    workspace.FeedBlob("cpu_1/g", 10 * x)
    workspace.FeedBlob("w", np.full((2, 3), rank + 1, np.float64))
    workspace.FeedBlob("r", np.full(4, rank + 1, np.int64))
    workspace.FeedBlob("s", np.arange(size * 2, dtype=np.float32).reshape(size, 2) * (rank + 1))
    net = core.Net("collectives")
    net.Allgather(["cw", "cpu_0/g", "cpu_1/g"], ["gathered"], engine="GLOO")
    net.Allreduce(["cw", "cpu_0/g", "cpu_1/g"], ["cpu_0/g", "cpu_1/g"], engine="GLOO")
    net.Broadcast(["cw", "w"], ["w"], root=size - 1, engine="GLOO")
    net.Reduce(["cw", "r"], ["r"], root=0, engine="GLOO")
    net.ReduceScatter(["cw", "s"], ["s_mine"], engine="GLOO")
    net.Barrier(["cw"], [], engine="GLOO")
    net.CloneCommonWorld(["cw"], ["cw_clone"], engine="GLOO")
    net.Allreduce(["cw_clone", "w"], ["w"], engine="GLOO")
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    names = ["cpu_0/g", "cpu_1/g", "w", "r", "gathered", "s_mine"]
    result = {name: workspace.FetchBlob(name).tolist() for name in names}
    result["dag"] = dag_allreduces(rank).tolist()
    result["dpm"] = dpm_allreduces(rank, size).tolist()
    return result


def dag_allreduces(rank: int, count: int = 6, slots: int = 2) -> np.ndarray:
    """Parallelize's pattern on a "dag" net: collectives spread over ``slots`` common worlds
    (created once, then cloned), each chained to the previous one on its slot."""
    init = core.Net("dag_init")
    for slot in range(1, slots):
        init.CloneCommonWorld(["cw"], [f"cw_{slot}"], engine="GLOO")
    workspace.RunNetOnce(init)
    net = core.Net("dag")
    net.Proto().type = "dag"
    net.Proto().num_workers = 4
    previous: dict[int, str] = {}
    for k in range(count):
        blob = f"grad_{k}"
        workspace.FeedBlob(blob, np.full(5, (rank + 1) * (k + 1), np.float32))
        slot = k % slots
        world = "cw" if slot == 0 else f"cw_{slot}"
        net.Allreduce([world, blob], [blob], engine="GLOO",
                      control_input=[previous[slot]] if slot in previous else None)
        previous[slot] = blob
    workspace.RunNetOnce(net)
    return np.stack([workspace.FetchBlob(f"grad_{k}") for k in range(count)])


def dpm_allreduces(rank: int, size: int, count: int = 5) -> np.ndarray:
    """The same through Parallelize's own CollectivesConcurrencyControl (2 slots), which
    emits CreateCommonWorld, then CloneCommonWorld, from a typed Rendezvous."""
    from dpgraph.collectives import Rendezvous
    from dpgraph.parallel.collectives_control import CollectivesConcurrencyControl

    rendezvous = Rendezvous("store", shard_id=rank, num_shards=size)
    init, net = core.Net("dpm_init"), core.Net("dpm")
    net.Proto().type = "dag"
    control = CollectivesConcurrencyControl("allreduce", 2, init, rendezvous)
    for k in range(count):
        blob = f"dpm_grad_{k}"
        workspace.FeedBlob(blob, np.full(3, (rank + 1) * (k + 1), np.float32))
        world, control_input = control.get_control_and_context(blob)
        net.Allreduce([world, blob], [blob], engine="GLOO", control_input=control_input)
    assert [op.type for op in init.Proto().op] == ["CreateCommonWorld", "CloneCommonWorld"]
    workspace.RunNetOnce(init)
    workspace.RunNetOnce(net)
    return np.stack([workspace.FetchBlob(f"dpm_grad_{k}") for k in range(count)])


def scenario_kill(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every rank allreduces in a loop; rank ``victim`` kills itself after ``iters`` rounds
    (``mode="kill"``) or stops taking part (``mode="hang"``)."""
    create_world(cfg)
    workspace.FeedBlob("g", np.ones(1024, np.float32))
    net = core.Net("step")
    net.Allreduce(["cw", "g"], ["g"], engine="GLOO")
    workspace.CreateNet(net)
    for _ in range(cfg["iters"]):
        workspace.RunNet(net.Name())
    if cfg["rank"] == cfg["victim"]:
        if cfg["mode"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(cfg["timeout_ms"] / 1000 + 2)  # alive but silent past the timeout
        return {"silent": True}
    start = last_ok = time.monotonic()
    while time.monotonic() - start < 60:
        try:
            workspace.RunNet(net.Name())
        except Exception:
            EXTRA["stall"] = time.monotonic() - last_ok
            raise
        last_ok = time.monotonic()
    return {"error": "no failure"}


def scenario_create_only(cfg: dict[str, Any]) -> dict[str, Any]:
    """Create a common world with per-rank ``sizes``/``engines`` (for mismatch tests)."""
    rank = cfg["rank"]
    size = cfg.get("sizes", {}).get(str(rank))
    engine = cfg.get("engines", {}).get(str(rank), "GLOO")
    create_world(cfg, size=size, engine=engine)
    return {}


SCENARIOS = {"collectives": scenario_collectives, "kill": scenario_kill,
             "create_only": scenario_create_only}


def run_rank(cfg: dict[str, Any], out_path: str | None = None) -> dict[str, Any]:
    """Run one rank's scenario; write its JSON result to ``out_path`` (or print it)."""
    start = time.monotonic()
    result: dict[str, Any] = {"rank": cfg["rank"]}
    try:
        result.update(SCENARIOS[cfg["scenario"]](cfg))
        result["ok"] = True
    except Exception as error:
        result.update(ok=False, error_type=type(error).__name__, message=str(error),
                      is_timeout=isinstance(error, CollectiveTimeoutError),
                      is_rendezvous=isinstance(error, RendezvousError),
                      traceback=traceback.format_exc(limit=3))
    result["elapsed"] = time.monotonic() - start
    result.update(EXTRA)
    if out_path is None:
        print(json.dumps(result), flush=True)
    else:
        with open(out_path, "w") as out:
            json.dump(result, out)
    return result


if __name__ == "__main__":
    run_rank(json.loads(sys.argv[1]))
