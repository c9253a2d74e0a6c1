"""Training numerics: each optimizer for 20 steps equals its update rule in numpy.

The optimizer-built net runs in the workspace; the reference feeds the same initial
parameters through the forward+backward part of the net (a copy taken before the optimizer
was added) and applies the update rule written directly in numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, optimizer, workspace
from dpgraph.model_helper import ModelHelper

STEPS = 20
Rule = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any], int],
                dict[str, np.ndarray]]
F32 = np.float32


# --- models and data ---------------------------------------------------------------------
def _mlp(model: ModelHelper) -> core.BlobReference:
    hidden = brew.fc(model, "data", "fc1", dim_in=2, dim_out=8)
    hidden = brew.relu(model, hidden, "relu1")
    pred = brew.fc(model, hidden, "fc2", dim_in=8, dim_out=1)
    dist = model.net.SquaredL2Distance([pred, "target"], "dist")
    return model.net.AveragedLoss(dist, "loss")


def _cnn(model: ModelHelper) -> core.BlobReference:
    conv = brew.conv(model, "data", "conv1", dim_in=1, dim_out=4, kernel=3, pad=1)
    conv = brew.relu(model, conv, "relu1")
    pool = brew.max_pool(model, conv, "pool1", kernel=2, stride=2)
    pred = brew.fc(model, pool, "fc1", dim_in=4 * 4 * 4, dim_out=2)
    softmax = brew.softmax(model, pred, "softmax")
    xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
    return model.net.AveragedLoss(xent, "loss")


def _mlp_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    labels = np.repeat([0.0, 1.0], 16).astype(F32)
    centers = np.where(labels[:, None] > 0, 1.5, -1.5).astype(F32)
    data = (centers + 0.5 * rng.standard_normal((32, 2))).astype(F32)
    return {"data": data, "target": labels[:, None].copy()}


def _cnn_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    labels = np.repeat([0, 1], 8).astype(np.int32)
    images = 0.3 * rng.standard_normal((16, 1, 8, 8)).astype(F32)
    images[labels == 1, :, :4, :] += 1.0  # class 1: bright upper half
    images[labels == 0, :, 4:, :] += 1.0  # class 0: bright lower half
    return {"data": images.astype(F32), "label": labels}


# --- update rules in numpy -----------------------------------------------------------------
def _global_ratio(grads: dict[str, np.ndarray], clip: float | None) -> F32:
    if clip is None:
        return F32(1.0)
    norm = np.sqrt(sum(np.sum(g.astype(F32) ** 2, dtype=F32) for g in grads.values()))
    return F32(clip) / F32(max(norm, F32(clip)))


def sgd_rule(lr: float, clip: float | None = None) -> Rule:
    def rule(params: Any, grads: Any, state: Any, step: int) -> Any:
        scaled = F32(-lr) * _global_ratio(grads, clip)
        return {n: p + grads[n] * scaled for n, p in params.items()}
    return rule


def momentum_rule(lr: float, momentum: float, nesterov: bool) -> Rule:
    def rule(params: Any, grads: Any, state: Any, step: int) -> Any:
        out = {}
        for n, p in params.items():
            m = state.setdefault(n, np.zeros_like(p))
            if nesterov:
                m_new = F32(momentum) * m + F32(lr) * grads[n]
                update = F32(1 + momentum) * m_new - F32(momentum) * m
            else:
                m_new = update = F32(lr) * grads[n] + F32(momentum) * m
            state[n] = m_new
            out[n] = p - update
        return out
    return rule


def adagrad_rule(lr: float, epsilon: float) -> Rule:
    def rule(params: Any, grads: Any, state: Any, step: int) -> Any:
        out = {}
        for n, p in params.items():
            h = state.get(n, np.zeros_like(p)) + grads[n] * grads[n]
            state[n] = h
            out[n] = p + F32(-lr) * grads[n] / (np.sqrt(h) + F32(epsilon))
        return out
    return rule


def adam_rule(lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> Rule:
    def rule(params: Any, grads: Any, state: Any, step: int) -> Any:
        # AtomicIter runs before Adam, so step k sees iteration k + 1 and t = k + 2.
        t = step + 2
        correction = F32(np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
        out = {}
        for n, p in params.items():
            m1, m2 = state.get(n, (np.zeros_like(p), np.zeros_like(p)))
            g = grads[n]
            m1 = m1 * F32(beta1) + g * F32(1 - beta1)
            m2 = m2 * F32(beta2) + g * g * F32(1 - beta2)
            state[n] = (m1, m2)
            out[n] = p + F32(-lr) * correction * m1 / (np.sqrt(m2) + F32(eps))
        return out
    return rule


def rmsprop_rule(lr: float, decay: float, epsilon: float) -> Rule:
    def rule(params: Any, grads: Any, state: Any, step: int) -> Any:
        out = {}
        for n, p in params.items():
            g = grads[n]
            ms = state.get(n, np.zeros_like(p))
            ms = ms + F32(1 - decay) * (g * g - ms)
            state[n] = ms
            out[n] = p - F32(lr) * (g / np.sqrt(F32(epsilon) + ms))
        return out
    return rule


CASES: dict[str, tuple[Callable[[ModelHelper], Any], Rule]] = {
    "sgd": (lambda m: optimizer.build_sgd(m, 0.1), sgd_rule(0.1)),
    "sgd_clipped": (lambda m: optimizer.build_sgd(m, 0.1, max_gradient_norm=0.3),
                    sgd_rule(0.1, clip=0.3)),
    "momentum": (lambda m: optimizer.build_sgd(m, 0.05, momentum=0.9, nesterov=0),
                 momentum_rule(0.05, 0.9, nesterov=False)),
    "nesterov": (lambda m: optimizer.build_sgd(m, 0.05, momentum=0.9),
                 momentum_rule(0.05, 0.9, nesterov=True)),
    "adagrad": (lambda m: optimizer.build_adagrad(m, 0.1, epsilon=1e-4),
                adagrad_rule(0.1, 1e-4)),
    "adam": (lambda m: optimizer.build_adam(m, 0.05), adam_rule(0.05)),
    "rmsprop": (lambda m: optimizer.build_rms_prop(m, 0.01, decay=0.9, epsilon=1e-5),
                rmsprop_rule(0.01, 0.9, 1e-5)),
}


# --- runners -------------------------------------------------------------------------------
def _feed(blobs: dict[str, np.ndarray]) -> None:
    for name, value in blobs.items():
        workspace.FeedBlob(name, value)


def _train(arch: Callable[[ModelHelper], Any], build: Callable[[ModelHelper], Any],
           data: dict[str, np.ndarray]) -> tuple[Any, ...]:
    workspace.ResetWorkspace()
    model = ModelHelper(name="train")
    loss = arch(model)
    model.AddGradientOperators([loss])
    grad_net = core.Net(model.net.Proto())  # forward + backward, no updates
    opt = build(model)
    assert opt is not None
    _feed(data)
    workspace.RunNetOnce(model.param_init_net)
    names = [str(p) for p in model.params]
    initial = {n: workspace.FetchBlob(n).copy() for n in names}
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(STEPS):
        workspace.RunNet(model.net.Name())
        losses.append(float(workspace.FetchBlob("loss")))
    trained = {n: workspace.FetchBlob(n).copy() for n in names}
    return grad_net, initial, trained, losses


def _reference(grad_net: core.Net, initial: dict[str, np.ndarray],
               data: dict[str, np.ndarray], rule: Rule) -> dict[str, np.ndarray]:
    workspace.ResetWorkspace()
    _feed(data)
    params = {n: v.copy() for n, v in initial.items()}
    state: dict[str, Any] = {}
    for step in range(STEPS):
        _feed(params)
        workspace.RunNetOnce(grad_net)
        grads = {n: workspace.FetchBlob(n + "_grad") for n in params}
        params = rule(params, grads, state, step)
    return params


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_optimizer_matches_numpy_rule(arch: str, case: str) -> None:
    build, rule = CASES[case]
    model_fn, data = (_mlp, _mlp_data()) if arch == "mlp" else (_cnn, _cnn_data())
    grad_net, initial, trained, losses = _train(model_fn, build, data)
    expected = _reference(grad_net, initial, data, rule)
    for name, value in expected.items():
        assert not np.allclose(value, initial[name]), f"{name} was never updated"
        np.testing.assert_allclose(trained[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{arch}/{case}: parameter {name}")
    assert losses[-1] < 0.8 * losses[0], f"{arch}/{case}: loss did not fall: {losses}"


def test_mlp_gradients_match_numpy_backprop() -> None:
    """The gradients the reference uses agree with hand-written numpy backprop."""
    data = _mlp_data()
    grad_net, initial, _, _ = _train(_mlp, lambda m: optimizer.build_sgd(m, 0.1), data)
    workspace.ResetWorkspace()
    _feed(data)
    _feed(initial)
    workspace.RunNetOnce(grad_net)
    x, y = data["data"], data["target"]
    w1, b1, w2, b2 = (initial[n] for n in ("fc1_w", "fc1_b", "fc2_w", "fc2_b"))
    h = np.maximum(x @ w1.T + b1, 0)
    pred = h @ w2.T + b2
    dpred = (pred - y) / len(x)
    dh = (dpred @ w2) * (h > 0)
    expected = {"fc2_w": dpred.T @ h, "fc2_b": dpred.sum(0), "fc1_w": dh.T @ x,
                "fc1_b": dh.sum(0)}
    for name, grad in expected.items():
        np.testing.assert_allclose(workspace.FetchBlob(name + "_grad"), grad, rtol=1e-4,
                                   atol=1e-6)


def test_lr_injection_scales_updates() -> None:
    data = _mlp_data()
    workspace.ResetWorkspace()
    model = ModelHelper(name="inject")
    model.AddGradientOperators([_mlp(model)])
    optimizer.build_sgd(model, 0.1, allow_lr_injection=True)
    _feed(data)
    workspace.RunNetOnce(model.param_init_net)
    before = workspace.FetchBlob("fc2_b").copy()
    optimizer.set_lr_injection(0.0)
    assert float(optimizer.get_lr_injection()[0]) == 0.0
    workspace.RunNetOnce(model.net)
    np.testing.assert_array_equal(workspace.FetchBlob("fc2_b"), before)
    optimizer.set_lr_injection(1.0)
    workspace.RunNetOnce(model.net)
    assert not np.allclose(workspace.FetchBlob("fc2_b"), before)
