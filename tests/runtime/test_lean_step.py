"""The lean training step: fast paths of the hot kernels and of op dispatch give the values
of the general paths bit for bit, write in place only where Caffe2's op is in place and
nothing else can see the array, and a failing op still changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph import core
from dpgraph.errors import OperatorError
from dpgraph.ops.gradient_builder import make_op
from dpgraph.ops.testing import run_op, run_ops
from dpgraph.runtime import Workspace

RNG = np.random.default_rng(14)
F32 = np.float32


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F32)


# --- MomentumSGDUpdate ----------------------------------------------------------------------
def _momentum_reference(g: np.ndarray, m: np.ndarray, p: np.ndarray, lr: float,
                        mom: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    new_m = F32(mom) * m + F32(lr) * g
    return new_m, new_m, p - new_m


def test_momentum_update_fast_path_is_in_place_and_exact() -> None:
    ws = Workspace("lean_momentum", seed=0)
    for name in ("g", "m", "p"):
        ws.feed_blob(name, f32(7, 3))
    ws.feed_blob("lr", np.array([0.01], F32))
    net = core.Net("lean_momentum_net")
    net.MomentumSGDUpdate(["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9)
    ws.create_net(net.Proto())
    arrays = [ws._blobs[name] for name in ("g", "m", "p")]
    for _ in range(2):  # the second run reads the plan the first derived
        expected = _momentum_reference(*(ws.fetch_blob(n) for n in ("g", "m", "p")), 0.01, 0.9)
        ws.run_net("lean_momentum_net")
        for name, array, want in zip(("g", "m", "p"), arrays, expected):
            assert ws._blobs[name] is array  # updated in place, as Caffe2's kernel
            np.testing.assert_array_equal(ws.fetch_blob(name), want)


@pytest.mark.parametrize("alias", ["grad_is_moment", "param_is_view", "read_only"])
def test_momentum_update_aliased_inputs_take_the_general_path(alias: str) -> None:
    """Inputs that share memory or may not be written are never updated in place by the
    fast path; the values are those of the formula on separate copies."""
    g, m, p = f32(4, 5), f32(4, 5), f32(4, 5)
    if alias == "grad_is_moment":
        m = g
    elif alias == "param_is_view":
        p = f32(8, 5)[:4]
    else:
        p.flags.writeable = False
    expected = _momentum_reference(g.copy(), m.copy(), p.copy(), 0.05, 0.5)
    kept_p = p.copy()
    op = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.5)
    outs = run_ops([op], {"g": g, "m": m, "lr": np.array([0.05], F32), "p": p})
    for name, want in zip(["g", "m", "p"], expected):
        np.testing.assert_array_equal(outs[name], want)
    if alias != "read_only":
        assert outs["p"] is not outs["g"] and outs["m"] is not outs["g"]
    else:
        np.testing.assert_array_equal(p, kept_p)
        assert outs["p"] is not p


def test_momentum_update_failing_op_writes_nothing() -> None:
    g, m, p = f32(3, 2), f32(3, 2), f32(3, 2)
    kept = [g.copy(), m.copy(), p.copy()]
    op = make_op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9)
    with pytest.raises((OperatorError, IndexError)):
        run_op(op, [g, m, np.zeros(0, F32), p])  # an empty learning rate
    for value, before in zip([g, m, p], kept):
        np.testing.assert_array_equal(value, before)
