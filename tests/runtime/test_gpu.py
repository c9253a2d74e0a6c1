"""GPU tier: an MLP training step on a real GPU through CuPy (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import devices

pytestmark = pytest.mark.gpu


def _require_real_gpu() -> None:
    if devices.real_gpu_count() == 0:
        pytest.skip("needs CuPy and a CUDA GPU (cupy not importable or no device)")


def _mlp(name: str) -> core.Net:
    net = core.Net(name)
    h = net.FC(["data", "w0", "b0"], "h")
    r = net.Relu(h, "r")
    logits = net.FC([r, "w1", "b1"], "logits")
    _, loss = net.SoftmaxWithLoss([logits, "label"], ["prob", "loss"])
    grads = net.AddGradientOperators([loss])
    for p in ("w0", "b0", "w1", "b1"):
        net.MomentumSGDUpdate([grads[p], f"{p}_m", "lr", p], [grads[p], f"{p}_m", p],
                              momentum=0.9)
    return net


def _feed(device: caffe2_pb2.DeviceOption, rng: np.random.Generator) -> None:
    shapes = {"w0": (32, 20), "b0": (32,), "w1": (5, 32), "b1": (5,)}
    for name, shape in shapes.items():
        value = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        workspace.FeedBlob(name, value, device)
        workspace.FeedBlob(f"{name}_m", np.zeros(shape, np.float32), device)
    workspace.FeedBlob("data", rng.standard_normal((16, 20)).astype(np.float32), device)
    workspace.FeedBlob("label", rng.integers(0, 5, 16).astype(np.int32), device)
    workspace.FeedBlob("lr", np.array([0.1], np.float32), device)


def test_mlp_training_step_on_real_gpu() -> None:
    _require_real_gpu()
    results = {}
    for label, device in (("cpu", core.DeviceOption(caffe2_pb2.CPU)),
                          ("gpu", core.DeviceOption(caffe2_pb2.CUDA, 0))):
        workspace.ResetWorkspace()
        _feed(device, np.random.default_rng(0))
        net = _mlp(f"rt_gpu_mlp_{label}")
        net.Proto().device_option.CopyFrom(device)
        workspace.RunNetOnce(net)
        workspace.RunNetOnce(net)
        results[label] = {p: workspace.FetchBlob(p) for p in ("w0", "b1", "loss")}
    from dpgraph.runtime.api import current

    assert current().placement("w0") == (caffe2_pb2.CUDA, 0)
    assert type(current().get_blob("w0")).__module__.startswith("cupy")
    for name, value in results["cpu"].items():
        np.testing.assert_allclose(results["gpu"][name], value, rtol=1e-4, atol=1e-5)
