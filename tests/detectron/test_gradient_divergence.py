"""Issue 22, item 5: is Detectron's divergence from random initialisation dpgraph's doing?

A small Detectron-shaped detector (ResNet body with AffineChannel and in-place ops, FPN with
UpsampleNearest, RPN on every level, a 2-FC box head on RoIPoolF / RoIAlign features, the
Detectron losses; fed blobs in place of the Python-op data path) is checked in float64:

* end-to-end gradients of the summed losses (AddGradientOperators) against central finite
  differences on a sample of entries of every trainable parameter;
* every activation, loss and gradient against an independent torch forward/backward;
* a few SGD steps at Detectron's learning rate follow the same loss trajectory in dpgraph and
  in torch.
"""

from __future__ import annotations

import _mini_detectron as mini
import numpy as np
import pytest

from dpgraph import workspace

torch = pytest.importorskip("torch")


def run_dpgraph(spec: mini.Spec, params: dict, feeds: dict, with_grads: bool = True) -> dict:
    """Forward (and backward) on a fresh workspace; every blob as numpy."""
    workspace.ResetWorkspace()
    net, losses = mini.build_forward(spec)
    if with_grads:
        net.AddGradientOperators(losses)
    for name, value in {**params, **feeds}.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(net)
    out = {name: workspace.FetchBlob(name) for name in workspace.Blobs()}
    out["_losses"] = losses
    return out


def total_loss(spec: mini.Spec, params: dict, feeds: dict) -> float:
    out = run_dpgraph(spec, params, feeds, with_grads=False)
    return float(sum(float(out[name]) for name in out["_losses"]))


@pytest.fixture(scope="module")
def setup() -> tuple:
    spec = mini.Spec()
    rng = np.random.default_rng(2022)
    params = mini.init_params(spec, rng, detectron_init=False)
    feeds = mini.make_inputs(spec, rng)
    return spec, params, feeds, run_dpgraph(spec, params, feeds)


def test_gradients_match_finite_differences(setup: tuple) -> None:
    spec, params, feeds, out = setup
    rng = np.random.default_rng(5)
    eps = 1e-6
    worst = 0.0
    for name in mini.trainable(spec):
        grad = out[name + "_grad"]
        assert grad.dtype == np.float64 and grad.shape == params[name].shape
        for flat in rng.choice(params[name].size, size=min(2, params[name].size),
                               replace=False):
            idx = np.unravel_index(flat, params[name].shape)
            plus = {**params, name: params[name].copy()}
            minus = {**params, name: params[name].copy()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            numeric = (total_loss(spec, plus, feeds) - total_loss(spec, minus, feeds)) / (2 * eps)
            err = abs(numeric - grad[idx]) / max(abs(numeric), abs(grad[idx]), 1e-7)
            worst = max(worst, err)
            assert err < 1e-5, (name, idx, numeric, grad[idx])
    for frozen in ("conv1_w", "res2_0_branch2a_w"):  # below StopGradient (FREEZE_AT = 2)
        assert frozen + "_grad" not in out
    assert "res3_0_branch2a_bn_s_grad" not in out  # AffineChannel: no parameter gradients
    assert worst < 1e-5


def test_activations_losses_and_gradients_match_torch(setup: tuple) -> None:
    spec, params, feeds, out = setup
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    acts = mini.torch_forward(spec, tparams, feeds)
    for name in ("pool1", "res3_0_sum", "fpn_res2_sum", "fpn_res3_sum", "roi_feat",
                 "rpn_cls_logits_fpn2", "fc7", "cls_score", *out["_losses"]):
        np.testing.assert_allclose(out[name], acts[name].detach().numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    total = sum(acts[name] for name in out["_losses"])
    total.backward()
    for name in mini.trainable(spec):
        ref = tparams[name].grad.numpy()  # summation order differs: cancellation-level slack
        np.testing.assert_allclose(out[name + "_grad"], ref, rtol=1e-7,
                                   atol=1e-8 * np.abs(ref).max(), err_msg=name)


def test_roi_align_head_gradients_match_finite_differences() -> None:
    spec = mini.Spec(roi_method="RoIAlign")
    rng = np.random.default_rng(9)
    params = mini.init_params(spec, rng, detectron_init=False)
    feeds = mini.make_inputs(spec, rng)
    out = run_dpgraph(spec, params, feeds)
    for name in ("fpn_res2_sum_w", "fpn_inner_res2_sum_lateral_w", "fc6_w"):
        idx = np.unravel_index(int(np.argmax(np.abs(out[name + "_grad"]))), params[name].shape)
        plus = {**params, name: params[name].copy()}
        minus = {**params, name: params[name].copy()}
        plus[name][idx] += 1e-6
        minus[name][idx] -= 1e-6
        numeric = (total_loss(spec, plus, feeds) - total_loss(spec, minus, feeds)) / 2e-6
        assert numeric == pytest.approx(out[name + "_grad"][idx], rel=1e-5)


def sgd_losses(spec: mini.Spec, params: dict, feeds: dict, lr: float, steps: int,
               engine: str) -> list[float]:
    """Detectron's update (momentum 0.9, weight decay 1e-4 on weights) for ``steps`` steps."""
    params = {k: v.copy() for k, v in params.items()}
    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    losses = []
    for _ in range(steps):
        if engine == "dpgraph":
            out = run_dpgraph(spec, params, feeds)
            losses.append(float(sum(float(out[n]) for n in out["_losses"])))
            grads = {k: out[k + "_grad"] for k in mini.trainable(spec)}
        else:
            tparams = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
            acts = mini.torch_forward(spec, tparams, feeds)
            total = sum(v for k, v in acts.items() if k.startswith("loss_"))
            total.backward()
            losses.append(float(total.detach()))
            grads = {k: tparams[k].grad.numpy() for k in mini.trainable(spec)}
        for k, g in grads.items():
            decay = 1e-4 * params[k] if not k.endswith("_b") else 0.0
            velocity[k] = 0.9 * velocity[k] + lr * (g + decay)
            params[k] = params[k] - velocity[k]
    return losses


def test_training_trajectory_matches_torch_at_detectron_learning_rate() -> None:
    spec = mini.Spec()
    rng = np.random.default_rng(3)
    params = mini.init_params(spec, rng, detectron_init=True)
    feeds = mini.make_inputs(spec, rng)
    lr = 0.02  # the 8-GPU configs' BASE_LR
    ours = sgd_losses(spec, params, feeds, lr, 4, "dpgraph")
    ref = sgd_losses(spec, params, feeds, lr, 4, "torch")
    np.testing.assert_allclose(ours, ref, rtol=1e-9)
    assert all(np.isfinite(ours))
