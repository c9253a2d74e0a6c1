"""The 16-bit all-reduce (dpgraph.collectives.halfsum) on the gloo backend: 2 and 3 ranks
as threads of this process, against numpy references of the documented arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpgraph.collectives import create_backend, file_store
from dpgraph.collectives.halfsum import chunk_bounds
from dpgraph.errors import CollectiveError
from dpgraph.ops.compress import round_to_bfloat16

pytest.importorskip("torch.distributed", reason="the gloo backend needs torch")

from _launch import on_ranks  # noqa: E402


@pytest.fixture(params=[2, 3], ids=["2ranks", "3ranks"])
def worlds(request: pytest.FixtureRequest, tmp_path: Path) -> list[Any]:
    size = request.param
    store = file_store(str(tmp_path))
    made = on_ranks(size, lambda r: create_backend("gloo", store, r, size, world="hs",
                                                    timeout=10))
    for world in made:
        assert not isinstance(world, Exception), world
    yield made
    for world in made:
        world.close()


def _data(size: int, count: int, copies: int = 1) -> list[list[np.ndarray]]:
    rs = np.random.RandomState(11)
    return [[(rs.randn(count) * 3).astype(np.float32) for _ in range(copies)]
            for _ in range(size)]


def _float16_reference(data: list[list[np.ndarray]]) -> np.ndarray:
    """float32 sum in rank and local-copy order of the float16 values, rounded once."""
    total = np.zeros(data[0][0].shape, np.float32)
    for copies in data:
        local = np.zeros_like(total)
        for copy in copies:
            local += copy.astype(np.float16).astype(np.float32)
        total += local.astype(np.float16).astype(np.float32) if len(copies) > 1 else local
    return total.astype(np.float16)


@pytest.mark.parametrize("count", [1, 2, 1001, 70001])
def test_float16_is_the_float32_sum_rounded_once_on_every_rank(worlds: list[Any],
                                                              count: int) -> None:
    size = len(worlds)
    data = _data(size, count)
    buffers = [[copies[0].astype(np.float16)] for copies in data]
    out = on_ranks(size, lambda r: worlds[r].allreduce(buffers[r]))
    expected = _float16_reference(data)
    for rank in range(size):
        assert not isinstance(out[rank], Exception), out[rank]
        assert out[rank][0] is buffers[rank][0]  # in place
        np.testing.assert_array_equal(buffers[rank][0].view(np.uint16), expected.view(np.uint16))


def test_float16_with_two_ranks_is_bitwise_the_half_precision_sum(tmp_path: Path) -> None:
    store = file_store(str(tmp_path))
    worlds = on_ranks(2, lambda r: create_backend("gloo", store, r, 2, world="h2", timeout=10))
    values = [np.array([65504, 1, 2 ** -24, -3.5, 1e-3, np.inf, 0.1], np.float16),
              np.array([16, 2 ** -11, 2 ** -24, 3.5, 2e-3, 1, 0.2], np.float16)]
    buffers = [[v.copy()] for v in values]
    on_ranks(2, lambda r: worlds[r].allreduce(buffers[r]))
    with np.errstate(over="ignore"):
        expected = (values[0].astype(np.float32) + values[1].astype(np.float32)).astype(
            np.float16)
        half_sum = values[0] + values[1]  # numpy's own float16 addition
    np.testing.assert_array_equal(expected, half_sum)
    for buffer in buffers:
        np.testing.assert_array_equal(buffer[0].view(np.uint16), expected.view(np.uint16))
    for world in worlds:
        world.close()


def test_a_strided_float16_copy_is_reduced_and_written_back(worlds: list[Any]) -> None:
    size = len(worlds)
    data = _data(size, 2 * 3001)
    wide = [copies[0].astype(np.float16).reshape(3001, 2) for copies in data]
    buffers = [[w[:, 0]] for w in wide]  # not contiguous
    on_ranks(size, lambda r: worlds[r].allreduce(buffers[r]))
    expected = _float16_reference([[c[0].reshape(3001, 2)[:, 0].copy()] for c in data])
    for rank in range(size):
        np.testing.assert_array_equal(wide[rank][:, 0].view(np.uint16), expected.view(np.uint16))


def test_several_local_copies_are_summed_in_float32_first(worlds: list[Any]) -> None:
    size = len(worlds)
    data = _data(size, 5000, copies=2)
    buffers = [[c.astype(np.float16) for c in copies] for copies in data]
    on_ranks(size, lambda r: worlds[r].allreduce(buffers[r]))
    expected = _float16_reference(data)
    for rank in range(size):
        for copy in buffers[rank]:
            np.testing.assert_array_equal(copy.view(np.uint16), expected.view(np.uint16))


def test_bfloat16_wire_gives_bfloat16_values_identical_on_every_rank(worlds: list[Any]) -> None:
    size = len(worlds)
    data = _data(size, 40001)
    buffers = [[round_to_bfloat16(copies[0])] for copies in data]
    exact = [b[0].copy() for b in buffers]
    out = on_ranks(size, lambda r: worlds[r].allreduce(buffers[r], wire_dtype="bfloat16"))
    assert not any(isinstance(o, Exception) for o in out), out
    first = buffers[0][0]
    assert not (first.view(np.uint32) & 0xFFFF).any()  # bfloat16 values
    for rank in range(1, size):
        np.testing.assert_array_equal(buffers[rank][0].view(np.uint32), first.view(np.uint32))
    reference = round_to_bfloat16(np.sum(exact, axis=0, dtype=np.float32))
    if size == 2:  # one addition: bitwise the float32 sum rounded to bfloat16
        np.testing.assert_array_equal(first.view(np.uint32), reference.view(np.uint32))
    else:  # Gloo's ring rounds each partial sum: half a bfloat16 unit of each, at most
        magnitude = np.sum(np.abs(exact), axis=0, dtype=np.float64)
        assert (np.abs(first - reference) <= size * magnitude * 2.0 ** -8).all()
        assert not np.array_equal(first, 0 * first)


def test_wire_dtype_is_checked(worlds: list[Any]) -> None:
    world = worlds[0]
    with pytest.raises(CollectiveError, match="wire_dtype must be one of"):
        world.allreduce([np.ones(4, np.float32)], wire_dtype="int8")
    with pytest.raises(CollectiveError, match="reduces float32 blobs, got float16"):
        world.allreduce([np.ones(4, np.float16)], wire_dtype="bfloat16")


def test_chunk_bounds_cover_every_value_once() -> None:
    for count in (0, 1, 2, 7, 100):
        for size in (1, 2, 3, 5):
            bounds = chunk_bounds(count, size)
            assert bounds[0] == 0 and bounds[-1] == count
            assert all(a <= b for a, b in zip(bounds, bounds[1:]))
