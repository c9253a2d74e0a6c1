"""Output reuse (``RuntimeOpContext.reusable_output``): a kernel may write into the array
its output blob holds from the previous run only when nothing else can see that array."""

from __future__ import annotations

import weakref

import numpy as np

from dpgraph import core
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.ops.context import OpContext
from dpgraph.ops.nn import reusable_output
from dpgraph.runtime import Workspace


def _register() -> None:
    if "RtTestReuse" in OPERATORS:
        return

    @register_op("RtTestReuse", inputs=1, outputs=1)
    def fill(ctx):  # out = x + 1, into the previous array when the runtime allows it
        x = ctx.inputs[0]
        out = reusable_output(ctx, 0, x.shape, x.dtype)
        return (np.add(x, 1, out=out),)


_register()


def _workspace(name: str, output: str = "y") -> Workspace:
    ws = Workspace(name, seed=0)
    ws.feed_blob("x", np.zeros((2, 3), np.float32))
    net = core.Net(f"{name}_net")
    net.RtTestReuse("x", output)
    net.Copy(output, "x")  # x moves every run
    ws.create_net(net.Proto())
    ws.run_net(f"{name}_net")
    return ws


def test_sole_owned_output_array_is_reused_with_the_right_values() -> None:
    ws = _workspace("reuse_sole")
    first = weakref.ref(ws._blobs["y"])  # a weak reference is not a reference
    ws.run_net("reuse_sole_net")
    assert first() is ws._blobs["y"]
    np.testing.assert_array_equal(ws.fetch_blob("y"), np.full((2, 3), 2, np.float32))


def test_array_referenced_elsewhere_is_never_overwritten() -> None:
    ws = _workspace("reuse_held")
    held = ws._blobs["y"]  # e.g. a Python op or user code keeping the array
    ws.run_net("reuse_held_net")
    assert ws._blobs["y"] is not held
    np.testing.assert_array_equal(held, np.ones((2, 3), np.float32))
    view = ws._blobs["y"][:1]  # a view keeps its base alive
    ws.run_net("reuse_held_net")
    np.testing.assert_array_equal(view, np.full((1, 3), 2, np.float32))
    fetched = ws.fetch_blob("y")  # fetched blobs are copies: nothing to protect
    ws.run_net("reuse_held_net")
    np.testing.assert_array_equal(fetched, np.full((2, 3), 3, np.float32))


def test_in_place_output_or_other_shape_gets_none() -> None:
    ws = _workspace("reuse_inplace", output="x")  # output also the input: never reused
    before = weakref.ref(ws._blobs["x"])
    ws.run_net("reuse_inplace_net")
    assert before() is None
    np.testing.assert_array_equal(ws.fetch_blob("x"), np.full((2, 3), 2, np.float32))
    ws = _workspace("reuse_shape")
    old = weakref.ref(ws._blobs["y"])
    ws.feed_blob("x", np.zeros((4, 3), np.float32))
    ws.run_net("reuse_shape_net")
    assert old() is None and ws.fetch_blob("y").shape == (4, 3)


def test_plain_context_offers_nothing() -> None:
    op = core.CreateOperator("RtTestReuse", ["x"], ["y"])
    ctx = OpContext(op, arguments_dict(op.arg), np, op.device_option)
    assert reusable_output(ctx, 0, (2,), np.float32) is None
