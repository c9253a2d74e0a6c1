"""ParallelConfig: legacy kwargs -> one frozen, typed config; Parallelize variants."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from _parallel_helpers import build, manual_sgd, mlp_forward

from dpgraph import data_parallel_model, model_helper
from dpgraph.collectives.rendezvous import Rendezvous
from dpgraph.parallel.config import make_config
from dpgraph.proto import caffe2_pb2


def test_config_is_frozen_and_typed() -> None:
    config = make_config(devices=range(3), input_builder_fun=print,
                         forward_pass_builder_fun=print, cpu_device=True,
                         rendezvous={"kv_handler": "h", "shard_id": 0, "num_shards": 1})
    assert config.devices == (0, 1, 2) and config.device_prefix == "cpu"
    assert config.loss_scale == pytest.approx(1 / 3)
    assert isinstance(config.rendezvous, Rendezvous)
    assert config.num_workers == 3 * 4 + 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.net_type = "simple"  # type: ignore[misc]


def test_typed_rendezvous_is_accepted_and_published_as_dict() -> None:
    model = model_helper.ModelHelper(name="typed_rdv")
    data_parallel_model.Parallelize_CPU(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=manual_sgd, devices=[0, 1],
                                        rendezvous=Rendezvous(store=None, shard_id=0,
                                                              num_shards=1))
    assert model._rendezvous["num_shards"] == 1


@pytest.mark.parametrize("bad", [[], [0, 0], ["a"]])
def test_bad_devices(bad) -> None:
    with pytest.raises(AssertionError, match="device"):
        make_config(devices=bad, input_builder_fun=print, forward_pass_builder_fun=print,
                    cpu_device=True)


def test_ideep_variant() -> None:
    model = model_helper.ModelHelper(name="ideep")
    data_parallel_model.Parallelize_iDeep(model, lambda m: None, mlp_forward,
                                          param_update_builder_fun=manual_sgd, devices=[0, 1])
    assert (model._device_prefix, model._device_type) == ("ideep", caffe2_pb2.IDEEP)
    sums = [op for op in model.net.Proto().op if op.type == "Sum"]
    assert sums and all(op.device_option.device_type == caffe2_pb2.IDEEP for op in sums)


def test_gpu_variant_and_garbage_collector_restored() -> None:
    assert gc.isenabled()
    model = build(range(2), gpu=True)
    assert (model._device_prefix, model._device_type) == ("gpu", caffe2_pb2.CUDA)
    assert gc.isenabled()
    gc.disable()
    try:
        build(range(2))
        assert not gc.isenabled()
    finally:
        gc.enable()
