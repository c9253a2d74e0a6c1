"""Spec conformance: behaviour-facts §8, every operator's formula and gradient op.

Each op runs through ``workspace.RunOperatorOnce`` and is compared with the spec formula;
gradient makers are checked through ``core.GradientRegistry.GetGradientForOp``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _workspace import clean_workspace  # noqa: F401  (autouse)

from dpgraph import core, workspace
from dpgraph.ir.arguments import arguments_dict
from dpgraph.proto import caffe2_pb2

CPU, CUDA = caffe2_pb2.PROTO_CPU, caffe2_pb2.PROTO_CUDA
TP = caffe2_pb2.TensorProto
RNG = np.random.default_rng(1234)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(op_type: str, inputs: dict[str, Any], outputs: list[str], **kwargs: Any
        ) -> list[np.ndarray]:
    """Feed ``inputs`` (name -> array), run the op once, fetch ``outputs``."""
    for name, value in inputs.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(name) for name in outputs]


def run_named(op_type: str, input_names: list[str], outputs: list[str], **kwargs: Any
              ) -> list[np.ndarray]:
    workspace.RunOperatorOnce(core.CreateOperator(op_type, input_names, outputs, **kwargs))
    return [workspace.FetchBlob(name) for name in outputs]


def grad_ops(op_type: str, inputs: list[str], outputs: list[str], **kwargs: Any
             ) -> tuple[list[tuple[str, list[str], list[str]]], list[Any]]:
    op = core.CreateOperator(op_type, inputs, outputs, **kwargs)
    ops, input_grads = core.GradientRegistry.GetGradientForOp(op, [o + "_grad" for o in outputs])
    return [(g.type, list(g.input), list(g.output)) for g in ops], list(input_grads)


def close(actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


# --- fills -------------------------------------------------------------------------------
def test_constant_fill_forms() -> None:
    (out,) = run("ConstantFill", {}, ["c"], shape=[2, 3])
    assert out.shape == (2, 3) and out.dtype == np.float32 and not out.any()
    (out,) = run("ConstantFill", {}, ["c"], shape=[4], value=2.5)
    close(out, np.full(4, 2.5, np.float32))
    (out,) = run("ConstantFill", {}, ["it"], shape=[1], value=0, dtype=TP.INT64)
    assert out.dtype == np.int64 and out.tolist() == [0]
    (out,) = run("ConstantFill", {"x": _randn(3, 2)}, ["c"], value=1.0)
    assert out.shape == (3, 2) and (out == 1.0).all()
    (out,) = run("ConstantFill", {"x": _randn(3, 2)}, ["c"], value=1.0, extra_shape=[4])
    assert out.shape == (3, 2, 4)
    (out,) = run("ConstantFill", {"s": np.array([2, 5], np.int64)}, ["c"], input_as_shape=1,
                 value=3.0)
    assert out.shape == (2, 5) and (out == 3.0).all()
    (out,) = run("ConstantFill", {}, ["c"], shape=[], value=7.0)
    assert out.shape == () and float(out) == 7.0


def test_uniform_fill_defaults() -> None:
    (out,) = run("UniformFill", {}, ["u"], shape=[1000])
    assert out.dtype == np.float32 and out.min() >= 0.0 and out.max() <= 1.0
    assert 0.4 < out.mean() < 0.6
    (out,) = run("UniformFill", {}, ["u"], shape=[500], min=-3.0, max=-2.0)
    assert out.min() >= -3.0 and out.max() <= -2.0


def test_xavier_fill_range_and_statistics() -> None:
    (out,) = run("XavierFill", {}, ["w"], shape=[400, 50])
    scale = np.sqrt(3.0 / 50)
    assert out.shape == (400, 50) and out.dtype == np.float32
    assert out.min() >= -scale and out.max() <= scale
    assert out.max() > 0.95 * scale and out.min() < -0.95 * scale
    assert out.var() == pytest.approx(1.0 / 50, rel=0.05)
    (conv,) = run("XavierFill", {}, ["c"], shape=[64, 8, 3, 3])
    assert np.abs(conv).max() <= np.sqrt(3.0 / 72)
    assert np.abs(conv).max() > 0.95 * np.sqrt(3.0 / 72)


def test_msra_fill_statistics() -> None:
    (out,) = run("MSRAFill", {}, ["w"], shape=[100, 400])
    std = np.sqrt(2.0 / 100)  # fan_out = numel / shape[1]
    assert out.dtype == np.float32
    assert abs(out.mean()) < 0.05 * std * 10
    assert out.std() == pytest.approx(std, rel=0.05)
    (conv,) = run("MSRAFill", {}, ["c"], shape=[32, 64, 3, 3])
    assert conv.std() == pytest.approx(np.sqrt(2.0 / (32 * 9)), rel=0.05)


def test_gaussian_fill() -> None:
    (out,) = run("GaussianFill", {}, ["g"], shape=[20000], mean=1.0, std=0.5)
    assert out.mean() == pytest.approx(1.0, abs=0.02)
    assert out.std() == pytest.approx(0.5, rel=0.05)


def test_create_mutex_opaque() -> None:
    run_named("CreateMutex", [], ["mutex"])
    assert workspace.HasBlob("mutex")


# --- iteration and learning rate ---------------------------------------------------------
def test_iter_in_place_int64() -> None:
    (out,) = run("Iter", {"it": np.array([5], np.int64)}, ["it"])
    assert out.dtype == np.int64 and out.tolist() == [6]
    (out,) = run_named("Iter", ["it"], ["it"])
    assert out.tolist() == [7]


def test_atomic_iter() -> None:
    run_named("CreateMutex", [], ["mutex"])
    workspace.FeedBlob("it", np.array([0], np.int64))
    for expected in (1, 2, 3):
        (out,) = run_named("AtomicIter", ["mutex", "it"], ["it"])
        assert out.dtype == np.int64 and out.tolist() == [expected]


def test_learning_rate_fixed_and_step() -> None:
    (out,) = run("LearningRate", {"it": np.array([7], np.int64)}, ["lr"], base_lr=-0.1,
                 policy="fixed")
    # Spec says "[1]"; Caffe2's kernel (golden learning_rate_op_test case) gives a 0-d
    # float32, which dpgraph follows: one element either way.
    assert out.dtype == np.float32 and out.size == 1
    close(out.reshape(1), [-0.1])
    (out,) = run("LearningRate", {"it": np.array([25], np.int64)}, ["lr"], base_lr=0.2,
                 policy="step", stepsize=10, gamma=0.5)
    close(out.reshape(1), [0.2 * 0.5 ** 2])


# --- forward layers ----------------------------------------------------------------------
def test_fc_flattens_axis_1() -> None:
    x, w, b = _randn(2, 3, 2), _randn(4, 6), _randn(4)
    (y,) = run("FC", {"X": x, "W": w, "b": b}, ["Y"])
    close(y, x.reshape(2, 6) @ w.T + b, rtol=1e-4)
    ops, _ = grad_ops("FC", ["X", "W", "b"], ["Y"])
    assert ops == [("FCGradient", ["X", "W", "Y_grad"], ["W_grad", "b_grad", "X_grad"])]


def test_flatten_to_vec_and_flatten_gradients() -> None:
    x = _randn(2, 3, 4)
    (y,) = run("FlattenToVec", {"X": x}, ["Y"])
    close(y, x.reshape(-1))
    ops, _ = grad_ops("FlattenToVec", ["X"], ["Y"])
    assert ops == [("ResizeLike", ["Y_grad", "X"], ["X_grad"])]
    (y,) = run("Flatten", {"X": x}, ["Y"])
    assert y.shape == (2, 12)
    ops, _ = grad_ops("Flatten", ["X"], ["Y"])
    assert ops == [("ResizeLike", ["Y_grad", "X"], ["X_grad"])]
    (dx,) = run("ResizeLike", {"dY": _randn(24), "X": x}, ["dX"])
    assert dx.shape == (2, 3, 4)


@pytest.mark.parametrize("op_type,fn,grad_fn", [
    ("Sigmoid", lambda x: 1 / (1 + np.exp(-x)), lambda y, dy: dy * y * (1 - y)),
    ("Tanh", np.tanh, lambda y, dy: dy * (1 - y * y)),
    ("Relu", lambda x: np.maximum(x, 0), lambda y, dy: dy * (y > 0)),
])
def test_activation_and_gradient(op_type: str, fn: Any, grad_fn: Any) -> None:
    x, dy = _randn(3, 4), _randn(3, 4)
    (y,) = run(op_type, {"X": x}, ["Y"])
    close(y, fn(x))
    ops, _ = grad_ops(op_type, ["X"], ["Y"])
    assert ops == [(op_type + "Gradient", ["Y", "Y_grad"], ["X_grad"])]
    (dx,) = run(op_type + "Gradient", {"Y": y, "dY": dy}, ["dX"])
    close(dx, grad_fn(y, dy))


def test_relu_in_place() -> None:
    x = _randn(5)
    (y,) = run("Relu", {"X": x}, ["X"])
    close(y, np.maximum(x, 0))


def test_squared_l2_distance() -> None:
    x, y = _randn(3, 2, 2), _randn(3, 2, 2)
    (d,) = run("SquaredL2Distance", {"X": x, "Y": y}, ["D"])
    close(d, 0.5 * ((x - y) ** 2).reshape(3, -1).sum(axis=1))
    a, b = _randn(4), _randn(4)
    (d,) = run("SquaredL2Distance", {"X": a, "Y": b}, ["D"])
    close(d, 0.5 * (a - b) ** 2)
    ops, _ = grad_ops("SquaredL2Distance", ["X", "Y"], ["D"])
    assert ops == [("SquaredL2DistanceGradient", ["X", "Y", "D_grad"], ["X_grad", "Y_grad"])]
    dd = _randn(3)
    dx, dyy = run("SquaredL2DistanceGradient", {"X": x, "Y": y, "dD": dd}, ["dX", "dY"])
    close(dx, (x - y) * dd[:, None, None])
    close(dyy, -dx)


def test_averaged_loss() -> None:
    x = _randn(3, 4)
    (loss,) = run("AveragedLoss", {"X": x}, ["L"])
    assert loss.shape == () and float(loss) == pytest.approx(float(x.mean()), rel=1e-5)
    ops, _ = grad_ops("AveragedLoss", ["X"], ["L"])
    assert ops == [("AveragedLossGradient", ["X", "L_grad"], ["X_grad"])]
    (dx,) = run("AveragedLossGradient", {"X": x, "dL": np.array(2.0, np.float32)}, ["dX"])
    close(dx, np.full((3, 4), 2.0 / 12))


def test_scale_and_gradient() -> None:
    x = _randn(3)
    (y,) = run("Scale", {"X": x}, ["Y"], scale=2.5)
    close(y, 2.5 * x)
    ops, _ = grad_ops("Scale", ["X"], ["Y"], scale=2.5)
    assert [(t, i, o) for t, i, o in ops] == [("Scale", ["Y_grad"], ["X_grad"])]
    op = core.CreateOperator("Scale", ["X"], ["Y"], scale=2.5)
    g, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert arguments_dict(g[0].arg)["scale"] == pytest.approx(2.5)


def test_sqr_gradient_is_scale_in_place_then_mul() -> None:
    x = _randn(4)
    (y,) = run("Sqr", {"X": x}, ["Y"])
    close(y, x * x)
    op = core.CreateOperator("Sqr", ["X"], ["Y"])
    g, grads = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in g] == [
        ("Scale", ["Y_grad"], ["Y_grad"]), ("Mul", ["Y_grad", "X"], ["X_grad"])]
    assert arguments_dict(g[0].arg)["scale"] == pytest.approx(2.0)
    assert list(grads) == ["X_grad"]
    dy = _randn(4)
    workspace.FeedBlob("Y_grad", dy)
    workspace.RunOperatorsOnce(g)
    close(workspace.FetchBlob("X_grad"), 2 * dy * x)


def test_sum_elements() -> None:
    x = _randn(3, 4)
    (s,) = run("SumElements", {"X": x}, ["S"])
    assert s.shape == () and float(s) == pytest.approx(float(x.sum()), rel=1e-5, abs=1e-5)
    (m,) = run("SumElements", {"X": x}, ["S"], average=1)
    assert float(m) == pytest.approx(float(x.mean()), rel=1e-5, abs=1e-6)
    ops, _ = grad_ops("SumElements", ["X"], ["S"])
    assert ops == [("SumElementsGradient", ["X", "S_grad"], ["X_grad"])]
    (dx,) = run("SumElementsGradient", {"X": x, "dS": np.array(3.0, np.float32)}, ["dX"])
    close(dx, np.full((3, 4), 3.0))


def test_softmax_axis_1_and_gradient() -> None:
    x = _randn(2, 3, 2)
    (y,) = run("Softmax", {"X": x}, ["Y"])
    flat = x.reshape(2, 6)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    close(y.reshape(2, 6), e / e.sum(axis=1, keepdims=True))
    ops, _ = grad_ops("Softmax", ["X"], ["Y"])
    assert ops == [("SoftmaxGradient", ["Y", "Y_grad"], ["X_grad"])]


def test_label_cross_entropy_clamps() -> None:
    p = np.array([[0.2, 0.8], [0.0, 1.0]], np.float32)
    label = np.array([1, 0], np.int32)
    (y,) = run("LabelCrossEntropy", {"P": p, "label": label}, ["Y"])
    close(y, [-np.log(0.8), -np.log(1e-20)], rtol=1e-5)
    ops, _ = grad_ops("LabelCrossEntropy", ["P", "label"], ["Y"])
    assert ops == [("LabelCrossEntropyGradient", ["P", "label", "Y_grad"], ["P_grad"])]
    (dp,) = run("LabelCrossEntropyGradient",
                {"P": np.array([[0.2, 0.8]], np.float32), "label": np.array([1], np.int32),
                 "dY": np.array([2.0], np.float32)}, ["dP"])
    close(dp, [[0.0, -2.0 / 0.8]])


def test_layout_transposes_and_gradients() -> None:
    x = _randn(2, 3, 4, 5)
    (y,) = run("NCHW2NHWC", {"X": x}, ["Y"])
    close(y, x.transpose(0, 2, 3, 1))
    (z,) = run("NHWC2NCHW", {"X": y}, ["Z"])
    close(z, x)
    assert grad_ops("NCHW2NHWC", ["X"], ["Y"])[0] == [("NHWC2NCHW", ["Y_grad"], ["X_grad"])]
    assert grad_ops("NHWC2NCHW", ["X"], ["Y"])[0] == [("NCHW2NHWC", ["Y_grad"], ["X_grad"])]


def _conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int
              ) -> np.ndarray:
    n, c, h, wd = x.shape
    m, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((n, m, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out + b[None, :, None, None]


def test_conv_formula_and_gradient_op() -> None:
    x, w, b = _randn(2, 3, 7, 7), _randn(4, 3, 3, 3), _randn(4)
    (y,) = run("Conv", {"X": x, "W": w, "b": b}, ["Y"], kernel=3, stride=2, pad=1,
               order="NCHW")
    assert y.shape == (2, 4, 4, 4)
    close(y, _conv_ref(x, w, b, 2, 1), rtol=1e-4, atol=1e-4)
    ops, _ = grad_ops("Conv", ["X", "W", "b"], ["Y"], kernel=3)
    assert ops == [("ConvGradient", ["X", "W", "Y_grad"], ["W_grad", "b_grad", "X_grad"])]


def test_max_pool_formula_and_gradient_op() -> None:
    x = _randn(1, 2, 5, 5)
    (y,) = run("MaxPool", {"X": x}, ["Y"], kernel=2, stride=2, order="NCHW")
    assert y.shape == (1, 2, 2, 2)
    close(y, x[:, :, :4, :4].reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5)))
    ops, _ = grad_ops("MaxPool", ["X"], ["Y"], kernel=2)
    assert ops == [("MaxPoolGradient", ["X", "Y", "Y_grad"], ["X_grad"])]


# --- SpatialBN ---------------------------------------------------------------------------
def _bn_inputs(n: int = 4, c: int = 3, hw: tuple[int, int] = (2, 3)) -> dict[str, np.ndarray]:
    return {"X": _randn(n, c, *hw), "s": _randn(c), "b": _randn(c),
            "rm": _randn(c), "rv": np.abs(_randn(c)) + 0.5}


def test_spatial_bn_training() -> None:
    inp = _bn_inputs()
    rm0, rv0 = inp["rm"].copy(), inp["rv"].copy()
    y, rm, rv, sm, siv = run("SpatialBN", inp, ["Y", "rm", "rv", "sm", "siv"], is_test=0,
                             epsilon=1e-5, momentum=0.9, order="NCHW")
    x = inp["X"].astype(np.float64)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    rstd = 1 / np.sqrt(var + 1e-5)
    ref = (x - mean[:, None, None]) * rstd[:, None, None] * inp["s"][:, None, None] \
        + inp["b"][:, None, None]
    close(y, ref, rtol=1e-4, atol=1e-4)
    close(sm, mean, atol=1e-5)
    close(siv, rstd, rtol=1e-4)
    close(rm, 0.9 * rm0 + 0.1 * mean, atol=1e-5)
    # the running variance blends the unbiased batch variance (Caffe2's
    # ComputeRunningMomentsAndFusedParam: scale n / (n - 1), n = N*H*W)
    n = x.size // x.shape[1]
    close(rv, 0.9 * rv0 + 0.1 * var * n / (n - 1), rtol=1e-4, atol=1e-5)


def test_spatial_bn_default_epsilon_momentum() -> None:
    inp = _bn_inputs()
    rm0 = inp["rm"].copy()
    _, rm, _, _, siv = run("SpatialBN", inp, ["Y", "rm", "rv", "sm", "siv"], is_test=0)
    x = inp["X"].astype(np.float64)
    close(siv, 1 / np.sqrt(x.var(axis=(0, 2, 3)) + 1e-5), rtol=1e-4)
    close(rm, 0.9 * rm0 + 0.1 * x.mean(axis=(0, 2, 3)), atol=1e-5)


def test_spatial_bn_num_batches() -> None:
    inp = _bn_inputs(n=2)
    n_batches, nhw = 3, 2 * 6
    sums = _randn(3) * nhw * n_batches
    sumsq = (np.abs(_randn(3)) + 2.0) * nhw * n_batches
    inp.update({"sums": sums, "sumsq": sumsq})
    y, _, _, sm, siv = run("SpatialBN", inp, ["Y", "rm", "rv", "sm", "siv"], is_test=0,
                           num_batches=n_batches, epsilon=1e-5)
    mean = sums.astype(np.float64) / (nhw * n_batches)
    var = sumsq.astype(np.float64) / (nhw * n_batches) - mean ** 2
    close(sm, mean, rtol=1e-4)
    close(siv, 1 / np.sqrt(var + 1e-5), rtol=1e-4)
    ref = (inp["X"] - mean[:, None, None]) / np.sqrt(var + 1e-5)[:, None, None] \
        * inp["s"][:, None, None] + inp["b"][:, None, None]
    close(y, ref, rtol=1e-4, atol=1e-4)


def _bn_grad_ref(x: np.ndarray, scale: np.ndarray, dy: np.ndarray, mean: np.ndarray,
                 rstd: np.ndarray, dscale: np.ndarray, dbias: np.ndarray) -> np.ndarray:
    nhw = x.shape[0] * x.shape[2] * x.shape[3]
    c = (slice(None), None, None)
    return (scale * rstd)[c] / nhw * (nhw * dy - dbias[c] - (x - mean[c]) * rstd[c]
                                      * dscale[c])


def test_spatial_bn_gradient_single_batch() -> None:
    x, scale, dy = _randn(3, 2, 2, 2), _randn(2), _randn(3, 2, 2, 2)
    mean = x.mean(axis=(0, 2, 3))
    rstd = 1 / np.sqrt(x.var(axis=(0, 2, 3)) + 1e-5)
    dx, ds, db = run("SpatialBNGradient", {"X": x, "s": scale, "dY": dy, "sm": mean,
                                           "siv": rstd}, ["dX", "ds", "db"])
    c = (slice(None), None, None)
    ref_ds = (dy * (x - mean[c]) * rstd[c]).sum(axis=(0, 2, 3))
    ref_db = dy.sum(axis=(0, 2, 3))
    close(ds, ref_ds, rtol=1e-4, atol=1e-4)
    close(db, ref_db, rtol=1e-4, atol=1e-4)
    close(dx, _bn_grad_ref(x, scale, dy, mean, rstd, ref_ds, ref_db), rtol=1e-3, atol=1e-4)


def test_spatial_bn_gradient_num_batches() -> None:
    x, scale, dy = _randn(3, 2, 2, 2), _randn(2), _randn(3, 2, 2, 2)
    mean, rstd = _randn(2), np.abs(_randn(2)) + 0.5
    ds_sum, db_sum = _randn(2), _randn(2)
    dx, ds, db = run("SpatialBNGradient", {"X": x, "s": scale, "dY": dy, "sm": mean,
                                           "siv": rstd, "ds_sum": ds_sum, "db_sum": db_sum},
                     ["dX", "ds", "db"], num_batches=2)
    close(ds, ds_sum / 2, rtol=1e-5)
    close(db, db_sum / 2, rtol=1e-5)
    close(dx, _bn_grad_ref(x, scale, dy, mean, rstd, ds_sum / 2, db_sum / 2), rtol=1e-3,
          atol=1e-4)


def test_spatial_bn_gradient_op() -> None:
    ops, _ = grad_ops("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "siv"],
                      is_test=0)
    assert [(t, i) for t, i, _ in ops] == [
        ("SpatialBNGradient", ["X", "s", "Y_grad", "sm", "siv"])]
    assert ops[0][2] == ["X_grad", "s_grad", "b_grad"]


def test_channel_stats_and_backprop_stats() -> None:
    x = _randn(2, 3, 2, 2)
    s, ss = run("ChannelStats", {"X": x}, ["sum", "sumsq"])
    close(s, x.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)
    close(ss, (x ** 2).sum(axis=(0, 2, 3)), rtol=1e-4)
    mean, rstd, dy = _randn(3), np.abs(_randn(3)) + 0.5, _randn(2, 3, 2, 2)
    ds, db = run("ChannelBackpropStats", {"X": x, "m": mean, "r": rstd, "dY": dy},
                 ["ds", "db"])
    c = (slice(None), None, None)
    close(ds, (dy * (x - mean[c]) * rstd[c]).sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)
    close(db, dy.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)


# --- elementwise and collective glue -----------------------------------------------------
def test_sum_aliases_input_0() -> None:
    a, b, c = _randn(3), _randn(3), _randn(3)
    (out,) = run("Sum", {"a": a, "b": b, "c": c}, ["a"])
    close(out, a + b + c)


def test_copy() -> None:
    x = _randn(2, 2)
    (y,) = run("Copy", {"X": x}, ["Y"])
    close(y, x)


def test_add_sub_broadcast_and_sub_gradient() -> None:
    a, b = _randn(2, 3), _randn(3)
    (out,) = run("Add", {"A": a, "B": b}, ["C"], broadcast=1)
    close(out, a + b)
    (out,) = run("Sub", {"A": a, "B": b}, ["C"], broadcast=1)
    close(out, a - b)
    ops, grads = grad_ops("Sub", ["A", "B"], ["C"])
    assert ops == [("SubGradient", ["C_grad", "A", "B"], ["A_grad", "B_grad"])]
    assert [str(g) for g in grads] == ["A_grad", "B_grad"]
    dc = _randn(2, 3)
    da, db = run("SubGradient", {"dC": dc, "A": a, "B": b}, ["dA", "dB"], broadcast=1)
    close(da, dc)
    close(db, -dc.sum(axis=0))


def test_mul_div_max_pow() -> None:
    a, b = _randn(2, 3), _randn(3)
    (out,) = run("Mul", {"A": a, "B": b}, ["C"], broadcast=1)
    close(out, a * b)
    d = np.abs(_randn(2, 3)) + 0.5
    (out,) = run("Div", {"A": a, "B": d}, ["C"])
    close(out, a / d)
    x, y, z = _randn(4), _randn(4), _randn(4)
    (out,) = run("Max", {"x": x, "y": y, "z": z}, ["m"])
    close(out, np.maximum(np.maximum(x, y), z))
    p = np.abs(_randn(4)) + 0.1
    (out,) = run("Pow", {"p": p}, ["q"], exponent=0.5)
    close(out, np.sqrt(p))


def test_sum_sqr_elements_and_cpu_glue() -> None:
    x = _randn(3, 4)
    (s,) = run("SumSqrElements", {"X": x}, ["S"])
    assert s.shape == () and float(s) == pytest.approx(float((x ** 2).sum()), rel=1e-5)
    (e,) = run("EnsureCPUOutput", {"X": x}, ["E"])
    close(e, x)
    (c,) = run("CopyFromCPUInput", {"X": x}, ["C"])
    close(c, x)


def test_weighted_sum_in_place() -> None:
    x0, x1 = _randn(3, 2), _randn(3, 2)
    w0, w1 = np.array([0.5], np.float32), np.array([-2.0], np.float32)
    (out,) = run("WeightedSum", {"X0": x0, "w0": w0, "X1": x1, "w1": w1}, ["X0"])
    close(out, 0.5 * x0 - 2.0 * x1)


def test_scatter_weighted_sum() -> None:
    x0 = _randn(5, 2)
    idx = np.array([3, 0], np.int64)
    slices = _randn(2, 2)
    w0, w1 = np.array([0.5], np.float32), np.array([2.0], np.float32)
    (out,) = run("ScatterWeightedSum", {"X0": x0.copy(), "w0": w0, "idx": idx, "sl": slices,
                                        "w1": w1}, ["X0"])
    ref = x0.copy()
    ref[idx] = 0.5 * x0[idx] + 2.0 * slices
    close(out, ref)


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_update(nesterov: int) -> None:
    g, m, p = _randn(4), _randn(4), _randn(4)
    lr, mom = np.array([0.1], np.float32), 0.9
    g2, m2, p2 = run("MomentumSGDUpdate", {"g": g, "m": m, "lr": lr, "p": p}, ["g", "m", "p"],
                     momentum=mom, nesterov=nesterov)
    m_new = mom * m + 0.1 * g
    g_new = (1 + mom) * m_new - mom * m if nesterov else m_new
    close(m2, m_new)
    close(g2, g_new)
    close(p2, p - g_new)


def test_momentum_sgd_update_default_is_not_nesterov() -> None:
    g, m, p = _randn(4), _randn(4), _randn(4)
    g2, m2, _ = run("MomentumSGDUpdate", {"g": g, "m": m, "lr": np.array([0.1], np.float32),
                                          "p": p}, ["g", "m", "p"], momentum=0.5)
    close(m2, 0.5 * m + 0.1 * g)
    close(g2, m2)


def test_sparse_momentum_sgd_update() -> None:
    p, m = _randn(5, 2), _randn(5, 2)
    g, idx = _randn(2, 2), np.array([4, 1], np.int64)
    lr, mom = np.array([0.1], np.float32), 0.9
    g2, m2, p2 = run("SparseMomentumSGDUpdate",
                     {"g": g, "m": m.copy(), "lr": lr, "p": p.copy(), "idx": idx},
                     ["g", "m", "p"], momentum=mom, nesterov=0)
    m_ref, p_ref = m.copy(), p.copy()
    m_ref[idx] = mom * m[idx] + 0.1 * g
    p_ref[idx] = p[idx] - m_ref[idx]
    close(m2, m_ref)
    close(p2, p_ref)
    close(g2, m_ref[idx])


def test_gather_and_gradient_slice() -> None:
    data, idx = _randn(5, 3), np.array([4, 0, 4], np.int64)
    (out,) = run("Gather", {"D": data, "I": idx}, ["Y"])
    close(out, data[idx])
    ops, grads = grad_ops("Gather", ["D", "I"], ["Y"])
    assert ops == []
    assert isinstance(grads[0], core.GradientSlice)
    assert (str(grads[0].indices), str(grads[0].values)) == ("I", "Y_grad")
    assert grads[1] is None


def test_concat_axis_0_split_info() -> None:
    a, b = _randn(2, 3), _randn(4, 3)
    out, info = run("Concat", {"a": a, "b": b}, ["out", "split_info"], axis=0)
    close(out, np.concatenate([a, b]))
    assert info.tolist() == [2, 4] and info.dtype == np.int32


def test_softmax_with_loss() -> None:
    logits = _randn(4, 3)
    label = np.array([0, 2, 1, 2], np.int32)
    sm, loss = run("SoftmaxWithLoss", {"X": logits, "L": label}, ["sm", "loss"])
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    ref_sm = e / e.sum(axis=1, keepdims=True)
    close(sm, ref_sm, rtol=1e-5)
    assert float(loss) == pytest.approx(float(-np.log(ref_sm[range(4), label]).mean()),
                                        rel=1e-5)
    _, loss1 = run("SoftmaxWithLoss", {"X": logits, "L": label}, ["sm1", "loss1"],
                   only_loss=1)
    assert float(loss1) == pytest.approx(float(loss), rel=1e-6)


def test_print_has_no_outputs_and_no_gradient() -> None:
    workspace.FeedBlob("X", _randn(2))
    workspace.RunOperatorOnce(core.CreateOperator("Print", ["X"], []))
    net = core.Net("print_net")
    y = net.Scale("X", "Y", scale=2.0)
    net.Print(y, [])
    loss = net.SumElements(y, "loss")
    net.AddGradientOperators([loss])
    types = [op.type for op in net.Proto().op]
    assert types.count("Print") == 1 and "PrintGradient" not in types


def test_cpu_gpu_copies_with_virtual_gpus() -> None:
    workspace.SetVirtualGpus(1)
    x = _randn(3)
    workspace.FeedBlob("X", x)
    gpu = core.DeviceOption(CUDA, 0)
    workspace.RunOperatorOnce(core.CreateOperator("CopyCPUToGPU", ["X"], ["Xg"],
                                                  device_option=gpu))
    workspace.RunOperatorOnce(core.CreateOperator("CopyGPUToCPU", ["Xg"], ["Xc"],
                                                  device_option=gpu))
    close(workspace.FetchBlob("Xc"), x)


# --- gradient kernels numerics -----------------------------------------------------------
def test_fc_gradient_numerics() -> None:
    x, w, dy = _randn(3, 2, 2), _randn(5, 4), _randn(3, 5)
    dw, db, dx = run("FCGradient", {"X": x, "W": w, "dY": dy}, ["dW", "db", "dX"])
    close(dw, dy.T @ x.reshape(3, 4), rtol=1e-4, atol=1e-5)
    close(db, dy.sum(axis=0), rtol=1e-4, atol=1e-5)
    assert dx.shape == x.shape
    close(dx.reshape(3, 4), dy @ w, rtol=1e-4, atol=1e-5)


def test_softmax_gradient_numerics() -> None:
    x, dy = _randn(3, 4), _randn(3, 4)
    (y,) = run("Softmax", {"X": x}, ["Y"])
    (dx,) = run("SoftmaxGradient", {"Y": y, "dY": dy}, ["dX"])
    close(dx, y * (dy - (dy * y).sum(axis=1, keepdims=True)), rtol=1e-4, atol=1e-6)


def test_max_pool_gradient_routes_to_argmax() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    (y,) = run("MaxPool", {"X": x}, ["Y"], kernel=2, stride=2, order="NCHW")
    dy = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    (dx,) = run("MaxPoolGradient", {"X": x, "Y": y, "dY": dy}, ["dX"], kernel=2, stride=2,
                order="NCHW")
    ref = np.zeros_like(x)
    ref[0, 0, 1, 1], ref[0, 0, 1, 3], ref[0, 0, 3, 1], ref[0, 0, 3, 3] = 1, 2, 3, 4
    close(dx, ref)


def test_conv_gradient_numerics() -> None:
    from dpgraph.ops.testing import check_gradient

    op = core.CreateOperator("Conv", ["X", "W", "b"], ["Y"], kernel=3, stride=1, pad=1,
                             order="NCHW")
    check_gradient(op, [_randn(1, 2, 4, 4), _randn(3, 2, 3, 3), _randn(3)])


def test_label_cross_entropy_gradient_clamps() -> None:
    p = np.array([[0.0, 1.0]], np.float32)
    (dp,) = run("LabelCrossEntropyGradient", {"P": p, "label": np.array([0], np.int32),
                                              "dY": np.array([1.0], np.float32)}, ["dP"])
    close(dp, [[-1.0 / 1e-20, 0.0]], rtol=1e-4)


def test_free_empties_outputs() -> None:
    workspace.FeedBlob("X", _randn(3))
    workspace.RunOperatorOnce(core.CreateOperator("Free", ["X"], ["X"]))
    assert workspace.HasBlob("X")


def test_constant_fill_infers_dtype_from_value() -> None:
    (out,) = run("ConstantFill", {}, ["i"], shape=[2], value=3)
    assert out.dtype == np.int64 and out.tolist() == [3, 3]
    (out,) = run("ConstantFill", {}, ["f"], shape=[2], value=3.0)
    assert out.dtype == np.float32
    (out,) = run("ConstantFill", {}, ["i32"], shape=[2], value=3, dtype=TP.INT32)
    assert out.dtype == np.int32


def test_spatial_bn_test_mode_uses_running_stats() -> None:
    inp = _bn_inputs()
    (y,) = run("SpatialBN", inp, ["Y"], is_test=1, epsilon=1e-3)
    c = (slice(None), None, None)
    ref = (inp["X"] - inp["rm"][c]) / np.sqrt(inp["rv"][c] + 1e-3) * inp["s"][c] + inp["b"][c]
    close(y, ref, rtol=1e-4, atol=1e-5)


def test_iter_without_input_starts_at_zero() -> None:
    (out,) = run_named("Iter", [], ["fresh"])
    assert out.dtype == np.int64 and out.tolist() == [1]


def test_scatter_weighted_sum_duplicates_scale_first_then_add() -> None:
    x0 = _randn(3, 2)
    idx = np.array([1, 1], np.int64)
    slices = _randn(2, 2)
    (out,) = run("ScatterWeightedSum", {"X0": x0.copy(), "w0": np.array([0.5], np.float32),
                                        "idx": idx, "sl": slices,
                                        "w1": np.array([2.0], np.float32)}, ["X0"])
    ref = x0.copy()
    ref[1] = 0.25 * x0[1] + 2.0 * (slices[0] + slices[1])
    close(out, ref)
