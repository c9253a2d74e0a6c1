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


# --- fast paths of FC, Relu and SoftmaxWithLoss give the general paths' bits -------------
def _bits(values: list) -> list[bytes]:
    return [np.asarray(v).tobytes() + str(np.asarray(v).dtype).encode() for v in values]


def _both_paths(monkeypatch: pytest.MonkeyPatch, module: object, fast_check: str,
                ops: list, blobs: dict) -> tuple[dict, dict]:
    """Run ``ops`` with the fast paths, then with ``module.fast_check`` forced to refuse."""
    fast = run_ops(ops, {k: v.copy() for k, v in blobs.items()})
    with monkeypatch.context() as patch:
        patch.setattr(module, fast_check, lambda *args, **kwargs: None)
        general = run_ops(ops, {k: v.copy() for k, v in blobs.items()})
    return fast, general


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fc_fast_path_matches_general_path(monkeypatch: pytest.MonkeyPatch,
                                           dtype: type) -> None:
    from dpgraph.ops import nn

    blobs = {"x": f32(6, 5).astype(dtype), "w": f32(4, 5).astype(dtype),
             "b": f32(4).astype(dtype), "dy": f32(6, 4).astype(dtype)}
    ops = [make_op("FC", ["x", "w", "b"], ["y"]),
           make_op("FCGradient", ["x", "w", "dy"], ["dw", "db", "dx"]),
           make_op("FCGradient", ["x", "w", "dy"], ["dw2", "db2"])]
    fast, general = _both_paths(monkeypatch, nn, "_plain_matrices", ops, blobs)
    names = ["y", "dw", "db", "dx", "dw2", "db2"]
    assert _bits([fast[n] for n in names]) == _bits([general[n] for n in names])
    np.testing.assert_allclose(fast["y"], blobs["x"] @ blobs["w"].T + blobs["b"], rtol=1e-6)


def test_fc_fast_path_refuses_what_it_does_not_handle() -> None:
    """3-D input with axis=2, mismatched bias, mixed dtypes: the general path's results
    and errors."""
    x, w, b = f32(2, 3, 4), f32(5, 4), f32(5)
    y = run_op(make_op("FC", ["x", "w", "b"], ["y"], axis=2), [x, w, b])[0]
    assert y.shape == (2, 3, 5)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5)
    with pytest.raises(Exception, match="bias"):
        run_op(make_op("FC", ["x", "w", "b"], ["y"]), [f32(3, 4), w, f32(4)])
    y64 = run_op(make_op("FC", ["x", "w", "b"], ["y"]), [f32(3, 4), w, f32(5).astype(
        np.float64)])[0]
    assert y64.dtype == F32


@pytest.mark.parametrize("in_place", [False, True])
def test_relu_fast_path_gives_the_formulas_bits(in_place: bool) -> None:
    out, grad_out = ("x", "dy") if in_place else ("y", "dx")
    x, dy = f32(5, 7), f32(5, 7)
    x[0, :3] = [0.0, -0.0, np.nan]
    ops = [make_op("Relu", ["x"], [out]), make_op("ReluGradient", [out, "dy"], [grad_out])]
    got = run_ops(ops, {"x": x.copy(), "dy": dy.copy()})
    y = np.maximum(x, 0)
    assert _bits([got[out], got[grad_out]]) == _bits([y, dy * (y > 0)])
    same = run_ops([make_op("ReluGradient", ["a", "a"], ["a" if in_place else "b"])],
                   {"a": x.copy()})  # Y and dY one array
    assert _bits([same["a" if in_place else "b"]]) == _bits([x * (x > 0)])


def test_relu_fast_path_in_place_only_where_the_op_is() -> None:
    x = f32(3, 4)
    kept = x.copy()
    y = run_op(make_op("Relu", ["x"], ["y"]), [x])[0]
    np.testing.assert_array_equal(x, kept)  # not in place: the input is left alone
    assert y is not x
    y2 = run_op(make_op("Relu", ["x"], ["x"]), [x])[0]
    assert y2 is x  # in place, as Caffe2
    np.testing.assert_array_equal(y2, np.maximum(kept, 0))
    view = f32(6, 4)[:3]
    kept_view = view.copy()
    run_op(make_op("Relu", ["x"], ["x"]), [view])
    np.testing.assert_array_equal(view, kept_view)  # a view is never written


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the -inf case's NaN
@pytest.mark.parametrize("case", ["plain", "big_logits", "neg_inf_logit", "int64_labels",
                                  "column_labels", "scaled"])
def test_softmax_with_loss_fast_path_matches_general_path(
        monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    from dpgraph.ops import loss

    x = f32(8, 10)
    label = RNG.integers(0, 10, 8).astype(np.int64 if case == "int64_labels" else np.int32)
    kwargs = {"scale": 0.5} if case == "scaled" else {}
    if case == "big_logits":
        x[0] = 80.0
        x[1, 3] = 1e4
    if case == "neg_inf_logit":  # -inf log-probability: the one-hot product gives NaN
        x[2, (label[2] + 1) % 10] = -np.inf
    if case == "column_labels":
        label = label.reshape(8, 1)
    blobs = {"x": x, "label": label, "dloss": np.array(1.5, F32)}
    ops = [make_op("SoftmaxWithLoss", ["x", "label"], ["p", "loss"], **kwargs),
           make_op("SoftmaxWithLossGradient", ["x", "label", "p", "dloss"], ["dx"], **kwargs)]
    fast, general = _both_paths(monkeypatch, loss, "_plain_labels", ops, blobs)
    names = ["p", "loss", "dx"]
    assert _bits([fast[n] for n in names]) == _bits([general[n] for n in names])
    assert np.isnan(fast["loss"]) == (case == "neg_inf_logit")


def test_softmax_with_loss_bad_labels_still_raise() -> None:
    op = make_op("SoftmaxWithLoss", ["x", "label"], ["p", "loss"])
    with pytest.raises(Exception, match=r"labels must lie in \[0, 10\)"):
        run_op(op, [f32(4, 10), np.array([0, 1, 10, 2], np.int32)])
    with pytest.raises(Exception, match=r"labels must lie in \[0, 10\)"):
        run_op(op, [f32(4, 10), np.array([0, -1, 3, 2], np.int32)])


# --- DAG executor: transitively reduced dependencies -------------------------------------
def _closure(deps: list[set[int]]) -> list[set[int]]:
    result: list[set[int]] = []
    for parents in deps:
        result.append(set(parents).union(*(result[p] for p in parents)))
    return result


def test_reduced_dependencies_keep_every_ordering_and_drop_implied_edges() -> None:
    from dpgraph.runtime.executor import reduced

    assert reduced([set(), {0}, {0, 1}, {1, 2}, {0, 3}]) == [set(), {0}, {1}, {2}, {3}]
    rng = np.random.default_rng(5)
    for _ in range(20):
        deps = [{p for p in range(j) if rng.random() < 0.3} for j in range(25)]
        small = reduced(deps)
        assert _closure(small) == _closure(deps)
        for j, parents in enumerate(small):  # no kept edge is implied by another
            assert parents <= deps[j]
            for p in parents:
                others = set().union(*(_closure(small)[q] | {q} for q in parents - {p}))
                assert p not in others


def test_dag_mlp_step_matches_simple_bit_for_bit() -> None:
    """The MLP training step (a chain with side branches) on the reduced DAG gives the
    simple executor's parameters exactly, over a few steps."""
    results = []
    for net_type in ("simple", "dag"):
        ws = Workspace(f"lean_dag_{net_type}", seed=0)
        rng = np.random.default_rng(1)
        ws.feed_blob("data", rng.standard_normal((8, 6)).astype(F32))
        ws.feed_blob("label", rng.integers(0, 3, 8).astype(np.int32))
        ws.feed_blob("lr", np.array([0.1], F32))
        net = core.Net(f"lean_dag_{net_type}_net")
        blob = "data"
        for i, (fan_in, fan_out) in enumerate([(6, 5), (5, 3)]):
            for name, shape in ((f"w{i}", (fan_out, fan_in)), (f"b{i}", (fan_out,))):
                ws.feed_blob(name, rng.standard_normal(shape).astype(F32))
                ws.feed_blob(f"{name}_m", np.zeros(shape, F32))
            blob = net.FC([blob, f"w{i}", f"b{i}"], f"fc{i}")
            if i == 0:
                blob = net.Relu(blob, "relu0")
        _, loss = net.SoftmaxWithLoss([blob, "label"], ["softmax", "loss"])
        grads = net.AddGradientOperators([loss])
        for name in ("w0", "b0", "w1", "b1"):
            net.MomentumSGDUpdate([grads[name], f"{name}_m", "lr", name],
                                  [grads[name], f"{name}_m", name], momentum=0.9)
        net.Proto().type = net_type
        ws.create_net(net.Proto())
        for _ in range(3):
            ws.run_net(net)
        results.append(_bits([ws.fetch_blob(n) for n in ("w0", "b0", "w1", "b1", "loss")]))
    assert results[0] == results[1]
