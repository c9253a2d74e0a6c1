"""A recurrent model under data_parallel_model.Parallelize (Caffe2's test_equiv_recurrent):
step-net parameters are grouped, all-reduced and updated like any other, so 1, 2 and 4
CPU devices and 2 virtual GPUs give the same parameters after 5 iterations; the memonger
path gives them too, and a checkpoint taken mid-training resumes to the same parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph import cnn, core, data_parallel_model, rnn_cell, workspace
from dpgraph.proto import caffe2_pb2

T, BATCH, D_IN, HIDDEN, ITERS = 4, 8, 3, 5, 5


def _build(devices: int, gpu: bool, optimize_memory: bool) -> cnn.CNNModelHelper:
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
    return model


def _device(gpu: bool, g: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, g)


def _init(model: cnn.CNNModelHelper, devices: int, gpu: bool) -> None:
    """Init net, a non-zero initial hidden state (the same row everywhere: checkpoints
    restore init-net blobs from device 0 to all devices), CreateNet."""
    prefix, per_device = ("gpu" if gpu else "cpu"), BATCH // devices
    workspace.RunNetOnce(model.param_init_net)
    hidden = np.linspace(-0.1, 0.1, HIDDEN, dtype=np.float32)
    for g in range(devices):
        workspace.FeedBlob(f"{prefix}_{g}/hidden_init",
                           np.tile(hidden, (1, per_device, 1)), _device(gpu, g))
    workspace.CreateNet(model.net)


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(20150210)
    return [(rng.standard_normal((T, BATCH, D_IN)).astype(np.float32),
             rng.standard_normal((T, BATCH, HIDDEN)).astype(np.float32))
            for _ in range(ITERS)]


def _train(model: cnn.CNNModelHelper, devices: int, gpu: bool,
           batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
    prefix, per_device = ("gpu" if gpu else "cpu"), BATCH // devices
    for data, target in batches:
        for g in range(devices):
            rows = slice(g * per_device, (g + 1) * per_device)
            workspace.FeedBlob(f"{prefix}_{g}/data", data[:, rows], _device(gpu, g))
            workspace.FeedBlob(f"{prefix}_{g}/target", target[:, rows], _device(gpu, g))
        workspace.RunNet(model.net.Proto().name)


PARAMS = ["partest/i2h_w", "partest/i2h_b", "partest/gates_t_w", "partest/gates_t_b"]


def _params(prefix: str) -> dict[str, np.ndarray]:
    return {n: workspace.FetchBlob(f"{prefix}_0/{n}") for n in PARAMS}


def _run(devices: int, gpu: bool, optimize_memory: bool) -> dict[str, np.ndarray]:
    workspace.ResetWorkspace()
    model = _build(devices, gpu, optimize_memory)
    _init(model, devices, gpu)
    _train(model, devices, gpu, _batches())
    return _params("gpu" if gpu else "cpu")


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


def test_checkpoint_and_resume_match_uninterrupted_training(
        single_device: dict[str, np.ndarray], tmp_path: Any) -> None:
    from dpgraph.checkpoint import load_model_checkpoint, save_model_checkpoint

    batches = _batches()
    workspace.ResetWorkspace()
    model = _build(2, False, False)
    _init(model, 2, False)
    _train(model, 2, False, batches[:2])
    saved = save_model_checkpoint(model, tmp_path / "rnn.ckpt")
    assert "cpu_0/partest/gates_t_w" in saved
    workspace.ResetWorkspace()
    model = _build(2, False, False)
    _init(model, 2, False)
    load_model_checkpoint(model, tmp_path / "rnn.ckpt")
    _train(model, 2, False, batches[2:])
    for name, value in _params("cpu").items():
        np.testing.assert_allclose(value, single_device[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
