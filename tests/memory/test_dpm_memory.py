"""Memory passes inside data-parallel models: Parallelize(optimize_gradient_memory=True),
Parallelize(dynamic_memory_management=True) and OptimizeGradientMemory train bitwise like
the plain model, with fewer blobs and lower planned peak memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _dpm_updates import manual_sgd

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.memory import liveness
from dpgraph.memory.dpm import OptimizeGradientMemory
from dpgraph.proto import caffe2_pb2

BATCH, IN, HIDDEN, OUT = 6, 5, 7, 3


def forward(model: Any, loss_scale: float) -> list[Any]:
    x: Any = "data"
    dim = IN
    for k in range(4):
        x = brew.relu(model, brew.fc(model, x, f"fc{k}", dim, HIDDEN), f"relu{k}")
        dim = HIDDEN
    out = brew.fc(model, x, "out", HIDDEN, OUT)
    dist = model.net.SquaredL2Distance([out, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def update(model: Any) -> None:
    manual_sgd(model, base_lr=-0.05)


def count_blobs(proto: caffe2_pb2.NetDef) -> int:
    return len({b for op in proto.op for b in list(op.input) + list(op.output)})


def _train(gpu: bool, after: Any = None, iters: int = 4, **kwargs: Any
           ) -> tuple[Any, dict[str, np.ndarray]]:
    workspace.ResetWorkspace()
    if gpu:
        workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="mem")
    data_parallel_model.Parallelize(model, lambda m: None, forward,
                                    param_update_builder_fun=update, devices=[0, 1],
                                    cpu_device=not gpu, **kwargs)
    if after is not None:
        after(model)
    prefix = model._device_prefix
    for d in (0, 1):
        rs = np.random.RandomState(d)
        option = core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU, d)
        workspace.FeedBlob(f"{prefix}_{d}/data", rs.randn(BATCH, IN).astype(np.float32),
                           option)
        workspace.FeedBlob(f"{prefix}_{d}/label", rs.randn(BATCH, OUT).astype(np.float32),
                           option)
    workspace.RunNetOnce(model.param_init_net)
    for param in model.GetParams(f"{prefix}_0/"):
        value = workspace.FetchBlob(str(param))
        seeded = np.random.RandomState(len(str(param))).randn(*value.shape).astype(np.float32)
        for d in (0, 1):
            workspace.FeedBlob(str(param).replace(f"{prefix}_0/", f"{prefix}_{d}/"), seeded,
                               core.DeviceOption(caffe2_pb2.CUDA if gpu else caffe2_pb2.CPU,
                                                 d))
    data_parallel_model.CreateNet(model)
    data_parallel_model.RunNet(model, iters)
    state = {str(p): workspace.FetchBlob(str(p)) for p in model.params}
    state["loss"] = workspace.FetchBlob(f"{prefix}_0/loss")
    return model, state


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("gpu", [False, True])
def test_parallelize_optimize_gradient_memory(gpu: bool) -> None:
    plain, want = _train(gpu)
    model, got = _train(gpu, optimize_gradient_memory=True)
    _same(want, got)
    assert count_blobs(model.net.Proto()) < count_blobs(plain.net.Proto())
    shared = {b for op in model.net.Proto().op for b in op.output if "__m" in b}
    prefix = model._device_prefix
    assert any(b.startswith(f"{prefix}_0/__m") for b in shared)
    assert any(b.startswith(f"{prefix}_1/__m") for b in shared)
    for grad in model.param_to_grad.values():      # param grads are never shared
        assert any(str(grad) in op.output for op in model.net.Proto().op)


@pytest.mark.parametrize("gpu", [False, True])
def test_parallelize_dynamic_memory_management(gpu: bool) -> None:
    _, want = _train(gpu)
    model, got = _train(gpu, dynamic_memory_management=True, blobs_to_keep=["loss"])
    _same(want, got)
    frees = [op for op in model.net.Proto().op if op.type == "Free"]
    assert frees
    freed = {op.input[0] for op in frees}
    assert not any(b.endswith("/loss") for b in freed)
    assert not freed & {str(p) for p in model.params}


@pytest.mark.parametrize("recycle", [False, True])
def test_optimize_gradient_memory_function(recycle: bool) -> None:
    plain, want = _train(False)

    def optimize(model: Any) -> None:
        OptimizeGradientMemory(model, {"data": [BATCH, IN]}, ["loss"], recycle)

    model, got = _train(False, after=optimize)
    _same(want, got)
    assert count_blobs(model.net.Proto()) < count_blobs(plain.net.Proto())
    recycled = any(op.output[0].endswith("_shared") and op.type in ("FC", "Relu")
                   for op in model.net.Proto().op)
    assert recycled == recycle


def _peak(original: caffe2_pb2.NetDef, measured: caffe2_pb2.NetDef,
          sizes: dict[str, int]) -> int:
    writes = liveness.aligned_write_sizes(original, sizes, measured)
    return liveness.peak_bytes(list(measured.op), writes, lambda b: True)


def test_peak_bytes_sweep() -> None:
    net = core.Net("sweep")
    net.Relu("x", "a")          # a: 10
    net.Relu("a", "b")          # b: 20
    net.Relu("b", "c")          # c: 5
    sizes = {"a": 10, "b": 20, "c": 5}
    proto = net.Proto()
    assert _peak(proto, proto, sizes) == 35           # buffers persist across iterations
    renamed = caffe2_pb2.NetDef()
    renamed.CopyFrom(proto)
    renamed.op[2].output[0] = "a"                     # c reuses a's buffer
    assert _peak(proto, renamed, sizes) == 30
    freed = caffe2_pb2.NetDef()
    freed.CopyFrom(proto)
    ops = list(freed.op)
    del freed.op[:]
    free = [caffe2_pb2.OperatorDef(type="Free", input=[b], output=[b]) for b in "abc"]
    freed.op.extend([ops[0], ops[1], free[0], ops[2], free[1], free[2]])
    sizes["c"] = 30
    assert _peak(proto, proto, sizes) == 60
    assert _peak(proto, freed, sizes) == 50           # a is freed before c is written


def test_recycling_keeps_each_devices_head() -> None:
    """Predictions and losses of every device survive activation recycling."""

    def optimize(model: Any) -> None:
        OptimizeGradientMemory(model, {}, [], True)

    model, _ = _train(False, after=optimize, iters=1)
    outputs = {b for op in model.net.Proto().op for b in op.output}
    for d in (0, 1):
        for name in ("out", "dist", "loss", "loss_scaled"):
            assert f"cpu_{d}/{name}" in outputs, (d, name)
        assert f"cpu_{d}/fc0" not in outputs          # early activations were recycled
