"""Two output blobs of one op never share an array (kernels update blobs in place where
Caffe2's ops are in place, so a shared array would let one blob change another)."""

from __future__ import annotations

import numpy as np

from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS, register_op
from dpgraph.runtime import Workspace


def test_an_array_returned_for_two_outputs_is_stored_twice() -> None:
    @register_op("_TestOnlyTwice", inputs=1, outputs=2)
    def _twice(ctx):
        doubled = ctx.inputs[0] * 2
        return doubled, doubled

    try:
        ws = Workspace("no_shared_outputs")
        ws.feed_blob("x", np.ones(3, np.float32))
        ws.run_operators_once([CreateOperator("_TestOnlyTwice", ["x"], ["a", "b"])])
        a, b = ws.get_blob("a"), ws.get_blob("b")
        assert a is not b and np.array_equal(a, b)
    finally:
        del OPERATORS._schemas["_TestOnlyTwice"]


def test_rms_prop_then_momentum_in_place_keeps_moment_and_grad_apart() -> None:
    ws = Workspace("rmsprop_inplace")
    rng = np.random.default_rng(0)
    g, p = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    zeros = np.zeros(4, np.float32)
    for name, value in (("g", g), ("ms", zeros), ("mom", zeros), ("go", zeros), ("p", p),
                        ("one", np.ones(1, np.float32)), ("lr", np.array([-0.1], np.float32))):
        ws.feed_blob(name, value)
    ws.run_operators_once([CreateOperator("RmsProp", ["g", "ms", "mom", "one"], ["go", "ms", "mom"],
                                         decay=0.9, momentum=0.0, epsilon=1e-5)])
    step = ws.fetch_blob("go")
    ws.run_operators_once([CreateOperator("MomentumSGDUpdate", ["go", "mom", "lr", "p"],
                                         ["go", "mom", "p"], momentum=0.0)])
    np.testing.assert_allclose(ws.fetch_blob("p"), p + 0.1 * step, rtol=1e-6)


def test_an_in_place_update_does_not_reach_a_reshaped_copy() -> None:
    """Reshape copies unless in place (as Caffe2 does), so an in-place update of X (SGD's
    WeightedSum) leaves the reshaped Y alone."""
    ws = Workspace("views")
    x = np.arange(6, dtype=np.float32)
    ws.feed_blob("x", x)
    ws.feed_blob("one", np.ones(1, np.float32))
    ws.run_operators_once([CreateOperator("Reshape", ["x"], ["y", "old_shape"], shape=[2, 3])])
    ws.run_operators_once([CreateOperator("WeightedSum", ["x", "one", "x", "one"], ["x"])])
    np.testing.assert_array_equal(ws.fetch_blob("y"), x.reshape(2, 3))
    np.testing.assert_array_equal(ws.fetch_blob("x"), 2 * x)
    ws.run_operators_once([CreateOperator("Reshape", ["x"], ["x", "old_shape"], shape=[3, 2])])
    assert ws.fetch_blob("x").shape == (3, 2)  # in place: a view of its own array is fine
