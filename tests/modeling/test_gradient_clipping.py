"""modeling.gradient_clipping (GradientClipping on a NetModifier) and the LpNorm op it uses:
op structure per clipping mode and the clipped values against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import brew, core, model_helper, workspace
from dpgraph.errors import ModelConfigError
from dpgraph.modeling.gradient_clipping import GradientClipping
from dpgraph.modeling.net_modifier import NetModifier


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _model():
    model = model_helper.ModelHelper(name="clip")
    fc1 = brew.fc(model, "data", "fc1", dim_in=4, dim_out=2)
    fc2 = brew.fc(model, fc1, "fc2", dim_in=2, dim_out=1)
    sq = model.net.SquaredL2Distance([model.net.Sigmoid(fc2, "sigm"), "label"], "sq")
    grad_map = model.AddGradientOperators([model.net.SumElements(sq, "loss")])
    return model, grad_map


def _run(model):
    rng = np.random.RandomState(0)
    workspace.FeedBlob("data", rng.rand(10, 4).astype(np.float32) * 10)
    workspace.FeedBlob("label", rng.rand(10, 1).astype(np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


def _unclipped(model, names):
    """The gradients without clipping (the same net minus the clipping ops)."""
    clean = core.Net("clean")
    clean.Proto().op.extend(op for op in model.net.Proto().op
                            if op.type not in ("LpNorm", "Pow", "ClipTensorByScaling", "Clip",
                                               "Div"))
    workspace.RunNetOnce(clean)
    return {n: workspace.FetchBlob(n).copy() for n in names}


@pytest.mark.parametrize("norm,p,added", [("l2_norm", 2, ["LpNorm", "Pow", "ClipTensorByScaling"]),
                                          ("l1_norm", 1, ["LpNorm", "ClipTensorByScaling"])])
def test_clip_by_norm_scales_each_gradient_to_the_threshold(norm, p, added):
    model, grad_map = _model()
    before = len(model.net.Proto().op)
    GradientClipping("by_norm", clip_norm_type=norm, clip_threshold=0.1)(
        model.net, grad_map={k: grad_map[k] for k in ["fc1_w", "fc2_w"]})
    ops = model.net.Proto().op
    assert [op.type for op in ops[before:]] == added * 2
    _run(model)
    clipped = {n: workspace.FetchBlob(n) for n in ("fc1_w_grad", "fc2_w_grad")}
    raw = _unclipped(model, clipped)
    for name, value in clipped.items():
        norm_value = np.linalg.norm(raw[name].ravel(), ord=p)
        want = raw[name] * (0.1 / norm_value) if norm_value > 0.1 else raw[name]
        np.testing.assert_allclose(value, want, rtol=1e-5)


def test_parameter_norm_and_norm_ratio():
    model, grad_map = _model()
    before = len(model.net.Proto().op)
    GradientClipping("by_norm", clip_threshold=0.1, use_parameter_norm=True,
                     compute_norm_ratio=True)(model.net, grad_map={"fc1_w": grad_map["fc1_w"]})
    assert [op.type for op in model.net.Proto().op[before:]] == [
        "LpNorm", "Pow", "LpNorm", "Pow", "Div", "ClipTensorByScaling"]
    _run(model)
    clipped = workspace.FetchBlob("fc1_w_grad").copy()
    raw = _unclipped(model, ["fc1_w_grad"])["fc1_w_grad"]
    w = workspace.FetchBlob("fc1_w")
    g_norm, w_norm = np.linalg.norm(raw), np.linalg.norm(w)
    limit = 0.1 * w_norm
    want = raw * (limit / g_norm) if g_norm > limit else raw
    np.testing.assert_allclose(clipped, want, rtol=1e-5)
    ratio = [b for b in workspace.Blobs() if "fc1_w_norm_ratio" in b]
    np.testing.assert_allclose(workspace.FetchBlob(ratio[0]), [g_norm / w_norm], rtol=1e-5)


def test_clip_by_value_and_param_selection():
    model, grad_map = _model()
    before = len(model.net.Proto().op)
    GradientClipping("by_value", clip_max=1e-3, clip_min=-1e-3,
                     blobs_to_include=["fc1_w", "fc2_w"], blobs_to_exclude=["fc2_w"])(
        model.net, grad_map=grad_map)
    assert [op.type for op in model.net.Proto().op[before:]] == ["Clip"]
    _run(model)
    grad = workspace.FetchBlob("fc1_w_grad")
    assert grad.max() <= 1e-3 and grad.min() >= -1e-3


def test_sparse_gradients_are_left_alone():
    net = core.Net("sparse")
    grad = core.GradientSlice(core.BlobReference("i"), core.BlobReference("v"))
    GradientClipping("by_norm")(net, grad_map={"w": grad})
    assert len(net.Proto().op) == 0


def test_bad_settings_raise():
    with pytest.raises(ModelConfigError, match="by_norm"):
        GradientClipping("by_magic")
    with pytest.raises(ModelConfigError, match="l2_norm"):
        GradientClipping("by_norm", clip_norm_type="linf")
    model, grad_map = _model()
    with pytest.raises(ModelConfigError, match="not defined"):
        GradientClipping("by_norm", blobs_to_include=["nope"])(model.net, grad_map=grad_map)
    with pytest.raises(TypeError):
        NetModifier()  # abstract


@pytest.mark.parametrize("p,average", [(1, 0), (2, 0), (2, 1)])
def test_lp_norm_and_gradient(p, average):
    x = np.random.RandomState(1).randn(3, 4).astype(np.float32)
    workspace.FeedBlob("x", x)
    net = core.Net("norm")
    net.LpNorm(["x"], ["n"], p=p, average=average)
    net.AddGradientOperators(["n"])
    workspace.RunNetOnce(net)
    want = np.abs(x).sum() if p == 1 else (x * x).sum()
    want = want / x.size if average else want
    np.testing.assert_allclose(workspace.FetchBlob("n"), [want], rtol=1e-5)
    assert workspace.FetchBlob("n").shape == (1,)
    grad = np.sign(x) if p == 1 else 2 * x
    np.testing.assert_allclose(workspace.FetchBlob("x_grad"),
                               grad / x.size if average else grad, rtol=1e-5)
