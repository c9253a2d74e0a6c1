"""Shared by the optimizer kernel tests: the CPU and virtual-GPU devices, an autouse fixture
giving each test a clean workspace with two virtual GPUs, and a one-op runner.

A test module opts in by importing the fixture:
``from _optim_util import DEVICES, two_virtual_gpus, run_op  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.proto import caffe2_pb2

DEVICES = [core.DeviceOption(caffe2_pb2.PROTO_CPU),
           core.DeviceOption(caffe2_pb2.PROTO_CUDA, 1)]


@pytest.fixture(autouse=True)
def two_virtual_gpus() -> Iterator[None]:
    """A reset workspace with two virtual GPUs; none left behind afterwards."""
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(2)
    yield
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)


def run_op(op_type: str, inputs: Sequence[Any], outputs: Sequence[int | str],
           device: Any = DEVICES[0], cpu: Sequence[int] = (), **kwargs: Any) -> list[np.ndarray]:
    """Feed ``inputs`` as ``in0, in1, ...`` on ``device`` (the indices in ``cpu`` on the CPU),
    run ``op_type`` once there and fetch ``outputs`` (an int names that input, in place)."""
    names = [f"in{i}" for i in range(len(inputs))]
    for i, (name, value) in enumerate(zip(names, inputs)):
        workspace.FeedBlob(name, value, None if i in cpu else device)
    out_names = [names[i] if isinstance(i, int) else i for i in outputs]
    workspace.RunOperatorOnce(core.CreateOperator(op_type, names, out_names,
                                                  device_option=device, **kwargs))
    return [np.asarray(workspace.FetchBlob(n)) for n in out_names]
