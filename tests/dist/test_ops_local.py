"""Distributed ops in one process: schemas, a one-rank world, virtual GPUs, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.collectives.cpu import CpuBackend
from dpgraph.errors import (
    CollectiveError,
    NotSupportedError,
    RendezvousError,
)
from dpgraph.ir.device import CUDA, DeviceOption
from dpgraph.ir.registry import OPERATORS
from dpgraph.runtime.api import current

COLLECTIVES = ("Allreduce", "Broadcast", "Reduce", "Allgather", "ReduceScatter")


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    workspace.ResetWorkspace()
    yield
    workspace.SetVirtualGpus(0)
    workspace.ResetWorkspace()


def test_schemas_are_side_effecting_and_cross_device() -> None:
    for op_type in (*COLLECTIVES, "Barrier", "CreateCommonWorld", "CloneCommonWorld",
                    "DestroyCommonWorld", "FileStoreHandlerCreate", "TCPStoreHandlerCreate"):
        assert OPERATORS.lookup(op_type).side_effects, op_type
    for op_type in COLLECTIVES:
        assert OPERATORS.lookup(op_type).cross_device, op_type
    allreduce = OPERATORS.lookup("Allreduce")
    assert allreduce.allows_inplace(1, 0) and allreduce.allows_inplace(3, 2)
    assert not allreduce.allows_inplace(0, 0)


def _cpu_world(net: core.Net) -> None:
    net.CreateCommonWorld([], "cw", size=1, rank=0, engine="CPU", timeout_ms=1500)


def test_cpu_world_on_virtual_gpus() -> None:
    workspace.SetVirtualGpus(2)
    net = core.Net("local")
    _cpu_world(net)
    for gpu in range(2):
        workspace.FeedBlob(f"gpu_{gpu}/g", np.full(3, gpu + 1, np.float32),
                           DeviceOption(CUDA, gpu))
    net.Allreduce(["cw", "gpu_0/g", "gpu_1/g"], ["gpu_0/g", "gpu_1/g"],
                  device_option=DeviceOption(CUDA, 0))
    workspace.RunNetOnce(net)
    world = workspace.FetchBlob("cw")
    assert isinstance(world, CpuBackend) and world.timeout == 1.5 and world.name == "cw"
    for gpu in range(2):
        np.testing.assert_array_equal(workspace.FetchBlob(f"gpu_{gpu}/g"), [3, 3, 3])
        assert current().placement(f"gpu_{gpu}/g") == (CUDA, gpu)  # stays on its device


def test_gloo_world_of_one_rank_runs_every_op(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    net = core.Net("one_rank")
    net.FileStoreHandlerCreate([], "store", path=str(tmp_path / "rdv"), prefix="p")
    net.CreateCommonWorld("store", "cw", size=1, rank=0, engine="GLOO")
    net.CloneCommonWorld("cw", "cw2", engine="GLOO")
    workspace.FeedBlob("x", np.arange(4, dtype=np.float32))
    workspace.FeedBlob("y", np.ones(4, np.float32))
    net.Allreduce(["cw", "x", "y"], ["x_sum", "y_sum"], engine="GLOO")  # not in place
    net.Broadcast(["cw2", "x"], ["x"], root=0)
    net.Reduce(["cw", "y"], ["y"], root=0)
    net.Allgather(["cw", "x", "y"], ["xy"])
    net.ReduceScatter(["cw", "x"], ["x_part"])
    net.Barrier(["cw"], [])
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("x_sum"), np.arange(4) + 1)
    np.testing.assert_array_equal(workspace.FetchBlob("x"), np.arange(4))  # untouched input
    np.testing.assert_array_equal(workspace.FetchBlob("xy"), [np.arange(4), np.ones(4)])
    np.testing.assert_array_equal(workspace.FetchBlob("x_part"), np.arange(4))
    assert workspace.FetchBlob("x_sum").dtype == np.float32
    assert workspace.FetchBlob("cw").backend == "gloo"


def _run_expecting(net: core.Net, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        workspace.RunNetOnce(net)


def test_errors_name_the_problem() -> None:
    workspace.FeedBlob("x", np.ones(2, np.float32))
    net = core.Net("bad_world")
    net.Allreduce(["x", "x"], ["x"])
    _run_expecting(net, CollectiveError, "must be a common world")

    net = core.Net("bad_outputs")
    _cpu_world(net)
    net.Allreduce(["cw", "x", "x"], ["x"])
    _run_expecting(net, CollectiveError, "takes 2 outputs")

    net = core.Net("bad_root")
    _cpu_world(net)
    net.Broadcast(["cw", "x"], ["x"], root=3)
    _run_expecting(net, CollectiveError, "root 3")

    net = core.Net("no_size")
    net.CreateCommonWorld([], "cw", rank=0)
    _run_expecting(net, RendezvousError, "'size'")

    net = core.Net("mpi")
    net.CreateCommonWorld([], "cw", size=2, rank=0, mpi_rendezvous=1)
    _run_expecting(net, NotSupportedError, "MPI")

    net = core.Net("no_store")
    net.CreateCommonWorld([], "cw", size=2, rank=0, engine="GLOO")
    _run_expecting(net, RendezvousError, "needs a store")

    net = core.Net("no_path")
    net.FileStoreHandlerCreate([], "store")
    _run_expecting(net, RendezvousError, "'path'")


def test_destroyed_world_refuses_collectives() -> None:
    workspace.FeedBlob("x", np.ones(2, np.float32))
    net = core.Net("destroy")
    _cpu_world(net)
    net.DestroyCommonWorld("cw", "cw")
    net.Allreduce(["cw", "x"], ["x"])
    _run_expecting(net, CollectiveError, "destroyed")
