"""Detectron's operators: loop-based numpy references written from the kernels' semantics,
gradient-op structure, finite-difference gradient checks, arguments and defaults, bad input,
and the same results on virtual-GPU device options."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph import core, workspace
from dpgraph.errors import GradientError, ShapeError
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op
from dpgraph.proto import caffe2_pb2

RNG = np.random.default_rng(22)
F32 = np.float32
OPS = ("UpsampleNearest", "SelectSmoothL1Loss", "RoIPoolF", "PSRoIPool",
       "GroupSpatialSoftmax", "SampleAs")


def grad_ops(op_type: str, inputs: list[str], outputs: list[str], **kw: object) -> list:
    ops, _ = build_gradient(make_op(op_type, inputs, outputs, **kw), [outputs[0] + "_grad"])
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def c_round(v: float) -> int:
    """C's roundf (halves away from zero)."""
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


@pytest.mark.parametrize("op_type", OPS)
def test_registered_with_gradient_ops(op_type: str) -> None:
    assert OPERATORS.lookup(op_type).gradient is not None
    assert OPERATORS.lookup(op_type + "Gradient").kernel is not None


# --- UpsampleNearest -------------------------------------------------------------------------
def upsample_ref(x: np.ndarray, scale: int) -> np.ndarray:
    out = np.zeros((*x.shape[:-2], x.shape[-2] * scale, x.shape[-1] * scale), x.dtype)
    for h in range(out.shape[-2]):
        for w in range(out.shape[-1]):
            out[..., h, w] = x[..., h // scale, w // scale]
    return out


@pytest.mark.parametrize("shape,scale", [((2, 3, 4, 5), None), ((3, 2, 3), 3), ((1, 1, 1, 1), 1)])
def test_upsample_nearest_forward_and_gradient(shape: tuple, scale: int | None) -> None:
    x = RNG.standard_normal(shape).astype(F32)
    kw = {} if scale is None else {"scale": scale}
    op = make_op("UpsampleNearest", ["X"], ["Y"], **kw)
    (y,) = run_op(op, [x])
    np.testing.assert_array_equal(y, upsample_ref(x, scale or 2))  # default scale is 2
    check_gradient(op, [x])
    assert grad_ops("UpsampleNearest", ["X"], ["Y"]) == [
        ("UpsampleNearestGradient", ["X", "Y_grad"], ["X_grad"])]


def test_upsample_nearest_gradient_sums_blocks() -> None:
    x = np.zeros((1, 1, 2, 2), F32)
    dy = np.arange(16, dtype=F32).reshape(1, 1, 4, 4)
    (dx,) = run_op(make_op("UpsampleNearestGradient", ["X", "dY"], ["dX"]), [x, dy])
    np.testing.assert_array_equal(dx[0, 0], [[0 + 1 + 4 + 5, 2 + 3 + 6 + 7],
                                             [8 + 9 + 12 + 13, 10 + 11 + 14 + 15]])


def test_upsample_nearest_bad_input() -> None:
    with pytest.raises(ShapeError, match="3-D .* or 4-D"):
        run_op(make_op("UpsampleNearest", ["X"], ["Y"]), [np.zeros((2, 2), F32)])
    with pytest.raises(ShapeError, match="scale"):
        run_op(make_op("UpsampleNearest", ["X"], ["Y"], scale=0), [np.zeros((1, 1, 2, 2), F32)])


# --- SelectSmoothL1Loss ----------------------------------------------------------------------
def select_smooth_l1_ref(y_hat, y, locs, norm, beta=1.0, scale=1.0):
    buff = np.zeros_like(y_hat, dtype=np.float64)
    for i in range(y.shape[0]):
        n, c, yy, xx = (int(v) for v in locs[i])
        for j in range(4):
            d = float(y_hat[n, c + j, yy, xx]) - float(y[i, j])
            v = 0.5 * d * d / beta if abs(d) < beta else abs(d) - 0.5 * beta
            buff[n, c + j, yy, xx] = v / max(float(np.ravel(norm)[0]), 1.0)
    return buff.sum() * scale


def select_inputs():
    y_hat = RNG.standard_normal((2, 12, 3, 4)).astype(F32)
    y = RNG.standard_normal((3, 4)).astype(F32) * 2
    locs = np.array([[0, 0, 1, 2], [1, 8, 2, 3], [0, 4, 0, 0]], F32)
    return y_hat, y, locs, np.array([3.0], F32)


@pytest.mark.parametrize("kw", [{}, {"beta": 0.11, "scale": 2.5}])
def test_select_smooth_l1_loss(kw: dict) -> None:
    ins = select_inputs()
    op = make_op("SelectSmoothL1Loss", ["Y_hat", "Y", "L", "S"], ["loss"], **kw)
    (loss,) = run_op(op, list(ins))
    assert loss.shape == () and loss.dtype == F32
    np.testing.assert_allclose(loss, select_smooth_l1_ref(*ins, **kw), rtol=1e-5)
    check_gradient(op, list(ins), inputs_to_check=[0])
    assert grad_ops("SelectSmoothL1Loss", ["Y_hat", "Y", "L", "S"], ["loss"]) == [
        ("SelectSmoothL1LossGradient", ["Y_hat", "Y", "L", "S", "loss_grad"], ["Y_hat_grad"])]


def test_select_smooth_l1_loss_normalizer_floor_and_empty() -> None:
    y_hat, y, locs, _ = select_inputs()
    op = make_op("SelectSmoothL1Loss", ["Y_hat", "Y", "L", "S"], ["loss"])
    (small,) = run_op(op, [y_hat, y, locs, np.array([0.25], F32)])
    np.testing.assert_allclose(small, select_smooth_l1_ref(y_hat, y, locs, 1.0), rtol=1e-5)
    empty = [y_hat, np.zeros((0, 4), F32), np.zeros((0, 4), F32), np.array([0.0], F32)]
    assert float(run_op(op, empty)[0]) == 0.0
    grad = make_op("SelectSmoothL1LossGradient", ["Y_hat", "Y", "L", "S", "g"], ["d"])
    (d,) = run_op(grad, [*empty, np.array(1.0, F32)])
    assert d.shape == y_hat.shape and not d.any()


def test_select_smooth_l1_loss_rejects_location_outside() -> None:
    y_hat, y, locs, s = select_inputs()
    locs[1, 1] = 10  # channels 10..13 of 12
    with pytest.raises(ShapeError, match="outside Y_hat"):
        run_op(make_op("SelectSmoothL1Loss", ["Y_hat", "Y", "L", "S"], ["loss"]),
               [y_hat, y, locs, s])


# --- RoIPoolF --------------------------------------------------------------------------------
def roi_pool_ref(x, rois, scale, ph, pw):
    """Fast R-CNN max pooling, one output element at a time as Caffe2's CUDA kernel does."""
    n, c, h, w = x.shape
    y = np.zeros((rois.shape[0], c, ph, pw), x.dtype)
    arg = np.full(y.shape, -1, np.int32)
    for r in range(rois.shape[0]):
        b = int(rois[r, 0])
        sw, sh, ew, eh = (c_round(float(F32(v) * F32(scale))) for v in rois[r, 1:])
        rw, rh = max(ew - sw + 1, 1), max(eh - sh + 1, 1)
        bh, bw = F32(rh) / F32(ph), F32(rw) / F32(pw)
        for ch in range(c):
            for i in range(ph):
                for j in range(pw):
                    h0 = min(max(int(math.floor(F32(i) * bh)) + sh, 0), h)
                    h1 = min(max(int(math.ceil(F32(i + 1) * bh)) + sh, 0), h)
                    w0 = min(max(int(math.floor(F32(j) * bw)) + sw, 0), w)
                    w1 = min(max(int(math.ceil(F32(j + 1) * bw)) + sw, 0), w)
                    empty = h1 <= h0 or w1 <= w0
                    best, idx = (0.0 if empty else -np.finfo(F32).max), -1
                    for hh in range(h0, h1):
                        for ww in range(w0, w1):
                            if x[b, ch, hh, ww] > best:
                                best, idx = x[b, ch, hh, ww], hh * w + ww
                    y[r, ch, i, j], arg[r, ch, i, j] = best, idx
    return y, arg


ROIS = np.array([[0, 1, 1, 30, 20], [1, 0, 0, 39, 47], [0, 20, 20, 21, 21],
                 [1, -5, -5, 100, 100], [0, 38, 2, 10, 40], [1, 6, 6, 6, 6]], F32)


@pytest.mark.parametrize("kw", [{}, {"pooled_h": 3, "pooled_w": 2, "spatial_scale": 0.25},
                                {"pooled_h": 7, "pooled_w": 7, "spatial_scale": 0.125}])
def test_roi_pool_f_forward(kw: dict) -> None:
    x = RNG.standard_normal((2, 3, 12, 10)).astype(F32)
    op = make_op("RoIPoolF", ["X", "R"], ["Y", "argmax"], sampling_ratio=0, **kw)
    y, arg = run_op(op, [x, ROIS])
    ref_y, ref_arg = roi_pool_ref(x, ROIS, kw.get("spatial_scale", 1.0), kw.get("pooled_h", 1),
                                  kw.get("pooled_w", 1))
    assert arg.dtype == np.int32 and y.shape == ref_y.shape
    np.testing.assert_array_equal(arg, ref_arg)
    np.testing.assert_array_equal(y, ref_y)


def test_roi_pool_f_ties_pick_first_in_row_major_order() -> None:
    x = np.ones((1, 1, 4, 4), F32)
    y, arg = run_op(make_op("RoIPoolF", ["X", "R"], ["Y", "A"]),
                    [x, np.array([[0, 1, 1, 3, 3]], F32)])
    assert arg.item() == 1 * 4 + 1 and y.item() == 1.0


def test_roi_pool_f_gradient() -> None:
    x = RNG.standard_normal((2, 2, 9, 7)).astype(F32)
    op = make_op("RoIPoolF", ["X", "R"], ["Y", "argmax"], pooled_h=3, pooled_w=2,
                 spatial_scale=0.25)
    check_gradient(op, [x, ROIS], inputs_to_check=[0])
    assert grad_ops("RoIPoolF", ["X", "R"], ["Y", "argmax"]) == [
        ("RoIPoolFGradient", ["X", "R", "argmax", "Y_grad"], ["X_grad"])]
    with pytest.raises(GradientError, match="argmaxes"):
        grad_ops("RoIPoolF", ["X", "R"], ["Y"])


def test_roi_pool_f_empty_rois_and_bad_rois() -> None:
    x = np.zeros((1, 4, 5, 5), F32)
    y, arg = run_op(make_op("RoIPoolF", ["X", "R"], ["Y", "A"], pooled_h=2, pooled_w=2),
                    [x, np.zeros((0, 5), F32)])
    assert y.shape == (0, 4, 2, 2) and arg.shape == (0, 4, 2, 2)
    with pytest.raises(ShapeError, match=r"\(R, 5\)"):
        run_op(make_op("RoIPoolF", ["X", "R"], ["Y", "A"]), [x, np.zeros((2, 4), F32)])
    with pytest.raises(ShapeError, match="batch indices"):
        run_op(make_op("RoIPoolF", ["X", "R"], ["Y", "A"]), [x, np.array([[1, 0, 0, 2, 2]], F32)])


# --- PSRoIPool -------------------------------------------------------------------------------
def ps_roi_pool_ref(x, rois, scale, group, out_dim):
    n, c, h, w = x.shape
    y = np.zeros((rois.shape[0], out_dim, group, group), x.dtype)
    mapping = np.zeros(y.shape, np.int32)
    for r in range(rois.shape[0]):
        b = int(rois[r, 0])
        x1, y1, x2, y2 = (F32(c_round(float(v))) for v in rois[r, 1:])
        sw, sh = x1 * F32(scale), y1 * F32(scale)
        ew, eh = (x2 + 1) * F32(scale), (y2 + 1) * F32(scale)
        bh = max(eh - sh, F32(0.1)) / F32(group)
        bw = max(ew - sw, F32(0.1)) / F32(group)
        for k in range(out_dim):
            for i in range(group):
                for j in range(group):
                    h0 = min(max(int(math.floor(F32(i) * bh + sh)), 0), h)
                    h1 = min(max(int(math.ceil(F32(i + 1) * bh + sh)), 0), h)
                    w0 = min(max(int(math.floor(F32(j) * bw + sw)), 0), w)
                    w1 = min(max(int(math.ceil(F32(j + 1) * bw + sw)), 0), w)
                    ch = (k * group + i) * group + j
                    area = (h1 - h0) * (w1 - w0)
                    total = float(x[b, ch, h0:h1, w0:w1].astype(np.float64).sum())
                    y[r, k, i, j] = 0.0 if h1 <= h0 or w1 <= w0 else total / area
                    mapping[r, k, i, j] = ch
    return y, mapping


@pytest.mark.parametrize("kw", [{}, {"group_size": 3, "output_dim": 2, "spatial_scale": 0.25},
                                {"group_size": 2, "output_dim": 3, "spatial_scale": 0.5}])
def test_ps_roi_pool_forward_and_gradient(kw: dict) -> None:
    g, d = kw.get("group_size", 1), kw.get("output_dim", 1)
    x = RNG.standard_normal((2, d * g * g, 12, 10)).astype(F32)
    op = make_op("PSRoIPool", ["X", "R"], ["Y", "map"], **kw)
    y, mapping = run_op(op, [x, ROIS])
    ref_y, ref_map = ps_roi_pool_ref(x, ROIS, kw.get("spatial_scale", 1.0), g, d)
    np.testing.assert_array_equal(mapping, ref_map)
    assert mapping.dtype == np.int32
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    small = x[:, :, :6, :5].copy()  # finite differences on a smaller map (same windows, clipped)
    check_gradient(op, [small, ROIS], inputs_to_check=[0])
    assert grad_ops("PSRoIPool", ["X", "R"], ["Y", "map"], **kw) == [
        ("PSRoIPoolGradient", ["X", "R", "map", "Y_grad"], ["X_grad"])]


def test_ps_roi_pool_channel_count_checked() -> None:
    with pytest.raises(ShapeError, match="output_dim \\* group_size"):
        run_op(make_op("PSRoIPool", ["X", "R"], ["Y", "M"], group_size=2, output_dim=2),
               [np.zeros((1, 7, 4, 4), F32), np.array([[0, 0, 0, 3, 3]], F32)])


# --- GroupSpatialSoftmax ---------------------------------------------------------------------
def group_softmax_ref(x, k):
    out = np.zeros_like(x, dtype=np.float64)
    n, d, h, w = x.shape
    for i in range(n):
        for a in range(d // k):
            for yy in range(h):
                for xx in range(w):
                    v = x[i, a * k:(a + 1) * k, yy, xx].astype(np.float64)
                    e = np.exp(v - v.max())
                    out[i, a * k:(a + 1) * k, yy, xx] = e / e.sum()
    return out


def test_group_spatial_softmax() -> None:
    x = RNG.standard_normal((2, 6, 3, 2)).astype(F32) * 3
    op = make_op("GroupSpatialSoftmax", ["X"], ["P"], num_classes=3)
    (p,) = run_op(op, [x])
    np.testing.assert_allclose(p, group_softmax_ref(x, 3), rtol=1e-5, atol=1e-7)
    check_gradient(op, [x])
    assert grad_ops("GroupSpatialSoftmax", ["X"], ["P"]) == [
        ("GroupSpatialSoftmaxGradient", ["P", "P_grad"], ["X_grad"])]
    # default num_classes is 81; large logits stay finite
    big = np.zeros((1, 162, 1, 1), F32)
    big[0, 5] = 1e4
    (p,) = run_op(make_op("GroupSpatialSoftmax", ["X"], ["P"]), [big])
    assert np.isfinite(p).all() and p[0, 5] == 1.0 and np.allclose(p[0, 81:], 1 / 81)
    with pytest.raises(ShapeError, match="num_classes=4"):
        run_op(make_op("GroupSpatialSoftmax", ["X"], ["P"], num_classes=4), [x])


# --- SampleAs --------------------------------------------------------------------------------
def test_sample_as() -> None:
    x = RNG.standard_normal((4, 2, 3)).astype(F32)
    labels = np.array([1, 0, -1, 3], np.int32)
    op = make_op("SampleAs", ["X", "L"], ["Y"])
    (y,) = run_op(op, [x, labels])
    np.testing.assert_array_equal(y, x[[0, 3]])
    check_gradient(op, [x, labels], inputs_to_check=[0])
    assert grad_ops("SampleAs", ["X", "L"], ["Y"]) == [
        ("SampleAsGradient", ["X", "L", "Y_grad"], ["X_grad"])]
    (none,) = run_op(op, [x, np.zeros(4, np.int32)])
    assert none.shape == (0, 2, 3)
    with pytest.raises(ShapeError, match="X.dim32\\(0\\) must be equal to L.dim32\\(0\\)"):
        run_op(op, [x, labels[:3]])


# --- ZeroEven --------------------------------------------------------------------------------
def test_zero_even() -> None:
    op = make_op("ZeroEven", ["X"], ["Y"])
    x = RNG.standard_normal(7).astype(F32)
    (y,) = run_op(op, [x])
    np.testing.assert_array_equal(y[1::2], x[1::2])
    assert not y[0::2].any()
    assert run_op(op, [np.zeros(0, F32)])[0].shape == (0,)
    check_gradient(op, [x])
    with pytest.raises(ShapeError, match=r"X\.ndim\(\) == 1"):
        run_op(op, [np.zeros((2, 2), F32)])


# --- device options --------------------------------------------------------------------------
def _run_on(device: caffe2_pb2.DeviceOption, op: caffe2_pb2.OperatorDef,
            feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    op = caffe2_pb2.OperatorDef.FromString(op.SerializeToString())
    op.device_option.CopyFrom(device)
    for name, value in feeds.items():
        workspace.FeedBlob(name, value, device)
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(name) for name in op.output]


def test_ops_and_gradients_run_on_virtual_gpus() -> None:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(2)
    x = RNG.standard_normal((2, 8, 6, 6)).astype(F32)
    cases = [
        (make_op("UpsampleNearest", ["X"], ["Y"]), {"X": x}),
        (make_op("RoIPoolF", ["X", "R"], ["Y", "A"], pooled_h=2, pooled_w=2,
                 spatial_scale=0.5), {"X": x, "R": ROIS}),
        (make_op("PSRoIPool", ["X", "R"], ["Y", "A"], group_size=2, output_dim=2,
                 spatial_scale=0.5), {"X": x, "R": ROIS}),
        (make_op("GroupSpatialSoftmax", ["X"], ["Y"], num_classes=4), {"X": x}),
        (make_op("SampleAs", ["X", "L"], ["Y"]), {"X": x, "L": np.array([0, 1], np.int32)}),
        (make_op("UpsampleNearestGradient", ["X", "dY"], ["dX"]),
         {"X": x, "dY": np.ones((2, 8, 12, 12), F32)}),
    ]
    cpu = core.DeviceOption(caffe2_pb2.CPU)
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 1)
    y_hat, y, locs, norm = select_inputs()
    cases.append((make_op("SelectSmoothL1Loss", ["Yh", "Yt", "Lc", "S"], ["loss"], beta=0.5),
                  {"Yh": y_hat, "Yt": y, "Lc": locs, "S": norm}))
    for op, feeds in cases:
        on_cpu = _run_on(cpu, op, feeds)
        on_gpu = _run_on(gpu, op, feeds)
        for a, b in zip(on_cpu, on_gpu):
            np.testing.assert_array_equal(a, b)
        if op.type.endswith("Gradient"):
            continue
        # the gradient ops too, fed the forward outputs and a random output gradient
        grads, _ = build_gradient(op, [op.output[0] + "_grad"])
        outs = dict(zip(op.output, on_cpu))
        g_feeds = {**feeds, **outs, op.output[0] + "_grad":
                   RNG.standard_normal(np.shape(outs[op.output[0]])).astype(F32)}
        for g in grads:
            needed = {k: v for k, v in g_feeds.items() if k in g.input}
            for a, b in zip(_run_on(cpu, g, needed), _run_on(gpu, g, needed)):
                np.testing.assert_array_equal(a, b)
    workspace.ResetWorkspace()
