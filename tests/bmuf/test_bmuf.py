"""Parallelize_BMUF: nets, grouped blobs, initial momentum, and the exact block update
identities on CPU devices and virtual GPUs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _dpm_updates import manual_sgd

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.errors import ParallelizeError
from dpgraph.parallel.lifecycle import RunInitNet, RunNet, RunWarmup
from dpgraph.proto import caffe2_pb2

BATCH = 8
F32 = np.float32


def forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", 16, 1)
    flat = model.net.FlattenToVec(fc, "fc_fl")
    sigm = model.net.Sigmoid(flat, "sigm")
    sq = model.net.SquaredL2Distance([sigm, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def momentum_update(model: Any) -> None:
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        mom = model.param_init_net.ConstantFill(
            [param], core.BlobReference(str(param) + "_momentum"), value=0.0)
        model.net.MomentumSGDUpdate([grad, mom, lr, param], [grad, mom, param], momentum=0.9)


def _option(gpu: bool, device: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, device)


def _feed(devices: list[int], gpu: bool, prefix: str) -> None:
    for d in devices:
        rs = np.random.RandomState(d)
        workspace.FeedBlob(f"{prefix}_{d}/data", rs.randn(BATCH, 16).astype(F32),
                           _option(gpu, d))
        workspace.FeedBlob(f"{prefix}_{d}/label", rs.rand(BATCH).astype(F32), _option(gpu, d))


def _build(gpu: bool, devices: list[int], update: Any = manual_sgd, **kwargs: Any) -> Any:
    if gpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="bmuf")
    fun = (data_parallel_model.Parallelize_GPU_BMUF if gpu
           else data_parallel_model.Parallelize_CPU_BMUF)
    fun(model, lambda m: None, forward, update, devices=devices, **kwargs)
    _feed(devices, gpu, model._device_prefix)
    return model


def fetch(name: str) -> np.ndarray:
    return workspace.FetchBlob(name)


@pytest.mark.parametrize("gpu", [False, True])
def test_structure_and_initial_momentum(gpu: bool) -> None:
    model = _build(gpu, [0, 1])
    prefix = "gpu" if gpu else "cpu"
    assert model._device_prefix == prefix and model._devices == [0, 1]
    assert model._data_parallel_model_init_nets == [model.param_init_net,
                                                    model._global_model_init_net]
    assert model._data_parallel_model_nets == [model.net,
                                               (model._global_model_param_updates_net, 1)]
    assert model.net.Proto().type == "dag" and model.net.Proto().num_workers == 8
    RunInitNet(model)
    assert list(model._device_grouped_blobs) == ["fc_w", "fc_b"]
    np.testing.assert_array_equal(fetch(f"{prefix}_0/fc_b_v"), np.zeros(1, F32))
    np.testing.assert_array_equal(fetch(f"{prefix}_0/fc_w_v"), np.zeros((1, 16), F32))
    np.testing.assert_array_equal(fetch(f"{prefix}_0/fc_w_g"), fetch(f"{prefix}_0/fc_w"))
    np.testing.assert_array_equal(fetch(f"{prefix}_1/fc_w"), fetch(f"{prefix}_0/fc_w"))
    assert not workspace.HasBlob(f"{prefix}_1/fc_w_v")  # global state lives on the master
    for op in model._global_model_param_updates_net.Proto().op:
        if op.type in ("Scale", "Sub", "Add"):
            assert op.device_option.device_id == 0
            assert op.device_option.device_type == (caffe2_pb2.CUDA if gpu
                                                    else caffe2_pb2.CPU)


def _expected(p: list[np.ndarray], g_: np.ndarray, v_: np.ndarray, prev_: np.ndarray | None,
              lr: float, momentum: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    total = p[0]
    for x in p[1:]:
        total = total + x
    block = (total * F32(1.0 / len(p)) - g_) * F32(lr)
    v = v_ * F32(momentum) + block
    g = g_ + v
    prev = None
    if prev_ is not None:
        prev = (v - prev_) * F32(momentum)
        g = g - prev
        prev = v
    return v, g, prev


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("rates", [(1.0, None), (0.7, 0.3)])
def test_update_identities(gpu: bool, nesterov: bool, rates: tuple[float, Any]) -> None:
    lr, momentum = rates
    model = _build(gpu, [0, 1], block_learning_rate=lr, block_momentum=momentum,
                   nesterov=nesterov)
    momentum = 0.5 if momentum is None else momentum
    prefix = model._device_prefix
    RunInitNet(model)
    RunNet(model, 1)          # one local step and one global step: non-zero momentum
    for _ in range(2):
        names = ("fc_w", "fc_b")
        v_ = {n: fetch(f"{prefix}_0/{n}_v") for n in names}
        prev_ = {n: fetch(f"{prefix}_0/{n}_prev") if nesterov else None for n in names}
        workspace.RunNet(model.net.Proto().name)          # local step on every device
        local = {n: [fetch(f"{prefix}_{d}/{n}") for d in (0, 1)] for n in names}
        g_ = {n: fetch(f"{prefix}_0/{n}_g") for n in names}
        assert not np.array_equal(local["fc_w"][0], local["fc_w"][1])
        workspace.RunNetOnce(model._global_model_param_updates_net)
        for n in names:
            v, g, prev = _expected(local[n], g_[n], v_[n], prev_[n], lr, momentum)
            assert np.abs(v).max() > 0
            np.testing.assert_array_equal(fetch(f"{prefix}_0/{n}_v"), v)
            np.testing.assert_array_equal(fetch(f"{prefix}_0/{n}_g"), g)
            if nesterov:
                np.testing.assert_array_equal(fetch(f"{prefix}_0/{n}_prev"), prev)
            for d in (0, 1):
                np.testing.assert_array_equal(fetch(f"{prefix}_{d}/{n}"), g)


@pytest.mark.parametrize("gpu", [False, True])
def test_four_devices_other_master(gpu: bool) -> None:
    model = _build(gpu, [0, 1, 2, 3], master_device=2, use_nccl=gpu)
    prefix = model._device_prefix
    RunInitNet(model)
    assert workspace.HasBlob(f"{prefix}_2/fc_w_v") and not workspace.HasBlob(f"{prefix}_0/fc_w_v")
    workspace.RunNet(model.net.Proto().name)
    local = [fetch(f"{prefix}_{d}/fc_w") for d in range(4)]
    g_ = fetch(f"{prefix}_2/fc_w_g")
    workspace.RunNetOnce(model._global_model_param_updates_net)
    v, g, _ = _expected(local, g_, np.zeros_like(g_), None, 1.0, 0.75)
    np.testing.assert_allclose(fetch(f"{prefix}_2/fc_w_v"), v, rtol=1e-6, atol=1e-7)
    for d in range(4):
        np.testing.assert_array_equal(fetch(f"{prefix}_{d}/fc_w"), fetch(f"{prefix}_2/fc_w_g"))
    np.testing.assert_allclose(fetch(f"{prefix}_2/fc_w_g"), g, rtol=1e-6, atol=1e-7)


def test_warmup_broadcasts_master_params() -> None:
    model = _build(False, [0, 1], warmup_iterations=3)
    RunInitNet(model)
    workspace.CreateNet(model._warmup_broadcast)
    before = fetch("cpu_0/fc_w")
    RunWarmup(model)
    np.testing.assert_array_equal(fetch("cpu_0/ITER"), [3])
    master = fetch("cpu_0/fc_w")
    assert not np.array_equal(master, before)
    np.testing.assert_array_equal(fetch("cpu_1/fc_w"), master)
    np.testing.assert_array_equal(fetch("cpu_0/fc_w_g"), master)


def test_reset_momentum_sgd_and_blob_sync() -> None:
    model = _build(False, [0, 1], update=momentum_update, reset_momentum_sgd=True,
                   add_blobs_to_sync=["ONE_extra"])
    RunInitNet(model)
    for d in (0, 1):
        workspace.FeedBlob(f"cpu_{d}/ONE_extra", np.full(2, d + 1.0, dtype=F32))
    workspace.RunNet(model.net.Proto().name)
    assert np.abs(fetch("cpu_0/fc_w_momentum")).max() > 0
    workspace.RunNetOnce(model._global_model_param_updates_net)
    for d in (0, 1):
        np.testing.assert_array_equal(fetch(f"cpu_{d}/fc_w_momentum"), np.zeros((1, 16), F32))
        np.testing.assert_array_equal(fetch(f"cpu_{d}/ONE_extra"), [1.0, 1.0])
    assert "ONE_extra" in model._device_grouped_blobs


def test_training_reduces_loss() -> None:
    model = _build(False, [0, 1])
    RunInitNet(model)
    workspace.RunNet(model.net.Proto().name)
    first = float(fetch("cpu_0/loss"))
    RunNet(model, 20)
    for _ in range(5):
        RunNet(model, 20)
    assert float(fetch("cpu_0/loss")) < first


def test_multi_host_graph_reduces_across_hosts() -> None:
    """With num_shards > 1 the global update all-reduces over devices and hosts (one GLOO
    Allreduce per param, on common worlds made in the param init net), the initial
    broadcast spans the hosts, and the barrier nets come first (graph only: nothing runs)."""
    model = model_helper.ModelHelper(name="bmuf_dist")
    rendezvous = {"kv_handler": "store", "shard_id": 0, "num_shards": 2, "engine": "GLOO"}
    data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, forward, manual_sgd,
                                             devices=[0, 1], rendezvous=rendezvous)
    update = model._global_model_param_updates_net.Proto()
    allreduces = [op for op in update.op if op.type == "Allreduce"]
    assert [list(op.input)[1:] for op in allreduces] == [["cpu_0/fc_w", "cpu_1/fc_w"],
                                                         ["cpu_0/fc_b", "cpu_1/fc_b"]]
    assert all(op.engine == "GLOO" for op in allreduces)
    assert not [op for op in update.op if op.type == "Sum"]
    scales = [op for op in update.op if op.type == "Scale" and op.input[0] == "cpu_0/fc_w"]
    assert [a.f for a in scales[0].arg if a.name == "scale"] == [0.25]  # 1/(2 dev * 2 hosts)
    init_types = [op.type for op in model.param_init_net.Proto().op]
    assert "CreateCommonWorld" in init_types and "Broadcast" in init_types
    assert [n.Proto().name for n in model._data_parallel_model_init_nets][0] == \
        model._barrier_init_net.Proto().name
    assert model._data_parallel_model_nets[0] is model._barrier_net


def test_errors_leave_model_unchanged() -> None:
    model = model_helper.ModelHelper(name="bmuf_bad")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(ParallelizeError):
        data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, lambda m, s: "loss",
                                                 manual_sgd, devices=[0, 1])
    assert model.net.Proto().SerializeToString() == before
    assert not hasattr(model, "_global_model_param_updates_net")
    with pytest.raises(ParallelizeError, match="master_device"):
        data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, forward, manual_sgd,
                                                 devices=[0, 1], master_device=5)


def test_optimize_gradient_memory_gives_same_params() -> None:
    results = []
    for optimize in (False, True):
        workspace.ResetWorkspace()
        model = _build(False, [0, 1], optimize_gradient_memory=optimize)
        RunInitNet(model)
        for d in (0, 1):       # identical starting params, whatever the init RNG did
            workspace.FeedBlob(f"cpu_{d}/fc_w", np.linspace(-1, 1, 16, dtype=F32)[None])
        workspace.RunNetOnce(model._global_model_init_net)
        RunNet(model, 3)
        names = ["cpu_0/fc_w", "cpu_1/fc_w", "cpu_0/fc_b", "cpu_0/fc_w_v", "cpu_0/fc_b_g"]
        results.append((model, {n: fetch(n) for n in names}))
    (plain, want), (optimized, got) = results
    for name in want:
        assert want[name].tobytes() == got[name].tobytes(), name
    shared = [b for op in optimized.net.Proto().op for b in op.output if "__m" in b]
    assert shared and not any("__m" in b for op in plain.net.Proto().op for b in op.output)


def test_data_parallel_model_facade() -> None:
    model = model_helper.ModelHelper(name="bmuf_facade")
    data_parallel_model.Parallelize_CPU_BMUF(model, lambda m: None, forward, manual_sgd,
                                             devices=[0, 1], block_momentum=0.25)
    _feed([0, 1], False, "cpu")
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 2)
    np.testing.assert_array_equal(fetch("cpu_1/fc_w"), fetch("cpu_0/fc_w_g"))
    scales = [op for op in model._global_model_param_updates_net.Proto().op
              if op.type == "Scale" and op.input[0].endswith("_v")]
    assert {a.f for op in scales for a in op.arg if a.name == "scale"} == {0.25}
