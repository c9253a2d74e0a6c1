"""Rendezvous: the typed form, Caffe2's dict form, torchrun's environment, world membership."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from _launch import free_port

from dpgraph import workspace
from dpgraph.collectives import Rendezvous, as_rendezvous, file_store, rendezvous_from_env
from dpgraph.collectives.rendezvous import ENV_STORE_BLOB, join_world
from dpgraph.errors import CollectiveTimeoutError, RendezvousError
from dpgraph.ir.blob import BlobReference

pytest.importorskip("torch.distributed", reason="stores need torch")


def test_legacy_round_trip() -> None:
    legacy = {"kv_handler": "store_handler", "shard_id": 1, "num_shards": 2,
              "engine": "GLOO", "transport": "tcp", "interface": "eth0",
              "mpi_rendezvous": False}
    rdv = Rendezvous.from_legacy(legacy)
    assert (rdv.store, rdv.shard_id, rdv.num_shards, rdv.interface) == (
        "store_handler", 1, 2, "eth0")
    assert rdv.kv_handler == "store_handler" and rdv.store_is_blob and rdv.is_multi_host
    assert rdv.timeout == 30.0
    assert rdv.to_legacy() == legacy
    assert as_rendezvous(legacy) == rdv and as_rendezvous(rdv) is rdv
    assert as_rendezvous(None) is None
    assert Rendezvous(BlobReference("s"), 0, 2).store_is_blob
    with pytest.raises(dataclasses.FrozenInstanceError):
        rdv.shard_id = 0  # type: ignore[misc]


def test_legacy_defaults_and_errors() -> None:
    rdv = as_rendezvous({"kv_handler": "h", "shard_id": 0, "num_shards": 1})
    assert rdv is not None and rdv.engine == "GLOO" and rdv.transport == "tcp"
    assert not rdv.is_multi_host
    with pytest.raises(RendezvousError, match=r"lacks \['kv_handler'\]"):
        as_rendezvous({"shard_id": 0, "num_shards": 2})
    with pytest.raises(RendezvousError, match="shard_id must be"):
        Rendezvous("h", shard_id=2, num_shards=2)
    with pytest.raises(RendezvousError, match="num_shards"):
        Rendezvous("h", shard_id=0, num_shards=0)
    with pytest.raises(RendezvousError, match="transport"):
        Rendezvous("h", 0, 2, transport="udp")
    with pytest.raises(RendezvousError, match="need a store"):
        Rendezvous(None, 0, 2)
    with pytest.raises(RendezvousError, match="must be a Rendezvous"):
        as_rendezvous(42)  # type: ignore[arg-type]


def test_from_env() -> None:
    single = rendezvous_from_env(environ={"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"})
    assert single.num_shards == 1 and single.store is None
    with pytest.raises(RendezvousError, match="WORLD_SIZE"):
        rendezvous_from_env(environ={"RANK": "0"})
    port = str(free_port())
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": port}
    master = rendezvous_from_env(environ=env, timeout=5, blob=None)
    worker = rendezvous_from_env(environ={**env, "RANK": "1", "LOCAL_RANK": "1"}, timeout=5,
                                 blob=None)
    assert (master.shard_id, worker.shard_id, worker.local_rank) == (0, 1, 1)
    master.store.set("k", "v")
    assert bytes(worker.store.get("k")) == b"v"
    # By default the store goes into the workspace and the rendezvous names its blob.
    named = rendezvous_from_env(environ={**env, "RANK": "1"}, timeout=5)
    assert named.store == ENV_STORE_BLOB and named.store_is_blob
    assert bytes(workspace.FetchBlob(ENV_STORE_BLOB).get("k")) == b"v"
    workspace.ResetWorkspace()


def _join_all(path: Path, specs: list[dict[str, Any]], timeout: float) -> list[Any]:
    results: list[Any] = [None] * len(specs)
    store = file_store(str(path))

    def run(index: int, spec: dict[str, Any]) -> None:
        try:
            results[index] = join_world(store, "cw", timeout=timeout, **spec)
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(specs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 10)
    return results


def test_join_world_generations_and_checks(tmp_path: Path) -> None:
    spec = {"size": 2, "engine": "GLOO", "transport": "tcp"}
    first = _join_all(tmp_path, [{"rank": 0, **spec}, {"rank": 1, **spec}], 5)
    second = _join_all(tmp_path, [{"rank": 0, **spec}, {"rank": 1, **spec}], 5)
    (prefix0, members), (prefix1, _) = first
    assert prefix0 == prefix1 and sorted(members) == [0, 1]
    assert second[0][0] == second[1][0] != prefix0  # a fresh prefix per creation
    dup = _join_all(tmp_path / "dup", [{"rank": 0, **spec}, {"rank": 0, **spec},
                                       {"rank": 1, **spec}], 1)
    assert sum(isinstance(r, (RendezvousError, CollectiveTimeoutError)) for r in dup) >= 1
    with pytest.raises(RendezvousError, match="outside"):
        join_world(file_store(str(tmp_path / "x")), "cw", 3, 2, "GLOO", "tcp", 1)
    (lonely,) = _join_all(tmp_path / "lonely", [{"rank": 0, **spec}], 0.3)
    assert isinstance(lonely, CollectiveTimeoutError) and "ranks [1] did not join" in str(lonely)


def test_a_failing_store_is_a_typed_error() -> None:
    class Gone:
        def add(self, key: str, value: int) -> int:
            raise RuntimeError("Connection reset by peer")

    with pytest.raises(CollectiveTimeoutError, match="rendezvous store failed"):
        join_world(Gone(), "cw", 0, 2, "GLOO", "tcp", 1.0)
