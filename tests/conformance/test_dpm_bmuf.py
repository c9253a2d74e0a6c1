"""Parallelize_BMUF public behaviour (dpm-distributed-facts.md, BMUF and lifecycle), single
host, on CPU devices and virtual GPUs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _workspace import clean_workspace  # noqa: F401  (autouse)

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.proto import caffe2_pb2

PARAMS = ["fc_w", "fc_b"]


def forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", 4, 1)
    sq = model.net.SquaredL2Distance([fc, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def sgd_update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        model.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def momentum_update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=0.1, policy="fixed")
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        mom = model.param_init_net.ConstantFill([param], param + "_momentum", value=0.0)
        model.net.MomentumSGDUpdate([grad, mom, lr, param], [grad, mom, param], momentum=0.9)


def bmuf(devices: list[int], gpu: bool = False, update=sgd_update, **kwargs: Any) -> Any:
    if gpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="bmuf_conformance")
    data_parallel_model.Parallelize_BMUF(model, lambda m: None, forward, update,
                                         devices=devices, cpu_device=not gpu, **kwargs)
    return model


def feed(model: Any, devices: list[int], seed: int = 3) -> None:
    rs = np.random.RandomState(seed)
    for d in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, d)):
            workspace.FeedBlob(f"{model._device_prefix}_{d}/data",
                               rs.rand(4, 4).astype(np.float32))
            workspace.FeedBlob(f"{model._device_prefix}_{d}/label",
                               rs.rand(4, 1).astype(np.float32))


def test_bmuf_lifecycle_nets_and_attributes() -> None:
    model = bmuf([0, 1])
    assert model._data_parallel_model_init_nets == [model.param_init_net,
                                                    model._global_model_init_net]
    assert model._data_parallel_model_nets == [model.net,
                                               (model._global_model_param_updates_net, 1)]
    assert list(model._device_grouped_blobs) == PARAMS
    assert model._device_prefix == "cpu" and list(model._devices) == [0, 1]
    assert model.net.Proto().num_workers == 8 and model.net.Proto().type == "dag"


def test_bmuf_global_init_net() -> None:
    model = bmuf([0, 1], nesterov=True)
    summary = [(op.type, list(op.input), list(op.output))
               for op in model._global_model_init_net.Proto().op]
    for p in PARAMS:
        assert ("ConstantFill", [f"cpu_0/{p}"], [f"cpu_0/{p}_v"]) in summary
        assert ("Copy", [f"cpu_0/{p}"], [f"cpu_0/{p}_g"]) in summary
        assert ("ConstantFill", [f"cpu_0/{p}"], [f"cpu_0/{p}_prev"]) in summary
    assert not any(o.startswith("cpu_1/") for _, _, outs in summary for o in outs)


def test_bmuf_master_device_and_block_momentum_default() -> None:
    model = bmuf([0, 1, 2, 3], master_device=2)
    ops = model._global_model_param_updates_net.Proto().op
    scales = [(op.input[0], op.arg[0].f) for op in ops if op.type == "Scale"]
    assert ("cpu_2/fc_w_v", pytest.approx(0.75)) in scales
    assert ("cpu_2/fc_w", pytest.approx(0.25)) in scales


def _one_block(nesterov: bool, gpu: bool) -> None:
    devices = [0, 1]
    model = bmuf(devices, gpu=gpu, nesterov=nesterov, block_learning_rate=0.7)
    prefix = model._device_prefix
    feed(model, devices)
    data_parallel_model.RunInitNet(model)
    fetch = workspace.FetchBlob
    for _ in range(2):  # two blocks; check the second
        workspace.RunNet(model.net.Proto().name, 2)
        before = {p: [fetch(f"{prefix}_{d}/{p}") for d in devices] for p in PARAMS}
        g_ = {p: fetch(f"{prefix}_0/{p}_g") for p in PARAMS}
        v_ = {p: fetch(f"{prefix}_0/{p}_v") for p in PARAMS}
        prev_ = {p: fetch(f"{prefix}_0/{p}_prev") for p in PARAMS} if nesterov else {}
        workspace.RunNetOnce(model._global_model_param_updates_net)
    for p in PARAMS:
        delta = 0.7 * (sum(before[p]) / 2 - g_[p])
        v = 0.5 * v_[p] + delta
        g = g_[p] + v
        if nesterov:
            g = g - 0.5 * (v - prev_[p])
            np.testing.assert_allclose(fetch(f"{prefix}_0/{p}_prev"), v, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(fetch(f"{prefix}_0/{p}_v"), v, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(fetch(f"{prefix}_0/{p}_g"), g, rtol=1e-5, atol=1e-7)
        for d in devices:
            np.testing.assert_allclose(fetch(f"{prefix}_{d}/{p}"), g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_bmuf_block_update(nesterov: bool, gpu: bool) -> None:
    _one_block(nesterov, gpu)


def test_bmuf_warmup() -> None:
    model = bmuf([0, 1], warmup_iterations=3)
    assert model._warmup_iterations == 3
    feed(model, [0, 1])
    data_parallel_model.RunInitNet(model)
    workspace.FeedBlob("cpu_1/fc_w", np.full((1, 4), 9.0, np.float32))
    data_parallel_model.RunWarmup(model)
    assert workspace.FetchBlob("cpu_0/ITER") == 3
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_1/fc_w"),
                                  workspace.FetchBlob("cpu_0/fc_w"))
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_0/fc_w_g"),
                                  workspace.FetchBlob("cpu_0/fc_w"))


def test_bmuf_reset_momentum_sgd_and_add_blobs_to_sync() -> None:
    def update(model):
        momentum_update(model)
        model.param_init_net.ConstantFill([], "extra", shape=[1], value=1.0)

    model = bmuf([0, 1], update=update, reset_momentum_sgd=True, add_blobs_to_sync=["extra"])
    ops = model._global_model_param_updates_net.Proto().op
    resets = [(list(op.input), list(op.output)) for op in ops if op.type == "ConstantFill"]
    assert sorted(resets) == sorted(([f"cpu_{d}/{p}_momentum"], [f"cpu_{d}/{p}_momentum"])
                                    for d in (0, 1) for p in PARAMS)
    copies = [(op.input[0], op.output[0]) for op in ops if op.type == "Copy"]
    assert ("cpu_0/extra", "cpu_1/extra") in copies
    feed(model, [0, 1])
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 2)
    for d in (0, 1):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/fc_w_momentum"),
                                      np.zeros((1, 4), np.float32))


def test_bmuf_gpu_variant_names() -> None:
    model = model_helper.ModelHelper(name="bmuf_gpu")
    workspace.SetVirtualGpus(2)
    data_parallel_model.Parallelize_GPU_BMUF(model, lambda m: None, forward, sgd_update,
                                             devices=[0, 1])
    assert model._device_prefix == "gpu"
    assert model._device_type == workspace.GpuDeviceType
    model = model_helper.ModelHelper(name="bmuf_cpu")
    data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, forward, sgd_update,
                                             devices=[0, 1])
    assert model._device_type == caffe2_pb2.CPU
