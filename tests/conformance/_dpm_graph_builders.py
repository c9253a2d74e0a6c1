"""Builders shared by the data_parallel_model graph conformance tests: the two-layer MLP,
Caffe2's DPM test update, a Parallelize wrapper and per-device feeding."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph import (
    brew,
    core,
    data_parallel_model,
    model_helper,
    optimizer,
    workspace,
)

PARAMS = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
GRADS = [p + "_grad" for p in PARAMS]


def input_fun(model: Any) -> None:
    return None


def forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.fc(model, "data", "fc1", 4, 3)
    hidden = brew.relu(model, hidden, hidden)
    out = brew.fc(model, hidden, "fc2", 3, 2)
    sq = model.net.SquaredL2Distance([out, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def param_update(model: Any) -> None:
    """Caffe2's DPM test update: per-device Iter, LearningRate and WeightedSum."""
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        if isinstance(grad, core.GradientSlice):
            model.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        else:
            model.WeightedSum([param, one, grad, lr], param)


def build_sgd(model: Any) -> Any:
    return optimizer.build_sgd(model, 0.1, policy="fixed")


def parallelize(devices: list[int], gpu: bool = False, **kwargs: Any) -> Any:
    if gpu:
        workspace.SetVirtualGpus(max(8, max(devices) + 1))
    model = model_helper.ModelHelper(name="dpm_conformance")
    kwargs.setdefault("input_builder_fun", input_fun)
    kwargs.setdefault("forward_pass_builder_fun", forward)
    if "optimizer_builder_fun" not in kwargs:
        kwargs.setdefault("param_update_builder_fun", param_update)
    data_parallel_model.Parallelize(model, devices=devices, cpu_device=not gpu, **kwargs)
    return model


def ops(net: Any, *types: str) -> list[Any]:
    return [op for op in net.Proto().op if not types or op.type in types]


def feed(model: Any, devices: list[int], batch: int = 8, seed: int = 0) -> None:
    rs = np.random.RandomState(seed)
    data = rs.rand(batch, 4).astype(np.float32)
    label = rs.rand(batch, 2).astype(np.float32)
    per = batch // len(devices)
    for i, d in enumerate(devices):
        with core.DeviceScope(core.DeviceOption(model._device_type, d)):
            workspace.FeedBlob(f"{model._device_prefix}_{d}/data", data[i * per:(i + 1) * per])
            workspace.FeedBlob(f"{model._device_prefix}_{d}/label",
                               label[i * per:(i + 1) * per])
