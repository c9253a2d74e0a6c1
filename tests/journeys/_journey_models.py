"""Small models for the user-journey tests: an MLP or a conv + SpatialBN net, Parallelized
on CPU devices or virtual GPUs with the options users combine."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph import brew, core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.proto import caffe2_pb2

BATCH = 2


def forward(bn: bool, is_test: bool = False, spatial_bn: bool = True) -> Any:
    """A forward builder: MLP (8 -> 6 -> 3), or Conv [+ SpatialBN] + Relu + MaxPool + FC
    on 3x4x4 images."""

    def build(model: Any, loss_scale: float) -> list[Any]:
        if bn:
            conv = brew.conv(model, "data", "conv", dim_in=3, dim_out=4, kernel=3, pad=1)
            if spatial_bn:
                conv = brew.spatial_bn(model, conv, "bn", 4, epsilon=1e-3, is_test=is_test)
            relu = brew.relu(model, conv, "relu")
            pool = brew.max_pool(model, relu, "pool", kernel=2, stride=2)
            logits = brew.fc(model, pool, "fc", dim_in=4 * 2 * 2, dim_out=3)
        else:
            hidden = brew.fc(model, "data", "fc1", dim_in=8, dim_out=6)
            hidden = brew.relu(model, hidden, hidden)
            logits = brew.fc(model, hidden, "fc", dim_in=6, dim_out=3)
        softmax = brew.softmax(model, logits, "softmax")
        if is_test:
            return []
        xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
        loss = model.net.AveragedLoss(xent, "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    return build


def parallelize(devices: list[int], cpu: bool = True, bn: bool = False, name: str = "m",
                spatial_bn: bool = True, **options: Any) -> Any:
    """A fresh workspace and a Parallelized training model (SGD with momentum)."""
    workspace.ResetWorkspace()
    optimizer.reset_optimizer_instance_count()    # stable "SgdOptimizer_0_lr" blob names
    if not cpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name=name)
    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None,
        forward_pass_builder_fun=forward(bn, spatial_bn=spatial_bn),
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1, momentum=0.9),
        devices=devices, cpu_device=cpu, **options)
    return model


def feed(model: Any, seed: int, bn: bool = False) -> None:
    """Feed a random batch to every device of ``model``."""
    rng = np.random.default_rng(seed)
    shape = (BATCH, 3, 4, 4) if bn else (BATCH, 8)
    device_type = caffe2_pb2.CPU if model._device_type == caffe2_pb2.CPU else caffe2_pb2.CUDA
    for device in model._devices:
        with core.DeviceScope(core.DeviceOption(device_type, device)):
            prefix = f"{model._device_prefix}_{device}"
            workspace.FeedBlob(f"{prefix}/data", rng.normal(size=shape).astype(np.float32))
            workspace.FeedBlob(f"{prefix}/label",
                               rng.integers(0, 3, BATCH).astype(np.int32))


def train(model: Any, steps: int, bn: bool = False) -> None:
    """Run the init net, then ``steps`` iterations on random batches."""
    data_parallel_model.RunInitNet(model)
    for step in range(steps):
        feed(model, step, bn)
        data_parallel_model.RunNet(model, 1)
