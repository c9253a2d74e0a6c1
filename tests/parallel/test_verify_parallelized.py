"""The nets Parallelize makes pass dpgraph's own verifier (devices, arity, definitions)."""

from __future__ import annotations

import pytest
from _parallel_helpers import build, sparse_forward

from dpgraph import workspace
from dpgraph.ir import verify


@pytest.mark.parametrize("gpu, devices, use_nccl", [
    (False, [0, 1, 2], False),
    (True, [0, 1, 2, 3], False),
    (True, [0, 1, 2, 3, 4, 5, 6, 7], True),
])
def test_parallelized_nets_verify(gpu: bool, devices: list[int], use_nccl: bool) -> None:
    if gpu:
        workspace.SetVirtualGpus(8)
    try:
        model = build(devices, gpu=gpu, use_nccl=use_nccl)
        verify(model.param_init_net)
        verify(model.net, known_blobs=model.param_init_net.Proto().external_output)
    finally:
        workspace.SetVirtualGpus(0)


def test_sparse_parallelized_net_verifies() -> None:
    workspace.SetVirtualGpus(4)
    try:
        model = build([0, 1, 2, 3], gpu=True, forward=sparse_forward)
        verify(model.net)
    finally:
        workspace.SetVirtualGpus(0)
