"""The gloo backend driven directly: two ranks as two threads of this process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph.collectives import create_backend, file_store
from dpgraph.collectives.gloo import GlooBackend
from dpgraph.errors import CollectiveTimeoutError

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")

from _launch import on_ranks  # noqa: E402


@pytest.fixture
def worlds(tmp_path: Path) -> list[GlooBackend]:
    store = file_store(str(tmp_path))
    made = on_ranks(2, lambda r: create_backend("gloo", store, r, 2, world="cw", timeout=5))
    for world in made:
        assert isinstance(world, GlooBackend), world
    return made


def test_allreduce_in_place_without_copies(worlds: list[GlooBackend]) -> None:
    buffers = [[np.full(1000, r + 1, np.float32), np.full(1000, 10, np.float32)]
               for r in range(2)]
    first = [b[0] for b in buffers]
    out = on_ranks(2, lambda r: worlds[r].allreduce(buffers[r]))
    for rank in range(2):
        assert out[rank][0] is first[rank]  # reduced in the caller's own array
        for copy in buffers[rank]:
            np.testing.assert_array_equal(copy, np.full(1000, 23, np.float32))


def test_broadcast_reduce_allgather_reduce_scatter_barrier(worlds: list[GlooBackend]) -> None:
    def body(rank: int) -> dict[str, Any]:
        world = worlds[rank]
        b = [np.full(3, rank + 5, np.int64)]
        world.broadcast(b, root=1)
        r = [np.full(2, rank + 1.0)]
        world.reduce(r, root=1)
        g = world.allgather([np.full(2, rank, np.float32), np.full(2, rank + 10, np.float32)])
        s = world.reduce_scatter([np.arange(8, dtype=np.float32).reshape(4, 2)])
        world.barrier()
        return {"b": b[0], "r": r[0], "g": g, "s": s[0]}

    out = on_ranks(2, body)
    for rank, result in enumerate(out):
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result["b"], [6, 6, 6])
        np.testing.assert_array_equal(result["r"], [3.0, 3.0] if rank == 1 else [1.0, 1.0])
        np.testing.assert_array_equal(result["g"], [[0, 0], [10, 10], [1, 1], [11, 11]])
        full = np.arange(8, dtype=np.float32).reshape(4, 2) * 2
        np.testing.assert_array_equal(result["s"], full[2 * rank:2 * rank + 2])


def test_several_worlds_and_clones(worlds: list[GlooBackend], tmp_path: Path) -> None:
    clones = on_ranks(2, lambda r: worlds[r].clone("cw_clone"))
    other_store = file_store(str(tmp_path / "other"))
    others = on_ranks(2, lambda r: create_backend("gloo", other_store, r, 2, world="x"))

    def body(rank: int) -> list[float]:
        values = []
        for world in (worlds[rank], clones[rank], others[rank]):
            buffer = np.full(4, float(rank + 1))
            world.allreduce([buffer])
            values.append(float(buffer[0]))
        return values

    assert on_ranks(2, body) == [[3.0, 3.0, 3.0]] * 2
    assert clones[0].name == "cw_clone" and clones[0].process_group is not None


def test_late_peer_times_out_with_the_op_timeout(worlds: list[GlooBackend]) -> None:
    start = time.monotonic()

    def body(rank: int) -> Any:
        if rank == 1:
            time.sleep(2.5)  # never enters the collective within rank 0's timeout
            return None
        return worlds[0].allreduce([np.ones(8, np.float32)], timeout=0.5)

    out = on_ranks(2, body)
    assert isinstance(out[0], CollectiveTimeoutError), out[0]
    message = str(out[0])
    assert "allreduce on common world 'cw'" in message and "timeout 0.5s" in message
    assert "still running" in message
    assert time.monotonic() - start < 0.5 + 5


def test_closed_world_refuses(worlds: list[GlooBackend]) -> None:
    worlds[0].close()
    with pytest.raises(Exception, match="destroyed"):
        worlds[0].allreduce([np.ones(2)])
    assert worlds[0].process_group is None
