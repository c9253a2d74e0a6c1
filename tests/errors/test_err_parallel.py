"""Parallelize and the data_parallel_model helpers misused: ParallelizeError (an
AssertionError, as Caffe2 asserted), RendezvousError, NotParallelizedError (also the
AttributeError Caffe2 raised); the model is exactly as before a failed call."""

from __future__ import annotations

from typing import Any

import pytest
from _error_checks import expect_error

from dpgraph import brew, core, data_parallel_model, model_helper
from dpgraph.errors import (
    ModelStateError,
    NotParallelizedError,
    ParallelizeError,
    RendezvousError,
)
from dpgraph.proto import caffe2_pb2


def forward(model: Any, loss_scale: float) -> list[Any]:
    fc = brew.fc(model, "data", "fc", dim_in=4, dim_out=2)
    softmax, loss = model.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"],
                                              scale=loss_scale)
    return [loss]


def param_update(model: Any) -> None:
    for param in model.GetParams():
        model.WeightedSum([param, "ONE", model.param_to_grad[param], "LR"], param)


def fingerprint(model: Any) -> dict[str, Any]:
    return {
        "net": model.net.Proto().SerializeToString(),
        "init": model.param_init_net.Proto().SerializeToString(),
        "params": [str(p) for p in model.params],
        "param_to_grad": dict(model.param_to_grad),
        "attrs": sorted(vars(model)),
        "gradient_ops_added": model.gradient_ops_added,
    }


def parallelize_failing(dpgraph_type: type, builtin: Any, *fragments: str,
                        **kwargs: Any) -> BaseException:
    model = model_helper.ModelHelper(name="err_dpm")
    brew.fc(model, "shared_in", "shared_fc", 2, 2)  # a non-data-parallel param already there
    before = fingerprint(model)
    kwargs.setdefault("cpu_device", True)
    kwargs.setdefault("param_update_builder_fun", param_update)
    error = expect_error(
        lambda: data_parallel_model.Parallelize(model, lambda m: None, forward, **kwargs),
        dpgraph_type, builtin, *fragments)
    assert fingerprint(model) == before
    return error


@pytest.mark.parametrize("devices, fragment", [
    ([-1, 0], "invalid: [-1]"),
    ([0.5, 1.5], "invalid: [0.5, 1.5]"),
    ([True], "invalid: [True]"),
    ("ab", "invalid: ['a', 'b']"),
    (2, "got 2"),
    ([None], "invalid: [None]"),
    ([0, 0], "duplicates: [0, 0]"),
    ([], "at least one device"),
])
def test_bad_devices(devices: Any, fragment: str) -> None:
    parallelize_failing(ParallelizeError, AssertionError, "devices" if devices else "device",
                        fragment, devices=devices)


@pytest.mark.parametrize("rendezvous, fragment", [
    ("abc", "got str"),
    ({"num_shards": 2}, "lacks ['kv_handler', 'shard_id']"),
    ({"kv_handler": None, "shard_id": 5, "num_shards": 2, "engine": "GLOO"},
     "shard_id must be an int in 0..1, got 5"),
    ({"kv_handler": None, "shard_id": 0, "num_shards": 0, "engine": "GLOO"},
     "num_shards must be an int >= 1, got 0"),
    ({"kv_handler": None, "shard_id": 0, "num_shards": 2, "engine": "GLOO"},
     "FileStoreHandlerCreate"),
    ({"kv_handler": "store", "shard_id": 0, "num_shards": "two", "engine": "GLOO"},
     "num_shards='two'"),
    ({"kv_handler": "store", "shard_id": None, "num_shards": 2, "engine": "GLOO"},
     "shard_id=None"),
])
def test_bad_rendezvous(rendezvous: Any, fragment: str) -> None:
    parallelize_failing(RendezvousError, RuntimeError, fragment, devices=[0],
                        rendezvous=rendezvous)


def test_validation_rules_before_anything_changes() -> None:
    parallelize_failing(ParallelizeError, AssertionError, "param_update_builder_fun",
                        devices=[0, 1], optimizer_builder_fun=lambda m: None)
    parallelize_failing(ParallelizeError, AssertionError, "Shared model", "cpu_device=True",
                        devices=[0, 1], cpu_device=False, shared_model=True)
    parallelize_failing(ParallelizeError, AssertionError, "combine_spatial_bn",
                        devices=[0, 1], param_update_builder_fun=None, combine_spatial_bn=True)
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        parallelize_failing(ParallelizeError, AssertionError, "device-scope", "gpu_1",
                            devices=[0, 1])


def test_losses_must_be_blob_references() -> None:
    def strings(model: Any, loss_scale: float) -> list[Any]:
        return [str(loss) for loss in forward(model, loss_scale)]

    model = model_helper.ModelHelper(name="err_losses")
    before = fingerprint(model)
    expect_error(lambda: data_parallel_model.Parallelize_CPU(
        model, lambda m: None, strings, param_update_builder_fun=param_update, devices=[0, 1]),
        ParallelizeError, AssertionError, "BlobReference")
    assert fingerprint(model) == before


@pytest.mark.parametrize("helper", ["RunNet", "RunInitNet", "CreateNet",
                                    "GetCheckpointParams"])
def test_helpers_before_parallelize(helper: str) -> None:
    model = model_helper.ModelHelper(name="err_not_parallel")
    call = getattr(data_parallel_model, helper)
    args = (model, 1) if helper == "RunNet" else (model,)
    before = fingerprint(model)
    error = expect_error(lambda: call(*args), NotParallelizedError, AttributeError, helper,
                         "'err_not_parallel'", "Parallelize(model, ...) first")
    assert isinstance(error, ParallelizeError) and isinstance(error, AssertionError)
    assert fingerprint(model) == before


def test_add_blob_sync_with_prefixed_names() -> None:
    model = model_helper.ModelHelper(name="err_sync")
    data_parallel_model.Parallelize_CPU(model, lambda m: None, forward,
                                        param_update_builder_fun=param_update, devices=[0, 1])
    before = fingerprint(model)
    expect_error(lambda: data_parallel_model.AddBlobSync(model, ["cpu_0/fc_w"]),
                 ParallelizeError, AssertionError, "unprefixed", "cpu_0/fc_w")
    assert fingerprint(model) == before


def test_parallelize_twice_on_one_model() -> None:
    model = model_helper.ModelHelper(name="err_twice")
    data_parallel_model.Parallelize_CPU(model, lambda m: None, forward,
                                        param_update_builder_fun=param_update, devices=[0, 1])
    before = fingerprint(model)
    expect_error(lambda: data_parallel_model.Parallelize_CPU(
        model, lambda m: None, forward, param_update_builder_fun=param_update, devices=[0, 1]),
        ModelStateError, (AssertionError, RuntimeError), "'err_twice'", "Parallelize",
        "new ModelHelper")
    assert fingerprint(model) == before
