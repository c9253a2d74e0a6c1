"""N devices with 1/N of the batch each give the same parameters as 1 device with the
whole batch (loss scale 1/ndev + gradient sum)."""

from __future__ import annotations

import pytest
from _parallel_helpers import (
    assert_same_params,
    bn_forward,
    sparse_forward,
    train,
)

_REFS: dict[tuple[str, str], dict] = {}


def reference(update: str = "manual", forward=None) -> dict:
    key = (update, getattr(forward, "__name__", "mlp"))
    if key not in _REFS:
        kwargs = {"forward": forward} if forward is not None else {}
        _REFS[key] = train([0], update=update, **kwargs)[1]
    return _REFS[key]


def test_training_moves_params() -> None:
    _, initial = train([0], iters=0)
    trained = reference()
    assert all(abs(trained[n] - initial[n]).max() > 1e-3 for n in initial)


@pytest.mark.parametrize("ndev", [1, 2, 3, 4, 8, 16])
def test_cpu_devices(ndev: int) -> None:
    assert_same_params(reference(), train(range(ndev))[1])


def test_arbitrary_cpu_device_ids() -> None:
    model, got = train([3, 1, 7])
    assert model._devices == [3, 1, 7]
    assert_same_params(reference(), got)


@pytest.mark.parametrize("use_nccl", [False, True])
@pytest.mark.parametrize("ndev", [2, 4, 8, 16])
def test_virtual_gpus(ndev: int, use_nccl: bool) -> None:
    assert_same_params(reference(), train(range(ndev), gpu=True, use_nccl=use_nccl)[1])


@pytest.mark.parametrize("ndev", [2, 3, 4])
def test_shared_model(ndev: int) -> None:
    assert_same_params(reference(), train(range(ndev), shared_model=True)[1])


@pytest.mark.parametrize("update", ["sgd", "momentum", "clip"])
@pytest.mark.parametrize("setup", ["cpu3", "cpu4_shared", "gpu4", "gpu8_nccl"])
def test_optimizers(update: str, setup: str) -> None:
    kwargs = {
        "cpu3": dict(devices=range(3)),
        "cpu4_shared": dict(devices=range(4), shared_model=True),
        "gpu4": dict(devices=range(4), gpu=True),
        "gpu8_nccl": dict(devices=range(8), gpu=True, use_nccl=True),
    }[setup]
    devices = kwargs.pop("devices")
    assert_same_params(reference(update), train(devices, update=update, **kwargs)[1])


@pytest.mark.parametrize("use_nccl", [False, True])
@pytest.mark.parametrize("ndev", [2, 4])
def test_sparse_gather_model_on_gpus(ndev: int, use_nccl: bool) -> None:
    got = train(range(ndev), gpu=True, forward=sparse_forward, use_nccl=use_nccl)[1]
    assert_same_params(reference(forward=sparse_forward), got)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("ndev", [2, 4])
def test_combine_spatial_bn_params(ndev: int, gpu: bool) -> None:
    got = train(range(ndev), gpu=gpu, forward=bn_forward, combine_spatial_bn=True)[1]
    assert_same_params(reference(forward=bn_forward), got)


@pytest.mark.parametrize("flag", ["optimize_gradient_memory", "dynamic_memory_management"])
def test_memory_passes_keep_results(flag: str) -> None:
    assert_same_params(reference(), train(range(2), **{flag: True})[1])


def test_arbitrary_virtual_gpu_ids() -> None:
    model, got = train([5, 2, 7, 1], gpu=True)
    assert model._devices == [5, 2, 7, 1]
    sums = [op for op in model.net.Proto().op if op.type == "Sum" and op.name == "dpm"]
    assert [op.device_option.device_id for op in sums[:3]] == [5, 7, 5]
    assert_same_params(reference(), got)
