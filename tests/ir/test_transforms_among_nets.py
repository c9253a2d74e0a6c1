"""core.InjectDeviceCopiesAmongNets: copies across a sequence of nets (Detectron's converter)."""

from __future__ import annotations

import pytest

from dpgraph import core
from dpgraph.errors import ArgumentError
from dpgraph.proto import caffe2_pb2


def _gpu_then_cpu_nets() -> list[core.Net]:
    init = core.Net("init")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        init.ConstantFill([], "w", shape=[2], value=1.0)
    main = core.Net("main")
    main.Relu("w", "y")  # on CPU: reads w from gpu 1
    return [init, main]


def test_placement_threads_from_one_net_to_the_next() -> None:
    new_nets, b2d = core.InjectDeviceCopiesAmongNets(_gpu_then_cpu_nets())
    ops = new_nets[1].Proto().op
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("CopyGPUToCPU", ["w"], ["w_cpu"]), ("Relu", ["w_cpu"], ["y"])]
    assert b2d["w"].device_type == caffe2_pb2.CUDA and b2d["w"].device_id == 1
    assert b2d["y"].device_type == caffe2_pb2.CPU
    assert len(core.InjectDeviceCopiesAmongNetsWithoutB2D(_gpu_then_cpu_nets())) == 2


def test_nets_must_be_a_list() -> None:
    with pytest.raises(ArgumentError, match="must be a list"):
        core.InjectDeviceCopiesAmongNets(core.Net("n"))
