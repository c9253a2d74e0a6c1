"""Gradient buckets (Parallelize(..., gradient_bucket_mb=...)): bucket contents and order, one
collective per bucket, views, and bitwise equality with Caffe2's per-blob graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _parallel_helpers import (
    bn_forward,
    build,
    mlp_forward,
    ops_of,
    sparse_forward,
    train,
)

from dpgraph import brew, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.errors import ParallelizeError, ShapeError
from dpgraph.parallel.buckets import Bucket, GradInfo, assign_buckets

MB = 1 << 20


def _infos(*sizes: tuple[str, int, str]) -> list[GradInfo]:
    return [GradInfo(name, nbytes, dtype, order) for order, (name, nbytes, dtype)
            in enumerate(sizes)]


def test_assign_buckets_greedy_in_production_order() -> None:
    grads = _infos(("a", 3, "float32"), ("b", 4, "float32"), ("c", 2, "float32"),
                   ("d", 9, "float32"), ("e", 1, "float32"))
    buckets = assign_buckets(grads, 7)
    assert [[g.name for g in b.grads] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [b.nbytes for b in buckets] == [7, 2, 9, 1]
    assert [b.name for b in buckets] == [f"grad_bucket_{i}" for i in range(4)]


def test_assign_buckets_one_dtype_per_bucket_and_ready_order() -> None:
    grads = _infos(("a", 4, "float32"), ("h", 2, "float16"), ("b", 4, "float32"),
                   ("c", 4, "float32"), ("k", 2, "float16"))
    buckets = assign_buckets(grads, 8)
    assert [(b.dtype, [g.name for g in b.grads]) for b in buckets] == [
        ("float32", ["a", "b"]), ("float32", ["c"]), ("float16", ["h", "k"])]
    assert [b.ready for b in buckets] == sorted(b.ready for b in buckets)


def test_assign_buckets_is_a_pure_function() -> None:
    grads = _infos(*[(f"g{i}", (i * 37) % 11 + 1, "float32") for i in range(40)])
    first = assign_buckets(grads, 20)
    again = assign_buckets(list(reversed(grads)), 20)
    assert first == again
    assert isinstance(first[0], Bucket)


def _grad_blobs(model: Any, device: int = 0) -> list[str]:
    prefix = f"{model._device_prefix}_{device}/"
    return [str(model.param_to_grad[p]) for p in model.GetParams(prefix)]


def test_structure_cpu_one_collective_per_bucket() -> None:
    model = build([0, 1, 2], gradient_bucket_mb=1)
    packs = ops_of(model.net, "GradientBucketPack")
    unpacks = ops_of(model.net, "GradientBucketUnpack")
    sums = [op for op in ops_of(model.net, "Sum") if op.output[0].endswith("grad_bucket_0")]
    assert len(packs) == len(unpacks) == 3  # one bucket, per device
    assert len(sums) == 1 and list(sums[0].input) == [
        f"cpu_{d}/grad_bucket_0" for d in range(3)]
    assert not [op for op in ops_of(model.net, "Sum") if op.output[0].endswith("_w_grad")]
    # production order: the backward pass writes fc2's gradients before fc1's
    assert [b.split("/")[1] for b in packs[0].input] == [
        "fc2_b_grad", "fc2_w_grad", "fc1_b_grad", "fc1_w_grad"]
    assert list(unpacks[0].output) == list(packs[0].input)
    assert model._gradient_buckets == [["fc2_b_grad", "fc2_w_grad", "fc1_b_grad",
                                        "fc1_w_grad"]]
    assert "grad_bucket_0" not in model._device_grouped_blobs


def test_small_buckets_follow_the_backward_pass() -> None:
    model = build([0, 1], gradient_bucket_mb=60 / MB)  # 60 bytes: fc2_w alone is 60
    assert model._gradient_buckets == [["fc2_b_grad"], ["fc2_w_grad"], ["fc1_b_grad"],
                                       ["fc1_w_grad"]]
    index = {op.output[0]: i for i, op in enumerate(model.net.Proto().op)}
    packs = [index[f"cpu_0/grad_bucket_{k}"] for k in range(4)]
    assert packs == sorted(packs)


def test_none_keeps_the_per_blob_graph() -> None:
    plain = build([0, 1])
    workspace.ResetWorkspace()
    explicit = build([0, 1], gradient_bucket_mb=None)
    assert list(plain.net.Proto().op) == list(explicit.net.Proto().op)
    assert list(plain.param_init_net.Proto().op) == list(explicit.param_init_net.Proto().op)
    assert not ops_of(explicit.net, "GradientBucketPack")


def test_virtual_gpus_nccl_one_allreduce_per_bucket() -> None:
    model = build([0, 1, 2, 3], gpu=True, use_nccl=True, gradient_bucket_mb=1)
    nccl = ops_of(model.net, "NCCLAllreduce")
    assert [list(op.input) for op in nccl] == [[f"gpu_{d}/grad_bucket_0" for d in range(4)]]


@pytest.mark.parametrize("devices", [[0, 1], [0, 1, 2, 3], [0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
def test_bitwise_equal_on_virtual_gpus(devices: list[int]) -> None:
    """Caffe2's pairwise Sum trees (4 and 8 devices) and flat sums, bucket by bucket."""
    _, ref = train(devices, gpu=True, update="momentum", iters=3)
    _, got = train(devices, gpu=True, update="momentum", iters=3, gradient_bucket_mb=1e-4)
    _assert_bitwise(ref, got)


@pytest.mark.parametrize("devices", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("update", ["sgd", "momentum", "adam"])
def test_bitwise_equal_on_cpu_devices(devices: int, update: str) -> None:
    _, ref = _train(list(range(devices)), update)
    _, got = _train(list(range(devices)), update, gradient_bucket_mb=1e-4)
    _assert_bitwise(ref, got)


def test_bitwise_with_sparse_gradients_and_nccl() -> None:
    """Sparse gradients keep their all-gather; the dense ones go into a bucket."""
    _, ref = train([0, 1], gpu=True, forward=sparse_forward, update="sgd", iters=3,
                   use_nccl=True)
    model, got = train([0, 1], gpu=True, forward=sparse_forward, update="sgd", iters=3,
                       use_nccl=True, gradient_bucket_mb=1)
    _assert_bitwise(ref, got)
    assert model._gradient_buckets == [["fc_b_grad", "fc_w_grad"]]
    assert ops_of(model.net, "Concat")  # the sparse all-gather is still there


def test_computed_params_and_spatial_bn() -> None:
    _, ref = train([0, 1, 2], forward=bn_forward, update="momentum", iters=3)
    _, got = train([0, 1, 2], forward=bn_forward, update="momentum", iters=3,
                   gradient_bucket_mb="auto")
    _assert_bitwise(ref, got)


def test_gradients_are_views_of_the_bucket() -> None:
    from dpgraph.runtime.api import current

    model, _ = train([0, 1], update="sgd", iters=1, gradient_bucket_mb=1)

    bucket = current().get_blob("cpu_1/grad_bucket_0")
    for grad in _grad_blobs(model, 1):
        assert np.shares_memory(current().get_blob(grad), bucket), grad


def test_unpack_copy_makes_separate_arrays() -> None:
    from dpgraph import core
    from dpgraph.runtime.api import current

    workspace.FeedBlob("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    workspace.FeedBlob("b", np.arange(2, dtype=np.float32))
    net = core.Net("buckets")
    net.GradientBucketPack(["a", "b"], ["bucket"])
    net.GradientBucketUnpack(["bucket", "a", "b"], ["a2", "b2"], copy=1)
    net.GradientBucketUnpack(["bucket", "a", "b"], ["a3", "b3"])
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("bucket").tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert workspace.FetchBlob("a2").shape == (2, 3)
    assert not np.shares_memory(current().get_blob("a2"), current().get_blob("bucket"))
    assert np.shares_memory(current().get_blob("a3"), current().get_blob("bucket"))


def test_pack_refuses_mixed_dtypes_and_unpack_wrong_sizes() -> None:
    from dpgraph import core

    workspace.FeedBlob("a", np.zeros(3, np.float32))
    workspace.FeedBlob("h", np.zeros(3, np.float16))
    net = core.Net("bad_pack")
    net.GradientBucketPack(["a", "h"], ["bucket"])
    with pytest.raises(ShapeError, match="one dtype"):
        workspace.RunNetOnce(net)
    workspace.FeedBlob("bucket", np.zeros(4, np.float32))
    net = core.Net("bad_unpack")
    net.GradientBucketUnpack(["bucket", "a"], ["a"])
    with pytest.raises(ShapeError, match="holds 4 values"):
        workspace.RunNetOnce(net)


@pytest.mark.parametrize("value", [0, -1.0, "big", True, [25]])
def test_bad_bucket_size_is_refused_and_model_unchanged(value: Any) -> None:
    model = model_helper.ModelHelper(name="bad_bucket")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(ParallelizeError, match="gradient_bucket_mb"):
        data_parallel_model.Parallelize(model, lambda m: None, mlp_forward,
                                        param_update_builder_fun=lambda m: None,
                                        devices=[0, 1], cpu_device=True,
                                        gradient_bucket_mb=value)
    assert model.net.Proto().SerializeToString() == before


def test_auto_uses_the_cost_model_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpgraph.parallel.plan.cost_model import AlphaBeta, CostModel

    # huge latency, fast memory: everything in one bucket
    path = tmp_path / "cost.json"
    CostModel({"local": AlphaBeta(1.0, 1e-12)}).save(path)
    monkeypatch.setenv("DPGRAPH_COST_MODEL", str(path))
    assert len(build([0, 1], gradient_bucket_mb="auto")._gradient_buckets) == 1
    # no latency: the smallest buckets (256 KB here holds every gradient of the MLP too)
    CostModel({"local": AlphaBeta(0.0, 1e-9)}).save(path)
    workspace.ResetWorkspace()
    assert len(build([0, 1], gradient_bucket_mb="auto")._gradient_buckets) == 1


def test_bmuf_with_buckets_matches_per_blob() -> None:
    def run(**extra: Any) -> dict[str, np.ndarray]:
        workspace.ResetWorkspace()
        model = model_helper.ModelHelper(name="bmuf_buckets")

        def update(m: Any) -> None:
            it = brew.iter(m, "ITER")
            lr = m.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
            one = m.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
            for param in m.GetParams():
                m.net.WeightedSum([param, one, m.param_to_grad[param], lr], param)

        data_parallel_model.Parallelize_BMUF(model, lambda m: None, mlp_forward, update,
                                             devices=[0, 1, 2], cpu_device=True, **extra)
        from _parallel_helpers import _set_params, feed_batch

        feed_batch(model, [0, 1, 2], False)
        global_init = model._global_model_init_net
        for net in model._data_parallel_model_init_nets:
            if net is not global_init:
                workspace.RunNetOnce(net)
        _set_params(model, [0, 1, 2], False)  # the same params in both runs
        workspace.RunNetOnce(global_init)
        data_parallel_model.CreateNet(model)
        for _ in range(2):
            data_parallel_model.RunNet(model, 2)
        packs = ops_of(model._global_model_param_updates_net, "GradientBucketPack")
        assert len(packs) == (3 if extra else 0)  # one bucket of params per device
        return {str(p): workspace.FetchBlob(str(p)) for p in model.GetParams("cpu_0/")}

    ref = run()
    got = run(gradient_bucket_mb=1)
    _assert_bitwise(ref, got)


# --- helpers ---------------------------------------------------------------------------------
def _train(devices: list[int], update: str, **extra: Any) -> tuple[Any, dict[str, np.ndarray]]:
    if update != "adam":
        return train(devices, update=update, iters=3, **extra)
    import _parallel_helpers as helpers

    original = helpers.optimizer_fun
    helpers.optimizer_fun = lambda kind: (lambda m: optimizer.build_adam(m, 0.01))
    try:
        return train(devices, update="adam", iters=3, **extra)
    finally:
        helpers.optimizer_fun = original


def _assert_bitwise(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    assert sorted(ref) == sorted(got)
    for name in ref:
        assert np.array_equal(ref[name], got[name]), name
