"""Executors: simple vs DAG equivalence on random nets, errors, dependencies, RNG."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import (
    ArgumentError,
    BlobNotFoundError,
    OperatorError,
    OperatorSchemaError,
    ShapeError,
    WorkspaceError,
)
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.runtime import Workspace
from dpgraph.runtime.executor import DagExecutor, dependencies

UNARY = [("Scale", {"scale": 0.5}), ("Relu", {}), ("Negative", {}), ("Sqr", {}),
         ("Copy", {})]
BINARY = [("Add", {}), ("Sub", {}), ("Mul", {})]


def random_net(rng: np.random.Generator, name: str, num_ops: int, num_inputs: int = 4
               ) -> tuple[core.Net, dict[str, np.ndarray]]:
    """A random net over [4, 3] float32 blobs with in-place updates and rewrites."""
    feeds = {f"in{i}": rng.standard_normal((4, 3)).astype(np.float32)
             for i in range(num_inputs)}
    names = list(feeds)
    net = core.Net(name)
    for k in range(num_ops):
        if rng.random() < 0.25 and len(names) >= 3:
            count = int(rng.integers(2, 4))
            inputs = [names[int(i)] for i in rng.choice(len(names), count, replace=False)]
            op_type, kwargs = "Sum", {}
        elif rng.random() < 0.5:
            op_type, kwargs = BINARY[int(rng.integers(len(BINARY)))]
            inputs = [names[int(i)] for i in rng.integers(0, len(names), 2)]
        else:
            op_type, kwargs = UNARY[int(rng.integers(len(UNARY)))]
            inputs = [names[int(rng.integers(len(names)))]]
        roll = rng.random()
        if roll < 0.3:
            output = inputs[0]  # in place
        elif roll < 0.5:
            output = names[int(rng.integers(len(names)))]  # overwrite an existing blob
        else:
            output = f"b{k}"
            names.append(output)
        getattr(net, op_type)(inputs, output, **kwargs)
    return net, feeds


def _run(net: core.Net, feeds: dict[str, np.ndarray], net_type: str, workers: int = 4
         ) -> dict[str, np.ndarray]:
    ws = Workspace("rt_equivalence")
    for name, value in feeds.items():
        ws.feed_blob(name, value)
    proto = net.Proto()
    proto.type, proto.num_workers = net_type, workers
    ws.create_net(proto)
    ws.run_net(proto.name, num_iter=2)
    result = {n: ws.fetch_blob(n) for n in ws.blobs()}
    ws.reset()
    return result


@pytest.mark.parametrize("seed", range(12))
def test_simple_and_dag_are_bitwise_identical(seed: int) -> None:
    rng = np.random.default_rng(seed)
    net, feeds = random_net(rng, f"rt_random_{seed}", num_ops=int(rng.integers(5, 60)))
    expected = _run(net, feeds, "simple")
    for net_type, workers in (("dag", 4), ("async_scheduling", 2), ("dag", 8)):
        got = _run(net, feeds, net_type, workers)
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name].tobytes() == expected[name].tobytes(), (net_type, name)


def test_dependencies_cover_all_hazards() -> None:
    ws = Workspace("rt_deps")
    net = core.Net("rt_deps_net")
    net.Scale("a", "b")          # 0 reads a, writes b
    net.Scale("b", "c")          # 1 RAW on b
    net.Scale("x", "a")          # 2 WAR on a (0 read it)
    net.Scale("x", "c")          # 3 WAW on c (1 wrote it), WAR none
    net.Scale("x", "y", control_input=["b"])  # 4 control on b's writer
    inst = ws.create_net(net.Proto())
    assert dependencies(inst.ops) == [set(), {0}, {0}, {1}, {0}]


def test_side_effect_ops_keep_their_order() -> None:
    ws = Workspace("rt_side")
    net = core.Net("rt_side_net")
    net.CreateBlobsQueue([], "q1")
    net.CreateBlobsQueue([], "q2")
    inst = ws.create_net(net.Proto())
    assert dependencies(inst.ops) == [set(), {0}]


def test_dag_runs_independent_ops_concurrently() -> None:
    if "RtTestBarrier" not in OPERATORS:
        barrier = threading.Barrier(2, timeout=10)

        @register_op("RtTestBarrier", inputs=0, outputs=1)
        def wait(ctx):  # both ops must be running at once to pass the barrier
            barrier.wait()
            return (np.zeros(1, np.float32),)

    net = core.Net("rt_concurrent")
    net.RtTestBarrier([], "u")
    net.RtTestBarrier([], "v")
    net.Proto().type, net.Proto().num_workers = "dag", 2
    workspace.CreateNet(net)
    workspace.RunNet(net)
    assert workspace.HasBlob("u") and workspace.HasBlob("v")


@pytest.mark.parametrize("net_type", ["simple", "dag"])
def test_failing_op_is_typed_and_leaves_outputs_untouched(net_type: str) -> None:
    workspace.FeedBlob("x", np.ones((2, 3), np.float32))
    workspace.FeedBlob("y", np.full(1, 7.0, np.float32))
    net = core.Net(f"rt_fail_{net_type}")
    net.Scale("x", "x2")
    net.RtTestFail(["x2"], ["y"])
    net.Proto().type = net_type
    workspace.CreateNet(net)
    with pytest.raises(OperatorError) as info:
        workspace.RunNet(net)
    error = info.value
    assert isinstance(error, ShapeError)  # the kernel's error type is kept
    assert isinstance(error.__cause__, ShapeError)
    assert error.op_index == 1 and error.op_type == "RtTestFail" and error.device == "cpu_0"
    message = str(error)
    for part in ("Operator 1 (RtTestFail)", "x2 ([2, 3] float32 on cpu_0)", "outputs: y",
                 "test failure", "op created at", "test_executor.py"):
        assert part in message, part
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [7.0])


def test_argument_and_arity_errors_are_typed() -> None:
    workspace.FeedBlob("x", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match="argument 'k' must be an int"):
        workspace.RunOperatorOnce(core.CreateOperator("RtTestIntArg", ["x"], ["y"],
                                                      k=[1, 2]))
    with pytest.raises(OperatorSchemaError, match="returned 2 values for 1 outputs"):
        workspace.RunOperatorOnce(core.CreateOperator("RtTestWrongArity", ["x"], ["y"]))
    assert not workspace.HasBlob("y")
    with pytest.raises(OperatorSchemaError, match="takes 1 inputs, got 2"):
        workspace.RunOperatorOnce(core.CreateOperator("RtTestIntArg", ["x", "x"], ["y"]))


def test_missing_and_empty_inputs() -> None:
    workspace.CreateBlob("e")
    with pytest.raises(BlobNotFoundError, match="'e' is empty"):
        workspace.RunOperatorOnce(core.CreateOperator("Scale", ["e"], ["y"]))
    with pytest.raises(BlobNotFoundError, match="non-existing input blob: 'm'") as info:
        workspace.RunOperatorOnce(core.CreateOperator("Scale", ["m"], ["y"]))
    assert "m (missing)" in str(info.value)


def test_free_empties_blob() -> None:
    if "Free" not in OPERATORS:
        pytest.skip("Free is not registered yet (ops/utility.py)")
    workspace.FeedBlob("x", np.ones(2, np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Free", ["x"], ["x"]))
    assert workspace.HasBlob("x")
    with pytest.raises(WorkspaceError, match="empty"):
        workspace.FetchBlob("x")


def test_unknown_net_type() -> None:
    net = core.Net("rt_type")
    net.Proto().type = "dga"
    with pytest.raises(WorkspaceError, match="Did you mean: dag"):
        workspace.CreateNet(net)


@pytest.mark.parametrize("net_type", ["simple", "dag"])
def test_random_ops_are_executor_independent(net_type: str) -> None:
    net = core.Net("rt_rng_net")
    for i in range(6):
        net.RtTestRandom([], f"r{i}", shape=[4])
    net.RtTestRandom([], "seeded", shape=[4], random_seed=5)

    def draw(kind: str) -> list[np.ndarray]:
        ws = Workspace("rt_rng", seed=11)
        net.Proto().type = kind
        ws.create_net(net.Proto())
        ws.run_net(net)
        first = [ws.fetch_blob(f"r{i}") for i in range(6)] + [ws.fetch_blob("seeded")]
        ws.run_net(net)
        second = ws.fetch_blob("r0")
        assert not np.array_equal(first[0], second)  # the stream advances between runs
        return first

    simple, other = draw("simple"), draw(net_type)
    for a, b in zip(simple, other):
        assert a.tobytes() == b.tobytes()
    assert not np.array_equal(simple[0], simple[1])
    np.testing.assert_array_equal(simple[-1], np.random.default_rng(5).standard_normal(4)
                                  .astype(np.float32))


def test_dag_pool_is_reused_and_closed() -> None:
    ws = Workspace("rt_pool")
    ws.feed_blob("x", np.ones(1, np.float32))
    net = core.Net("rt_pool_net")
    net.Scale("x", "y")
    net.Proto().type = "dag"
    inst = ws.create_net(net.Proto())
    assert isinstance(inst.executor, DagExecutor)
    ws.run_net("rt_pool_net", num_iter=3)
    pool = inst.executor._pool
    assert pool is not None and all(t.is_alive() for t in pool.threads)
    ws.reset()
    deadline = time.time() + 5
    while any(t.is_alive() for t in pool.threads) and time.time() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in pool.threads)


def test_dispatch_overhead_is_small() -> None:
    ws = Workspace("rt_speed")
    ws.feed_blob("p", np.ones(1, np.float32))
    net = core.Net("rt_speed_net")
    for _ in range(2000):
        net.Scale("p", "p", scale=1.0)
    ws.create_net(net.Proto())
    ws.run_net("rt_speed_net")
    start = time.perf_counter()
    ws.run_net("rt_speed_net")
    per_op = (time.perf_counter() - start) / 2000 * 1e6
    assert per_op < 60, f"{per_op:.1f} us/op"  # loose: the benchmark reports the real figure
