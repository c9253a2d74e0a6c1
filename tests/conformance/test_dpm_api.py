"""data_parallel_model / muji public API: names, signatures, defaults and constants
(caffe2-behavior-facts.md §2-§3, caffe2-api-facts.md §9 and §11)."""

from __future__ import annotations

import inspect

import pytest

from dpgraph import data_parallel_model, muji

EMPTY = inspect.Parameter.empty

PARALLELIZE = [
    ("model_helper_obj", EMPTY), ("input_builder_fun", EMPTY),
    ("forward_pass_builder_fun", EMPTY), ("param_update_builder_fun", None),
    ("optimizer_builder_fun", None), ("post_sync_builder_fun", None),
    ("pre_grad_net_transformer_fun", None), ("net_transformer_fun", None),
    ("devices", None), ("rendezvous", None), ("net_type", "dag"),
    ("broadcast_computed_params", True), ("optimize_gradient_memory", False),
    ("dynamic_memory_management", False), ("blobs_to_keep", None), ("use_nccl", False),
    ("max_concurrent_distributed_ops", 16), ("cpu_device", False), ("ideep", False),
    ("num_threads_per_device", 4), ("shared_model", False), ("combine_spatial_bn", False),
    ("barrier_net_timeout_sec", 300),
]

PARALLELIZE_BMUF = [
    ("model_helper_obj", EMPTY), ("input_builder_fun", EMPTY),
    ("forward_pass_builder_fun", EMPTY), ("param_update_builder_fun", EMPTY),
    ("block_learning_rate", 1.0), ("block_momentum", None), ("devices", None),
    ("rendezvous", None), ("net_type", "dag"), ("master_device", None), ("use_nccl", False),
    ("nesterov", False), ("optimize_gradient_memory", False), ("reset_momentum_sgd", False),
    ("warmup_iterations", None), ("max_concurrent_distributed_ops", 4),
    ("add_blobs_to_sync", None), ("num_threads_per_device", 4), ("cpu_device", False),
    ("barrier_net_timeout_sec", 300),
]


def _params(fun) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fun).parameters.values()]


def _names(fun) -> list[str]:
    return [name for name, _ in _params(fun)]


#: Keyword-only options dpgraph adds after Caffe2's parameters (gradient buckets).
DPGRAPH_EXTRAS = [("gradient_bucket_mb", None)]
#: Parallelize only: gradient accumulation and compressed gradients (after the shared extras)
PARALLELIZE_EXTRAS = DPGRAPH_EXTRAS + [
    ("accumulate_steps", 1), ("gradient_dtype", None), ("gradient_error_feedback", False),
    ("shard_optimizer_state", False)]


def test_parallelize_signature() -> None:
    """Caffe2's parameters, in order and with their defaults, then dpgraph's extras."""
    assert _params(data_parallel_model.Parallelize) == PARALLELIZE + PARALLELIZE_EXTRAS


def test_parallelize_bmuf_signature() -> None:
    # Caffe2 names the builders input_fn/forward_fn/param_update_fn in some versions;
    # positional use is what tests rely on, so only order, count and defaults are checked
    got = _params(data_parallel_model.Parallelize_BMUF)
    assert got[len(PARALLELIZE_BMUF):] == DPGRAPH_EXTRAS + [("shard_optimizer_state", False)]
    got = got[:len(PARALLELIZE_BMUF)]
    assert len(got) == len(PARALLELIZE_BMUF)
    assert [d for _, d in got] == [d for _, d in PARALLELIZE_BMUF]
    assert [n for n, _ in got][4:] == [n for n, _ in PARALLELIZE_BMUF][4:]


@pytest.mark.parametrize("name,expected", [
    ("AddBlobSync", [("model", EMPTY), ("blobs", EMPTY), ("net", None)]),
    ("GetLearningRateBlobNames", [("model", EMPTY)]),
    ("GetCheckpointParams", [("model", EMPTY)]),
    ("ConvertNetForDevice", [("net", EMPTY), ("device", None)]),
    ("RunInitNet", [("model", EMPTY)]),
    ("RunWarmup", [("model", EMPTY)]),
    ("RunNet", [("model", EMPTY), ("num_iterations", EMPTY)]),
    ("CreateNet", [("model", EMPTY), ("overwrite", False)]),
    ("Synchronize", [("model", EMPTY), ("timeout_sec", 300)]),
    ("FinalizeAfterCheckpoint", [("model", EMPTY), ("blobs", None), ("cpu_mode", False)]),
    ("ExtractPredictorNet", [("model", EMPTY), ("inputs", EMPTY), ("outputs", EMPTY),
                             ("device", EMPTY)]),
    ("AddDistributedBlobSync", [("model", EMPTY), ("blobs", EMPTY)]),
    ("OptimizeGradientMemory", [("model", EMPTY), ("input_shapes", EMPTY),
                                ("excluded_blobs", EMPTY), ("recycle_activations", EMPTY)]),
    ("stripBlobName", [("param", EMPTY)]),
])
def test_helper_signatures(name: str, expected) -> None:
    assert _params(getattr(data_parallel_model, name)) == expected


@pytest.mark.parametrize("name", [
    "Parallelize", "Parallelize_CPU", "Parallelize_GPU", "Parallelize_iDeep",
    "Parallelize_BMUF", "Parallelize_GPU_BMUF", "Parallelize_CPU_BMUF",
])
def test_parallelize_variants_are_callable(name: str) -> None:
    assert callable(getattr(data_parallel_model, name))


def test_collectives_concurrency_control_signature() -> None:
    cls = data_parallel_model.CollectivesConcurrencyControl
    assert _names(cls.__init__) == ["self", "name", "max_concurrent_context",
                                    "param_init_net", "rendezvous"]
    assert _names(cls.get_control_and_context) == ["self", "control_output_blob"]


def test_module_constants() -> None:
    assert data_parallel_model._DEFAULT_TIMEOUT_SEC == 30
    assert data_parallel_model._DEFAULT_BARRIER_NET_TIMEOUT_SEC == 300


def test_strip_blob_name() -> None:
    from dpgraph import core

    assert data_parallel_model.stripBlobName("gpu_0/fc_w") == "fc_w"
    assert data_parallel_model.stripBlobName(core.BlobReference("cpu_3/a/b")) == "a/b"
    assert data_parallel_model.stripBlobName("plain") == "plain"
    grad = core.GradientSlice("gpu_1/idx", "gpu_1/val")
    assert data_parallel_model.stripBlobName(grad) == "idx:val"


def test_muji_signatures() -> None:
    assert _params(muji.OnGPU) == [("gpu_id", EMPTY)]
    assert _params(muji.OnCPU) == []
    assert _params(muji.Allreduce) == [("net", EMPTY), ("blobs", EMPTY),
                                       ("reduced_affix", "_reduced"), ("gpu_indices", None)]
    for name in ("Allreduce2", "Allreduce4", "Allreduce4Group2", "Allreduce8",
                 "AllreduceFallback"):
        assert _names(getattr(muji, name)) == ["net", "blobs", "reduced_affix", "gpu_indices"]


def test_muji_device_options() -> None:
    from dpgraph import workspace
    from dpgraph.proto import caffe2_pb2

    gpu = muji.OnGPU(5)
    assert isinstance(gpu, caffe2_pb2.DeviceOption)
    assert gpu.device_type == workspace.GpuDeviceType and gpu.device_id == 5
    cpu = muji.OnCPU()
    assert cpu.device_type == caffe2_pb2.CPU and cpu.device_id == 0


def test_caffe2_alias_modules_are_the_same() -> None:
    """``caffe2.python.data_parallel_model``/``muji`` resolve to dpgraph's modules."""
    import importlib

    from dpgraph.compat import caffe2 as compat

    compat.install()
    try:
        assert importlib.import_module("caffe2.python.data_parallel_model") is \
            data_parallel_model
        assert importlib.import_module("caffe2.python.muji") is muji
    finally:
        compat.uninstall()
