"""Small Caffe2 API pieces: BenchmarkNet, InferOpBlobDevices, timeout_guard, net_drawer."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

from dpgraph import core, net_drawer, timeout_guard, workspace
from dpgraph.compat import caffe2 as alias
from dpgraph.errors import MissingDependencyError, WorkspaceError
from dpgraph.proto import caffe2_pb2

GPU1 = core.DeviceOption(workspace.GpuDeviceType, 1)


@pytest.fixture
def fresh_workspace():
    with workspace.WorkspaceGuard("api_gaps_test"):
        yield
        workspace.ResetWorkspace()


# --- BenchmarkNet ----------------------------------------------------------------------------
def _counting_net() -> core.Net:
    net = core.Net("bench")
    net.Iter(["it"], ["it"])
    net.Scale(["x"], ["y"], scale=2.0)
    return net


def test_benchmark_net_times_net_and_each_op(fresh_workspace) -> None:
    workspace.FeedBlob("it", np.zeros(1, dtype=np.int64))
    workspace.FeedBlob("x", np.ones(3, dtype=np.float32))
    net = _counting_net()
    workspace.CreateNet(net)
    result = workspace.BenchmarkNet(net.Name(), 2, 3, True)
    assert len(result) == 1 + 2  # whole net, then one value per op
    assert all(isinstance(v, float) and v >= 0.0 for v in result)
    # 2 warmup + 3 main runs of the net, then 3 individual runs of each op
    assert workspace.FetchBlob("it")[0] == 2 + 3 + 3
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [2.0, 2.0, 2.0])
    only_net = workspace.BenchmarkNet(net, 0, 1, False)
    assert len(only_net) == 1
    assert workspace.FetchBlob("it")[0] == 9


def test_benchmark_net_checks_arguments(fresh_workspace) -> None:
    with pytest.raises(WorkspaceError, match="Can't find net nope"):
        workspace.BenchmarkNet("nope", 1, 1, False)
    workspace.FeedBlob("it", np.zeros(1, dtype=np.int64))
    workspace.FeedBlob("x", np.ones(3, dtype=np.float32))
    net = _counting_net()
    workspace.CreateNet(net)
    with pytest.raises(WorkspaceError, match="main_runs must be an int >= 0"):
        workspace.BenchmarkNet(net.Name(), 0, -1, False)
    assert workspace.BenchmarkNet(net.Name(), 0, 0, True) == [0.0, 0.0, 0.0]


# --- InferOpBlobDevices ----------------------------------------------------------------------
@pytest.mark.parametrize("op_type, cpu_in, cpu_out", [
    ("CopyGPUToCPU", False, True), ("EnsureCPUOutput", False, True),
    ("CopyCPUToGPU", True, False), ("CopyFromCPUInput", True, False),
    ("Relu", False, False),
])
def test_infer_op_blob_devices(op_type: str, cpu_in: bool, cpu_out: bool) -> None:
    op = core.CreateOperator(op_type, ["a"], ["b"], device_option=GPU1)
    inputs, outputs = core.InferOpBlobDevices(op)
    (dev_in,), (dev_out,) = inputs, outputs
    assert (dev_in.device_type, dev_in.device_id) == ((0, 0) if cpu_in else (1, 1))
    assert (dev_out.device_type, dev_out.device_id) == ((0, 0) if cpu_out else (1, 1))
    as_dict = core.InferOpBlobDevicesAsDict(op)
    assert as_dict == ({"a": dev_in}, {"b": dev_out})


def test_infer_op_blob_devices_default_and_copies() -> None:
    op = core.CreateOperator("Sum", ["a", "b"], ["c"])
    op.ClearField("device_option")
    inputs, outputs = core.InferOpBlobDevices(op)
    assert inputs == [caffe2_pb2.DeviceOption()] * 2 and outputs == [caffe2_pb2.DeviceOption()]
    gpu_op = core.CreateOperator("Sum", ["a", "b"], ["c"], device_option=GPU1)
    inputs, _ = core.InferOpBlobDevices(gpu_op)
    inputs[0].device_id = 7  # results are copies: the op and the other blobs keep theirs
    assert gpu_op.device_option.device_id == 1 and inputs[1].device_id == 1
    same_in, same_out = core.InferOpDeviceAsBlobDevices(gpu_op)
    assert same_in == [GPU1, GPU1] and same_out == [GPU1]


# --- timeout_guard ---------------------------------------------------------------------------
class _Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.event = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.event.set()


def test_complete_in_time_or_die_fires_with_stacks(caplog) -> None:
    exits = _Exits()
    caplog.set_level(logging.ERROR, logger="dpgraph.timeout_guard")
    with timeout_guard.CompleteInTimeOrDie(0.05, exit_fn=exits) as watcher:
        assert exits.event.wait(5)
    watcher.join(5)
    assert exits.codes == [1] and watcher.fired
    assert "test_complete_in_time_or_die_fires_with_stacks" in caplog.text  # this thread
    assert "Thread MainThread" in caplog.text


def test_complete_in_time_or_die_quiet_when_done() -> None:
    exits = _Exits()
    with timeout_guard.CompleteInTimeOrDie(0.2, exit_fn=exits) as watcher:
        pass
    watcher.join(5)
    assert not watcher.is_alive() and watcher.completed and not watcher.fired
    time.sleep(0.3)
    assert exits.codes == []


def test_euthanize_if_necessary() -> None:
    exits = _Exits()
    watcher = timeout_guard.EuthanizeIfNecessary(0.05, exit_fn=exits)
    assert watcher.daemon and exits.event.wait(5) and exits.codes == [1]
    cancelled = timeout_guard.EuthanizeIfNecessary(60, exit_fn=exits)
    cancelled.complete()
    cancelled.join(5)
    assert not cancelled.is_alive() and exits.codes == [1]


# --- net_drawer ------------------------------------------------------------------------------
def _fake_pydot() -> types.ModuleType:
    """Enough of pydot's API to see what net_drawer hands it."""
    module = types.ModuleType("pydot")

    class Dot:
        def __init__(self, name: str = "", text: str = "", **attrs: Any) -> None:
            self.name, self.text, self.attrs = name, text, attrs
            self.nodes: list[Any] = []
            self.edges: list[Any] = []

        def add_node(self, node: Any) -> None:
            self.nodes.append(node)

        def add_edge(self, edge: Any) -> None:
            self.edges.append(edge)

    class Node:
        def __init__(self, name: str, **attrs: Any) -> None:
            self.name, self.attrs = name, attrs

    class Edge:
        def __init__(self, src: Any, dst: Any) -> None:
            self.src, self.dst = src, dst

    module.Dot, module.Node, module.Edge = Dot, Node, Edge  # type: ignore[attr-defined]
    module.graph_from_dot_data = lambda text: [Dot(text=text)]  # type: ignore[attr-defined]
    return module


def _small_net() -> core.Net:
    net = core.Net("drawn")
    net.FC(["x", "w", "b"], ["h"])
    net.Relu(["h"], ["h"])
    net.Softmax(["h"], ["p"])
    return net


def test_net_drawer_without_pydot(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pydot", None)
    with pytest.raises(MissingDependencyError, match="pip install pydot") as info:
        net_drawer.GetPydotGraph(_small_net())
    assert "dpgraph.export.to_dot" in str(info.value)
    with pytest.raises(MissingDependencyError):
        net_drawer.GetPydotGraphMinimal(_small_net().Proto().op)


def test_net_drawer_builds_from_dot_text(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pydot", _fake_pydot())
    net = _small_net()
    graph = net_drawer.GetPydotGraph(net)
    assert graph.text.startswith(f'digraph "{net.Name()}"') and "rankdir=LR;" in graph.text
    assert graph.text.count("shape=ellipse") == 6  # x w b h(v1) h(v2) p
    named = net_drawer.GetPydotGraph(list(_small_net().Proto().op), name="ops", rankdir="TB")
    assert named.text.startswith('digraph "ops"') and "rankdir=TB;" in named.text
    minimal = net_drawer.GetPydotGraphMinimal(_small_net(), minimal_dependency=True)
    assert "ellipse" not in minimal.text and minimal.text.count(" -> ") == 2


def test_net_drawer_custom_producers(monkeypatch) -> None:
    pydot = _fake_pydot()
    monkeypatch.setitem(sys.modules, "pydot", pydot)
    seen: list[tuple[str, int]] = []

    def op_node(op: caffe2_pb2.OperatorDef, index: int) -> Any:
        seen.append((op.type, index))
        return pydot.Node(f"op{index}")

    net = _small_net()
    graph = net_drawer.GetPydotGraph(net, op_node_producer=op_node)
    assert seen == [("FC", 0), ("Relu", 1), ("Softmax", 2)]
    assert graph.name == net.Name() and graph.attrs["rankdir"] == "LR"
    blobs = [n.attrs["label"] for n in graph.nodes if not n.name.startswith("op")]
    assert blobs == ['"x"', '"w"', '"b"', '"h"', '"h"', '"p"']
    assert len(graph.edges) == 3 + 1 + 1 + 1 + 1 + 1
    relu_in = [e.src.name for e in graph.edges if e.dst.name == "op1"]
    assert relu_in == ['"h#0"']


def test_operator_map_for_plan() -> None:
    net = _small_net()
    plan = core.Plan("train")
    plan.AddStep(core.execution_step("step", [net]))
    anonymous = plan.Proto().network.add()
    anonymous.op.add().type = "Relu"
    mapping = net_drawer.GetOperatorMapForPlan(plan.Proto())
    assert list(mapping) == [f"train_{net.Name()}", "train_network_1"]
    assert [op.type for op in mapping[f"train_{net.Name()}"]] == ["FC", "Relu", "Softmax"]
    assert net_drawer.GetOperatorMapForPlan(plan).keys() == mapping.keys()


def test_caffe2_alias_resolves_new_modules() -> None:
    alias.install()
    try:
        for name in ("timeout_guard", "net_drawer"):
            assert importlib.import_module(f"caffe2.python.{name}") is importlib.import_module(
                f"dpgraph.{name}")
        from caffe2.python import workspace as c2_workspace

        assert c2_workspace.BenchmarkNet is workspace.BenchmarkNet
    finally:
        alias.uninstall()
