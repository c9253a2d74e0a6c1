"""Predictor models for the export tests: an MLP, a CNN with BN and pooling, and a small
CNN trained with Parallelize on 4 CPU devices.  Each returns (predict_net, params, input
name, input shape without the batch dim); params live in the current workspace."""

from __future__ import annotations

from typing import Any

import numpy as np
from _dpm_updates import manual_sgd

from dpgraph import brew, core, data_parallel_model, workspace
from dpgraph.model_helper import ExtractPredictorNet, ModelHelper
from dpgraph.proto import caffe2_pb2

Built = tuple[Any, list[str], str, tuple[int, ...]]


def _perturb(names: list[str], seed: int) -> None:
    """Give parameters non-trivial values (biases and BN statistics start constant)."""
    rng = np.random.default_rng(seed)
    for name in names:
        value = workspace.FetchBlob(name)
        noise = rng.standard_normal(value.shape).astype(np.float32) * 0.3
        if name.endswith("_riv"):
            noise = np.abs(noise) + 0.5
        workspace.FeedBlob(name, (value + noise).astype(np.float32))


def mlp() -> Built:
    workspace.ResetWorkspace()
    model = ModelHelper(name="mlp")
    hidden = brew.fc(model, "data", "fc1", dim_in=10, dim_out=16)
    hidden = brew.relu(model, hidden, hidden)
    hidden = brew.fc(model, hidden, "fc2", dim_in=16, dim_out=5)
    softmax = brew.softmax(model, hidden, "softmax")
    workspace.RunNetOnce(model.param_init_net)
    predict_net, params = ExtractPredictorNet(model.net.Proto(), ["data"], [softmax])
    _perturb(params, 0)
    return predict_net, [str(p) for p in params], "data", (10,)


def cnn() -> Built:
    workspace.ResetWorkspace()
    model = ModelHelper(name="cnn", arg_scope={"order": "NCHW"}, init_params=True)
    conv = brew.conv(model, "data", "conv1", dim_in=3, dim_out=8, kernel=3, pad=1)
    bn = brew.spatial_bn(model, conv, "bn1", 8, epsilon=1e-4, is_test=True)
    relu = brew.relu(model, bn, "relu1")
    pool = brew.max_pool(model, relu, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool, "conv2", dim_in=8, dim_out=6, kernel=3, pad=1, stride=1)
    relu2 = brew.relu(model, conv2, conv2)
    avg = brew.average_pool(model, relu2, "pool2", kernel=2, stride=1, pad=1)
    fc = brew.fc(model, avg, "fc", dim_in=6 * 5 * 5, dim_out=4)
    softmax = brew.softmax(model, fc, "softmax")
    workspace.RunNetOnce(model.param_init_net)
    predict_net, params = ExtractPredictorNet(model.net.Proto(), ["data"], [softmax])
    _perturb(params, 1)
    return predict_net, [str(p) for p in params], "data", (3, 8, 8)


DEVICES = 4
PARALLEL_BATCH = 16


def _parallel_forward(model: Any, loss_scale: float) -> list[Any]:
    conv = brew.conv(model, "data", "conv", dim_in=1, dim_out=4, kernel=3, pad=1)
    relu = brew.relu(model, conv, "relu")
    pool = brew.max_pool(model, relu, "pool", kernel=2, stride=2)
    fc = brew.fc(model, pool, "fc", dim_in=4 * 3 * 3, dim_out=3)
    softmax = brew.softmax(model, fc, "softmax")
    xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.net.AveragedLoss(xent, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def parallel_cnn(iterations: int = 3) -> Built:
    """Trained with data_parallel_model.Parallelize on 4 CPU devices; extracted with
    data_parallel_model.ExtractPredictorNet (parameters keep their ``cpu_0/`` names)."""
    workspace.ResetWorkspace()
    model = ModelHelper(name="dpm_export")
    data_parallel_model.Parallelize(model, lambda m: None, _parallel_forward,
                                    param_update_builder_fun=manual_sgd,
                                    devices=list(range(DEVICES)), cpu_device=True)
    rng = np.random.default_rng(2)
    per = PARALLEL_BATCH // DEVICES
    data_parallel_model.RunInitNet(model)
    for _ in range(iterations):
        images = rng.standard_normal((PARALLEL_BATCH, 1, 6, 6)).astype(np.float32)
        labels = rng.integers(0, 3, PARALLEL_BATCH).astype(np.int32)
        for d in range(DEVICES):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, d)):
                workspace.FeedBlob(f"cpu_{d}/data", images[d * per:(d + 1) * per])
                workspace.FeedBlob(f"cpu_{d}/label", labels[d * per:(d + 1) * per])
        data_parallel_model.RunNet(model, 1)
    predict_net, params = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["softmax"], core.DeviceOption(caffe2_pb2.CPU, 0))
    return predict_net, [str(p) for p in params], "data", (1, 6, 6)


MODELS = {"mlp": mlp, "cnn": cnn, "parallel_cnn": parallel_cnn}
