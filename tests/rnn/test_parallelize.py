"""A recurrent model under data_parallel_model.Parallelize (Caffe2's test_equiv_recurrent):
step-net parameters are grouped, all-reduced and updated like any other, so 1, 2 and 4
CPU devices and 2 virtual GPUs give the same parameters after 5 iterations; the memonger
path (``.rename`` arguments read by the gradient op) gives them too."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import cnn, core, data_parallel_model, rnn_cell, workspace
from dpgraph.proto import caffe2_pb2

T, BATCH, D_IN, HIDDEN, ITERS = 4, 8, 3, 5, 5


def _run(devices: int, gpu: bool, optimize_memory: bool) -> dict[str, np.ndarray]:
    workspace.ResetWorkspace()
    model = cnn.CNNModelHelper(name=f"recurrent_test{devices}")
    per_device = BATCH // devices

    def build(model: cnn.CNNModelHelper, loss_scale: float) -> list:
        workspace.FeedBlob(core.ScopedBlobReference("seq_lengths"),
                           np.array([T] * per_device, dtype=np.int32))
        model.param_init_net.UniformFill([], "hidden_init", shape=[1, per_device, HIDDEN],
                                         min=-0.1, max=0.1)
        model.param_init_net.ConstantFill([], "cell_init", shape=[1, per_device, HIDDEN],
                                          value=0.1)
        output, _, _, _ = rnn_cell.LSTM(model, "data", "seq_lengths",
                                        ("hidden_init", "cell_init"), dim_in=D_IN,
                                        dim_out=HIDDEN, scope="partest")
        dist = model.net.Sub([output, "target"], "dist")
        loss = model.net.AveragedLoss(dist, "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    def update(model: cnn.CNNModelHelper) -> None:
        model.Iter("ITER")
        lr = model.net.LearningRate(["ITER"], "LR", base_lr=-0.1, policy="fixed")
        one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in model.GetParams():
            grad = model.param_to_grad[param]
            model.WeightedSum([param, one, grad, lr], param)
        assert len(model.GetParams()) == len(model.params) // devices

    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=build,
        param_update_builder_fun=update, devices=list(range(devices)),
        optimize_gradient_memory=optimize_memory, cpu_device=not gpu)
    for op in model.param_init_net.Proto().op:  # deterministic weights, as Caffe2's test
        if op.type.endswith("Fill") and op.type != "ConstantFill":
            op.type = "ConstantFill"
            kept = [a for a in op.arg if a.name in ("shape", "value")]
            del op.arg[:]
            op.arg.extend(kept)
    prefix = "gpu" if gpu else "cpu"
    rng = np.random.default_rng(20150210)
    for iteration in range(ITERS):
        data = rng.standard_normal((T, BATCH, D_IN)).astype(np.float32)
        target = rng.standard_normal((T, BATCH, HIDDEN)).astype(np.float32)
        for g in range(devices):
            device = core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, g)
            rows = slice(g * per_device, (g + 1) * per_device)
            workspace.FeedBlob(f"{prefix}_{g}/data", data[:, rows], device)
            workspace.FeedBlob(f"{prefix}_{g}/target", target[:, rows], device)
        if iteration == 0:
            workspace.RunNetOnce(model.param_init_net)
            for g in range(devices):  # the same initial states on every device's rows
                hidden = np.linspace(-0.1, 0.1, BATCH * HIDDEN, dtype=np.float32)
                device = core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, g)
                rows = slice(g * per_device, (g + 1) * per_device)
                workspace.FeedBlob(f"{prefix}_{g}/hidden_init",
                                   hidden.reshape(1, BATCH, HIDDEN)[:, rows], device)
            workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Proto().name)
    names = ["partest/i2h_w", "partest/i2h_b", "partest/gates_t_w", "partest/gates_t_b"]
    return {n: workspace.FetchBlob(f"{prefix}_0/{n}") for n in names}


@pytest.fixture(scope="module")
def single_device() -> dict[str, np.ndarray]:
    return _run(1, False, False)


@pytest.mark.parametrize("devices,gpu,memory", [(2, False, False), (4, False, False),
                                                (2, True, False), (2, False, True)],
                         ids=["cpu2", "cpu4", "vgpu2", "cpu2-memonger"])
def test_devices_match_single_device(single_device: dict[str, np.ndarray], devices: int,
                                     gpu: bool, memory: bool) -> None:
    if gpu:
        workspace.SetVirtualGpus(devices)
    try:
        result = _run(devices, gpu, memory)
    finally:
        if gpu:
            workspace.SetVirtualGpus(0)
    for name, value in single_device.items():
        np.testing.assert_allclose(result[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_single_device_memonger_and_training_moves_params(
        single_device: dict[str, np.ndarray]) -> None:
    again = _run(1, False, True)
    for name, value in single_device.items():
        np.testing.assert_allclose(again[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.abs(single_device["partest/gates_t_w"]).sum() > 0
