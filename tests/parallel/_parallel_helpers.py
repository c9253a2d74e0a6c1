"""Shared builders for the Parallelize tests: tiny models, feeding, N-vs-1 comparison."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from _dpm_updates import manual_sgd

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.proto import caffe2_pb2

BATCH = 48
IN, HIDDEN, OUT = 6, 5, 3
VOCAB, EMB = 10, 4


def data(seed: int = 0, batch: int = BATCH) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    return {
        "data": rs.randn(batch, IN).astype(np.float32),
        "label": rs.randn(batch, OUT).astype(np.float32),
        "indices": rs.randint(0, VOCAB, size=(batch,)).astype(np.int32),
        "image": rs.randn(batch, 2, 3, 3).astype(np.float32),
    }


def device_option(gpu: bool, device: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, device)


def mlp_forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.fc(model, "data", "fc1", IN, HIDDEN)
    hidden = brew.relu(model, hidden, "relu1")
    out = brew.fc(model, hidden, "fc2", HIDDEN, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sparse_forward(model: Any, loss_scale: float) -> list[Any]:
    emb = model.create_param("emb", [VOCAB, EMB], _initializer("XavierFill"))
    rows = model.net.Gather([emb, "indices"], "rows")
    out = brew.fc(model, rows, "fc", EMB, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def bn_forward(model: Any, loss_scale: float) -> list[Any]:
    bn = brew.spatial_bn(model, "image", "bn", 2, epsilon=1e-5, momentum=0.9, is_test=False)
    flat = model.net.Flatten(bn, "flat")
    out = brew.fc(model, flat, "fc", 18, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def _initializer(op: str) -> Any:
    from dpgraph.modeling.initializers import Initializer

    return Initializer(op)


def optimizer_fun(kind: str) -> Callable[[Any], Any]:
    from dpgraph import optimizer

    def build(model: Any) -> Any:
        if kind == "sgd":
            return optimizer.build_sgd(model, 0.1)
        if kind == "momentum":
            return optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=False)
        if kind == "clip":
            return optimizer.build_sgd(model, 0.1, max_gradient_norm=1e4,
                                       allow_lr_injection=True)
        raise ValueError(kind)

    return build


def param_value(name: str, shape: Sequence[int]) -> np.ndarray:
    rs = np.random.RandomState(zlib.crc32(name.encode()))
    return (0.5 * rs.randn(*shape)).astype(np.float32)


def train(devices: Sequence[int], *, gpu: bool = False, forward: Callable = mlp_forward,
          update: str = "manual", iters: int = 10, seed: int = 0,
          **parallelize_kwargs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """Parallelize, feed each device its slice of one batch, run ``iters`` iterations and
    return the model and the first device's params (by stripped name)."""
    workspace.ResetWorkspace()
    devices = list(devices)
    if gpu:
        workspace.SetVirtualGpus(max(max(devices) + 1, 1))
    model = model_helper.ModelHelper(name="dpm_test")
    kwargs: dict[str, Any] = dict(parallelize_kwargs)
    if update == "manual":
        kwargs["param_update_builder_fun"] = manual_sgd
    else:
        kwargs["optimizer_builder_fun"] = optimizer_fun(update)
    data_parallel_model.Parallelize(model, lambda m: None, forward, devices=devices,
                                    cpu_device=not gpu, **kwargs)
    feed_batch(model, devices, gpu, seed)
    data_parallel_model.RunInitNet(model)
    _set_params(model, devices, gpu)
    if update == "clip":
        workspace.FeedBlob("lr_injection", np.array([0.5], dtype=np.float32))
    for _ in range(iters):
        # sparse all-gather writes the concatenated indices back into the input blob
        feed_batch(model, devices, gpu, seed)
        data_parallel_model.RunNet(model, 1)
    prefix = f"{model._device_prefix}_{devices[0]}/"
    names = [str(p) for p in model.GetParams(prefix)] + [
        str(p) for p in model.GetComputedParams(prefix)]
    return model, {n[len(prefix):]: workspace.FetchBlob(n) for n in names}


def feed_batch(model: Any, devices: Sequence[int], gpu: bool, seed: int = 0) -> None:
    """Feed device i the i-th slice of one batch."""
    feed = data(seed)
    per = BATCH // len(devices)
    for i, device in enumerate(devices):
        with core.DeviceScope(device_option(gpu, device)):
            for name, value in feed.items():
                workspace.FeedBlob(f"{model._device_prefix}_{device}/{name}",
                                   value[i * per:(i + 1) * per])


def _set_params(model: Any, devices: Sequence[int], gpu: bool) -> None:
    """Give every device the same deterministic parameter values (random inits differ
    between runs with different device counts)."""
    for device in devices:
        prefix = f"{model._device_prefix}_{device}/"
        for param in model.GetParams(prefix):
            if not workspace.HasBlob(str(param)):
                continue
            value = workspace.FetchBlob(str(param))
            with core.DeviceScope(device_option(gpu, device)):
                workspace.FeedBlob(str(param), param_value(str(param)[len(prefix):],
                                                           value.shape))


def assert_same_params(ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
                       rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert sorted(ref) == sorted(got)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=rtol, atol=atol, err_msg=name)


def build(devices: Sequence[int], *, gpu: bool = False, forward: Callable = mlp_forward,
          update: str | None = "manual", **parallelize_kwargs: Any) -> Any:
    """A parallelized model (graph only, nothing run)."""
    if gpu and workspace.NumGpuDevices() <= max(devices):
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="dpm_struct")
    kwargs: dict[str, Any] = dict(parallelize_kwargs)
    if update == "manual":
        kwargs.setdefault("param_update_builder_fun", manual_sgd)
    elif update is not None:
        kwargs["optimizer_builder_fun"] = optimizer_fun(update)
    data_parallel_model.Parallelize(model, lambda m: None, forward, devices=list(devices),
                                    cpu_device=not gpu, **kwargs)
    return model


def ops_of(net: Any, *types: str) -> list[Any]:
    return [op for op in net.Proto().op if not types or op.type in types]
