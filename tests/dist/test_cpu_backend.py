"""The in-process cpu backend and the backend registry."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dpgraph.collectives import (
    Backend,
    backend_for_engine,
    backend_names,
    check_available,
    create_backend,
)
from dpgraph.collectives.cpu import CpuBackend
from dpgraph.errors import CollectiveError, MissingDependencyError, RendezvousError


def _copies(k: int = 4, n: int = 5) -> list[np.ndarray]:
    return [np.arange(n, dtype=np.float32) * (i + 1) for i in range(k)]


def test_allreduce_sums_in_place_and_keeps_dtype() -> None:
    world = create_backend("cpu", world="w")
    copies = _copies()
    ids = [id(c) for c in copies]
    out = world.allreduce(copies)
    expected = np.arange(5, dtype=np.float32) * 10
    assert [id(c) for c in out] == ids
    for copy in copies:
        np.testing.assert_array_equal(copy, expected)
        assert copy.dtype == np.float32


def test_allreduce_of_one_copy_is_identity() -> None:
    world = CpuBackend("w")
    (copy,) = world.allreduce([np.ones((2, 2), np.float64)])
    np.testing.assert_array_equal(copy, np.ones((2, 2)))


def test_broadcast_and_reduce() -> None:
    world = CpuBackend("w")
    copies = _copies(3)
    world.broadcast(copies, root=0)
    for copy in copies:
        np.testing.assert_array_equal(copy, np.arange(5, dtype=np.float32))
    copies = _copies(3)
    world.reduce(copies, root=0)
    np.testing.assert_array_equal(copies[0], np.arange(5, dtype=np.float32) * 6)
    with pytest.raises(CollectiveError, match="root 1 is not a rank"):
        world.broadcast(_copies(2), root=1)


def test_allgather_and_reduce_scatter() -> None:
    world = CpuBackend("w")
    copies = _copies(2)
    gathered = world.allgather(copies)
    assert gathered.shape == (2, 5)
    np.testing.assert_array_equal(gathered[1], copies[1])
    rows = [np.ones((4, 2), np.float32), np.ones((4, 2), np.float32)]
    scattered = world.reduce_scatter(rows)
    assert len(scattered) == 2
    np.testing.assert_array_equal(scattered[0], np.full((4, 2), 2, np.float32))


def test_mismatched_copies_raise() -> None:
    world = CpuBackend("w")
    with pytest.raises(CollectiveError, match="local copy 1 has shape"):
        world.allreduce([np.ones(3, np.float32), np.ones(4, np.float32)])
    with pytest.raises(CollectiveError, match="dtype"):
        world.allreduce([np.ones(3, np.float32), np.ones(3, np.float64)])
    with pytest.raises(CollectiveError, match="no buffers"):
        world.allreduce([])


def test_clone_close_and_protocol() -> None:
    world = CpuBackend("w", timeout=5)
    clone = world.clone("w2")
    assert isinstance(world, Backend) and isinstance(clone, Backend)
    assert (clone.name, clone.timeout, clone.size, clone.rank) == ("w2", 5.0, 1, 0)
    world.close()
    with pytest.raises(CollectiveError, match="destroyed"):
        world.allreduce(_copies(2))
    with pytest.raises(CollectiveError, match="destroyed"):
        world.barrier()
    clone.barrier()  # the clone is independent


def test_cpu_backend_has_one_rank() -> None:
    with pytest.raises(RendezvousError, match="GLOO"):
        create_backend("cpu", rank=1, size=2)


def test_registry_names_and_engines() -> None:
    assert backend_names() == ["cpu", "gloo", "nccl"]
    assert backend_for_engine("GLOO") == "gloo"
    assert backend_for_engine("gloo") == "gloo"
    assert backend_for_engine("") == backend_for_engine(None) == "cpu"
    assert backend_for_engine("NCCL") == "nccl"
    with pytest.raises(CollectiveError, match="Did you mean: GLOO"):
        backend_for_engine("GLO")
    with pytest.raises(CollectiveError, match="Unknown collective backend 'mpi'"):
        create_backend("mpi")


def test_missing_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(MissingDependencyError, match="pip install"):
        create_backend("gloo", store=object(), rank=0, size=2, world="w")


def test_missing_cupy_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(MissingDependencyError, match="cupy"):
        check_available("nccl")


def test_large_blobs_take_the_chunked_path_bitwise_equal() -> None:
    rng = np.random.default_rng(0)
    n = (8 << 20) // 4 + 12345  # over the chunking threshold, not a multiple of a chunk
    copies = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    expected = (copies[0] + copies[1]) + copies[2]
    CpuBackend("w").allreduce(copies)
    for copy in copies:
        np.testing.assert_array_equal(copy, expected)


def test_non_contiguous_copies_are_reduced_in_place() -> None:
    base = [np.arange(12, dtype=np.float64).reshape(3, 4) for _ in range(2)]
    views = [b[:, ::2] for b in base]
    CpuBackend("w").allreduce(views)
    np.testing.assert_array_equal(base[1][:, ::2], 2 * np.arange(12).reshape(3, 4)[:, ::2])
    np.testing.assert_array_equal(base[1][:, 1::2], np.arange(12).reshape(3, 4)[:, 1::2])
