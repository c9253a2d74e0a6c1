"""The collective-schedule check in one process: schedules, comparison and the error, with
a stand-in store playing rank 1 (tests/dist/test_buckets_schedule.py runs real ranks)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _parallel_helpers import build

from dpgraph import core, workspace
from dpgraph.errors import CollectiveError, CollectiveMismatchError
from dpgraph.parallel import schedule_check
from dpgraph.runtime.api import current


class PeerStore:
    """A store whose rank 1 answers with the digests or lists of ``peer`` (a schedule)."""

    def __init__(self, peer: dict[str, list[str]]) -> None:
        self.peer = peer
        self.data: dict[str, bytes] = {}
        self.sets = 0

    def set(self, key: str, value: str) -> None:
        self.sets += 1
        self.data[key] = value.encode()
        mine = json.loads(value)
        base = key.rsplit("/", 1)[0]
        if base.endswith("/entries"):
            answer = {n: self.peer.get(n, []) for n in mine}
        else:
            answer = {n: schedule_check.digest(v) for n, v in self.peer.items()}
        self.data[f"{base}/1"] = json.dumps(answer).encode()

    def wait(self, keys: list[str], timeout: Any) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise RuntimeError(f"timeout waiting for {missing}")

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


class FakeWorld:
    def __init__(self, store: Any) -> None:
        self.store, self.rank, self.size, self.timeout, self.name = store, 0, 2, 1.0, "cw"


def _net(blobs: list[str]) -> core.Net:
    net = core.Net("step")
    for blob in blobs:
        net.Allreduce(["cw", blob], [blob], engine="GLOO")
    return net


def _feed() -> None:
    workspace.FeedBlob("w", np.zeros((4, 3), np.float32))
    workspace.FeedBlob("b", np.zeros(3, np.float32))


def test_schedule_lists_blobs_shapes_dtypes_and_reduction() -> None:
    _feed()
    net = _net(["w_grad", "b_grad"])
    net.Broadcast(["cw", "b"], ["b"], root=1, engine="GLOO")
    schedule = schedule_check.collective_schedule(net.Proto(), current())
    assert schedule == {"cw": [
        "Allreduce[GLOO](w_grad [4x3 float32]) -> ['w_grad'] sum",
        "Allreduce[GLOO](b_grad [3 float32]) -> ['b_grad'] sum",
        "Broadcast[GLOO](b [3 float32]) -> ['b'] root 1"]}


def test_bucket_shapes_are_derived_through_pack() -> None:
    _feed()
    net = core.Net("buckets")
    net.GradientBucketPack(["w_grad", "b_grad"], ["bucket"])
    net.Allreduce(["cw", "bucket"], ["bucket"], engine="GLOO")
    (entry,) = schedule_check.collective_schedule(net.Proto(), current())["cw"]
    assert "bucket [15 float32]" in entry


def test_parallelized_graph_schedule_per_world() -> None:
    """World creation and every gradient collective of a multi-host Parallelize graph."""
    from dpgraph.collectives import Rendezvous

    workspace.FeedBlob("store", np.zeros(1, np.float32))
    model = build([0], rendezvous=Rendezvous("store", shard_id=0, num_shards=2),
                  gradient_bucket_mb=1)
    main = schedule_check.collective_schedule(model.net.Proto(), current())
    assert [len(v) for v in main.values()] == [1]
    assert "cpu_0/grad_bucket_0" in next(iter(main.values()))[0]
    init = schedule_check.collective_schedule(model.param_init_net.Proto(), current())
    assert any(entries[0].startswith("CreateCommonWorld[GLOO](size 2") for entries in
               init.values())


def test_identical_peer_passes_with_one_exchange() -> None:
    _feed()
    net = _net(["w_grad", "b_grad"])
    store = PeerStore(schedule_check.collective_schedule(net.Proto(), current()))
    current().set_blob("cw", FakeWorld(store), None)
    schedule_check.check_net(current(), net.Proto())
    assert store.sets == 1


@pytest.mark.parametrize("peer_blobs, needle", [
    (["w_grad", "c_grad"], "c_grad"),
    (["w_grad"], "<nothing: no collective left>"),
    (["b_grad", "w_grad"], "collective #0"),
])
def test_differing_peer_raises_naming_the_collective(peer_blobs: list[str],
                                                     needle: str) -> None:
    _feed()
    peer = schedule_check.collective_schedule(_net(peer_blobs).Proto(), current())
    store = PeerStore(peer)
    current().set_blob("cw", FakeWorld(store), None)
    with pytest.raises(CollectiveMismatchError, match="common world 'cw'") as info:
        schedule_check.check_net(current(), _net(["w_grad", "b_grad"]).Proto())
    message = str(info.value)
    assert needle in message and "Ranks [1] differ from ranks [0]" in message
    assert isinstance(info.value, CollectiveError)
    assert store.sets == 2  # digests, then the lists


def test_missing_peer_times_out_naming_it() -> None:
    _feed()
    store = PeerStore({})
    store.set = lambda key, value: store.data.__setitem__(key, value.encode())  # type: ignore
    current().set_blob("cw", FakeWorld(store), None)
    from dpgraph.errors import CollectiveTimeoutError

    with pytest.raises(CollectiveTimeoutError, match=r"ranks \[1\] did not publish"):
        schedule_check.check_net(current(), _net(["w_grad"]).Proto())


def test_off_switch_skips_the_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    _feed()
    store = PeerStore({})
    current().set_blob("cw", FakeWorld(store), None)
    monkeypatch.setenv(schedule_check.ENV_VAR, "0")
    schedule_check.check_net(current(), _net(["w_grad"]).Proto())
    assert store.sets == 0


def test_single_rank_and_plain_nets_cost_nothing() -> None:
    _feed()
    net = core.Net("plain")
    net.Relu("w", "w_relu")
    schedule_check.check_net(current(), net.Proto())  # no collectives: returns at once
    schedule_check.check_net(current(), _net(["w_grad"]).Proto())  # no world blob: skipped


def test_first_difference() -> None:
    index, groups = schedule_check.first_difference(
        {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "x", "c"]})
    assert index == 1 and groups == {"b": [0, 1], "x": [2]}
    assert schedule_check.first_difference({0: ["a"], 1: ["a"]}) == (-1, {})
