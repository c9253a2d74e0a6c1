"""Output reuse: FC/FCGradient/Relu/ReluGradient write into the array their output blob
holds from the previous run (as Caffe2 reuses tensor memory) only when nothing else can
see that array, and give bitwise the values a fresh array gets."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from dpgraph import core
from dpgraph.runtime import Workspace

REUSED = ("fc0", "relu0", "fc1", "w1_grad", "b1_grad", "relu0_grad",
          "fc0_grad", "w0_grad", "b0_grad", "x_grad")


def _net(name: str, net_type: str, dtype: str, fc: str = "FC") -> core.Net:
    """x -> FC -> Relu -> FC, then the gradient chain fed by a constant dY; x moves every
    run.  float64 uses 3-D blobs flattened at axis 2."""
    net = core.Net(name)
    net.Proto().type = net_type
    axis = {"axis": 2} if dtype == "float64" else {}
    getattr(net, fc)(["x", "w0", "b0"], "fc0", **axis)
    net.Relu("fc0", "relu0")
    getattr(net, fc)(["relu0", "w1", "b1"], "fc1", **axis)
    net.Copy("dy", "fc1_grad")
    getattr(net, fc + "Gradient")(["relu0", "w1", "fc1_grad"],
                                  ["w1_grad", "b1_grad", "relu0_grad"], **axis)
    net.ReluGradient(["relu0", "relu0_grad"], "fc0_grad")
    getattr(net, fc + "Gradient")(["x", "w0", "fc0_grad"], ["w0_grad", "b0_grad", "x_grad"],
                                  **axis)
    net.Scale("x_grad", "x_grad", scale=0.5)       # in place: read and written by one op
    net.Sub(["x", "x_grad"], "x")                  # x changes every run
    return net


def _feeds(dtype: str, fc: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    rows = (2, 3) if dtype == "float64" else (6,)

    def draw(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    w0, w1 = ((4, 5), (3, 4)) if fc == "FC" else ((5, 4), (4, 3))
    return {"x": draw(*rows, 5), "w0": draw(*w0), "b0": draw(4), "w1": draw(*w1),
            "b1": draw(3), "dy": draw(*rows, 3)}


def _run(net_type: str, dtype: str, fc: str, hold: bool, runs: int = 3
         ) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    ws = Workspace(f"reuse_{net_type}_{dtype}_{fc}_{hold}", seed=0)
    for name, value in _feeds(dtype, fc).items():
        ws.feed_blob(name, value)
    net = _net(f"reuse_net_{net_type}_{dtype}_{fc}_{hold}", net_type, dtype, fc)
    ws.create_net(net.Proto())
    ws.run_net(net.Proto().name)
    first = {n: ws._blobs[n] for n in REUSED}   # holds every array of run 1
    same = {}
    held = [first] if hold else []
    if not hold:
        refs = {n: weakref.ref(v) for n, v in first.items()}  # no strong reference
        del first
    for _ in range(runs - 1):
        ws.run_net(net.Proto().name)
        if hold:
            held.append(dict(ws._blobs))  # a reference elsewhere: never overwritten
    if not hold:
        same = {n: refs[n]() is ws._blobs[n] for n in REUSED}
    values = {n: ws.fetch_blob(n) for n in ws.blobs()}
    ws.reset()
    return values, same


@pytest.mark.parametrize("net_type", ["simple", "dag"])
@pytest.mark.parametrize("dtype,fc", [("float32", "FC"), ("float32", "FCTransposed"),
                                      ("float64", "FC"), ("float16", "FC")])
def test_reused_outputs_give_bitwise_the_fresh_values(net_type: str, dtype: str,
                                                      fc: str) -> None:
    reused, same = _run(net_type, dtype, fc, hold=False)
    fresh, _ = _run(net_type, dtype, fc, hold=True)
    assert reused.keys() == fresh.keys()
    for name in fresh:
        assert reused[name].dtype == fresh[name].dtype, name
        assert reused[name].tobytes() == fresh[name].tobytes(), name
    assert all(same.values()), same  # the arrays were written in place, run after run


def test_an_array_referenced_elsewhere_is_never_overwritten() -> None:
    ws = Workspace("reuse_held", seed=0)
    for name, value in _feeds("float32", "FC").items():
        ws.feed_blob(name, value)
    net = _net("reuse_held_net", "simple", "float32")
    ws.create_net(net.Proto())
    ws.run_net("reuse_held_net")
    held = ws._blobs["fc0"]          # e.g. a Python op or user code keeping the array
    view = ws._blobs["w0_grad"][:1]  # a view keeps its base alive
    before, view_before = held.copy(), view.copy()
    ws.run_net("reuse_held_net")     # x changed, so every output changed
    assert ws._blobs["fc0"] is not held and not np.array_equal(ws._blobs["fc0"], held)
    np.testing.assert_array_equal(held, before)
    np.testing.assert_array_equal(view, view_before)


def test_fetched_and_fed_arrays_are_not_shared() -> None:
    ws = Workspace("reuse_fetch", seed=0)
    for name, value in _feeds("float32", "FC").items():
        ws.feed_blob(name, value)
    net = _net("reuse_fetch_net", "simple", "float32")
    ws.create_net(net.Proto())
    ws.run_net("reuse_fetch_net")
    fetched = ws.fetch_blob("fc1")
    copy = fetched.copy()
    ws.run_net("reuse_fetch_net")
    np.testing.assert_array_equal(fetched, copy)


def test_shape_or_dtype_change_allocates() -> None:
    ws = Workspace("reuse_shape", seed=0)
    ws.feed_blob("x", np.ones((4, 3), np.float32))
    ws.feed_blob("w", np.ones((2, 3), np.float32))
    ws.feed_blob("b", np.zeros(2, np.float32))
    net = core.Net("reuse_shape_net")
    net.FC(["x", "w", "b"], "y")
    ws.create_net(net.Proto())
    ws.run_net("reuse_shape_net")
    first = weakref.ref(ws._blobs["y"])
    ws.run_net("reuse_shape_net")
    assert first() is ws._blobs["y"]
    ws.feed_blob("x", np.ones((5, 3), np.float32))
    ws.run_net("reuse_shape_net")
    assert ws.fetch_blob("y").shape == (5, 2) and first() is None
    ws.feed_blob("x", np.ones((5, 3), np.float64))
    ws.feed_blob("w", np.ones((2, 3), np.float64))
    ws.feed_blob("b", np.zeros(2, np.float64))
    ws.run_net("reuse_shape_net")
    assert ws.fetch_blob("y").dtype == np.float64


def test_output_that_is_also_an_input_is_not_reused_by_another_output() -> None:
    """FCGradient writing dX over its own X input, and two outputs naming one blob, take
    new arrays (the kernel still reads X while it writes)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    dy = rng.standard_normal((4, 2)).astype(np.float32)
    expected_dx = dy @ w
    ws = Workspace("reuse_inplace", seed=0)
    for name, value in (("x", x), ("w", w), ("dy", dy)):
        ws.feed_blob(name, value)
    net = core.Net("reuse_inplace_net")
    net.FCGradient(["x", "w", "dy"], ["dw", "db", "x"])
    ws.create_net(net.Proto())
    ws.run_net("reuse_inplace_net")
    np.testing.assert_array_equal(ws.fetch_blob("x"), expected_dx)
    np.testing.assert_array_equal(ws.fetch_blob("dw"), dy.T @ x)
