"""Gradient accumulation: ``Parallelize(..., accumulate_steps=k)``.

k RunNets of one micro-batch each equal one RunNet on the k-times-larger batch; no
collective (and no optimizer op) runs on the k - 1 runs between synchronisations.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from _dpm_updates import manual_sgd
from _parallel_helpers import (
    BATCH,
    _set_params,
    bn_forward,
    data,
    device_option,
    mlp_forward,
    optimizer_fun,
    sparse_forward,
)

from dpgraph import core, data_parallel_model, model_helper, workspace
from dpgraph.errors import ParallelizeError
from dpgraph.parallel.accumulate import CONDITION, COUNTER
from dpgraph.runtime.operator import OpInstance

COLLECTIVES = {"Allreduce", "NCCLAllreduce", "NCCLBroadcast", "Broadcast", "ReduceScatter",
               "Allgather", "Barrier"}


def build(devices: Sequence[int], k: int, gpu: bool = False, update: str = "sgd",
          forward: Any = mlp_forward, reset: bool = True, **kwargs: Any) -> Any:
    if reset:
        workspace.ResetWorkspace()
    if gpu:
        workspace.SetVirtualGpus(max(devices) + 1)
    model = model_helper.ModelHelper(name="accumulate")
    if update == "manual":  # per-device updates (param_update_builder_fun)
        kwargs["param_update_builder_fun"] = manual_sgd
    else:
        kwargs["optimizer_builder_fun"] = optimizer_fun(update)
    data_parallel_model.Parallelize(model, lambda m: None, forward, devices=list(devices),
                                    cpu_device=not gpu, accumulate_steps=k, **kwargs)
    return model


def feed_micro_batch(model: Any, devices: Sequence[int], gpu: bool, k: int, step: int,
                     seed: int) -> None:
    """Device i, micro-batch s of k: rows (i * k + s) * per ... of the large batch."""
    full = data(seed)
    per = BATCH // (len(devices) * k)
    for i, device in enumerate(devices):
        start = (i * k + step) * per
        with core.DeviceScope(device_option(gpu, device)):
            for name in ("data", "label"):
                workspace.FeedBlob(f"{model._device_prefix}_{device}/{name}",
                                   full[name][start:start + per])


def run(devices: Sequence[int], k: int, steps: int = 2, gpu: bool = False,
        update: str = "sgd", **kwargs: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``steps`` optimizer steps of ``k`` micro-batches each; the master's params."""
    model = build(devices, k, gpu, update, **kwargs)
    data_parallel_model.RunInitNet(model)
    _set_params(model, devices, gpu)
    for step in range(steps):
        for micro in range(k):
            feed_micro_batch(model, devices, gpu, k, micro, seed=step)
            data_parallel_model.RunNet(model, 1)
    prefix = f"{model._device_prefix}_{devices[0]}/"
    return model, {str(p)[len(prefix):]: workspace.FetchBlob(str(p))
                   for p in model.GetParams(prefix)}


def assert_close(ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
                 atol: float = 1e-6) -> None:
    assert sorted(ref) == sorted(got)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=atol, err_msg=name)


@pytest.mark.parametrize("devices,gpu,update", [
    ([0, 1], False, "sgd"), ([0, 1, 2], False, "momentum"), ([0, 1, 2, 3], True, "momentum"),
    ([0, 1], True, "manual"),
])
@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_batches_equal_one_large_batch(devices: list[int], gpu: bool, update: str,
                                               k: int) -> None:
    _, ref = run(devices, 1, gpu=gpu, update=update)
    _, got = run(devices, k, gpu=gpu, update=update)
    assert_close(ref, got)


def test_k1_keeps_caffe2s_graph() -> None:
    """accumulate_steps=1 adds nothing (tests/parallel/test_snapshots.py pins the bytes)."""
    model = build([0, 1], 1)
    types = {op.type for net in (model.net, model.param_init_net) for op in net.Proto().op}
    assert not types & {"If", "GradientAccumulationStep"}
    blobs = {b for op in model.param_init_net.Proto().op for b in op.output}
    assert not any(b.endswith("_accumulated") for b in blobs) and COUNTER not in blobs


def test_structure_sync_phase_in_an_if() -> None:
    model = build([0, 1], 4)
    ops = list(model.net.Proto().op)
    assert [op.type for op in ops[-2:]] == ["GradientAccumulationStep", "If"]
    step, branch = ops[-2:]
    assert list(step.output) == [COUNTER, CONDITION]
    assert [a.i for a in step.arg if a.name == "steps"] == [4]
    assert list(branch.input) == [CONDITION]
    sync = next(a.n for a in branch.arg if a.name == "then_net")
    sync_types = [op.type for op in sync.op]
    assert "WeightedSum" in sync_types and "LearningRate" in sync_types
    main_types = [op.type for op in ops]
    assert "WeightedSum" not in main_types and "LearningRate" not in main_types
    accumulate = [op for op in ops if op.type == "Sum"]
    assert accumulate and all(op.input[0] == op.output[0] and
                              op.output[0].endswith("_grad_accumulated") for op in accumulate)
    # the If waits for every accumulator (control inputs order it last in a DAG)
    assert {op.output[0] for op in accumulate} <= set(branch.control_input)


class OpLog:
    """Every op any net runs (subnets of If included), per RunNet."""

    def __init__(self) -> None:
        self.runs: list[list[tuple[str, tuple[str, ...]]]] = []

    def is_collective(self, op_type: str, blobs: Sequence[str]) -> bool:
        scopes = {b.split("/", 1)[0] for b in blobs if "/" in b}
        return op_type in COLLECTIVES or len(scopes) > 1


@pytest.fixture
def op_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpLog]:
    log = OpLog()
    original = OpInstance.run

    def counted(self: OpInstance, blobs: Any, placement: Any) -> None:
        if log.runs:
            log.runs[-1].append((self.type, (*self.inputs, *self.outputs)))
        original(self, blobs, placement)

    monkeypatch.setattr(OpInstance, "run", counted)
    yield log


@pytest.mark.parametrize("devices,gpu,extra", [
    ([0, 1], False, {}), ([0, 1, 2, 3], True, {"use_nccl": True}),
    ([0, 1], False, {"gradient_bucket_mb": 0.0001, "gradient_dtype": "float16"}),
])
def test_no_collective_on_non_sync_steps(op_log: OpLog, devices: list[int], gpu: bool,
                                         extra: dict[str, Any]) -> None:
    k = 3
    model = build(devices, k, gpu, **extra)
    data_parallel_model.RunInitNet(model)
    for step in range(2 * k):
        feed_micro_batch(model, devices, gpu, k, step % k, seed=0)
        op_log.runs.append([])
        data_parallel_model.RunNet(model, 1)
    collectives = [sum(op_log.is_collective(t, b) for t, b in run) for run in op_log.runs]
    updates = [sum(t == "WeightedSum" for t, _ in run) for run in op_log.runs]
    sync_runs = [k - 1, 2 * k - 1]
    assert [i for i, c in enumerate(collectives) if c] == sync_runs
    assert [i for i, u in enumerate(updates) if u] == sync_runs
    assert all(collectives[i] > 0 for i in sync_runs)
    # the learning-rate iteration counts optimizer steps, the counter micro-batches
    assert int(workspace.FetchBlob("optimizer_iteration")[0]) == 2
    assert int(workspace.FetchBlob(COUNTER)[0]) == 2 * k


def test_with_buckets_bitwise_equal_to_per_blob() -> None:
    _, ref = run([0, 1], 2)
    _, got = run([0, 1], 2, gradient_bucket_mb=0.0001)
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def test_accumulators_restart_from_zero_after_each_sync() -> None:
    model, _ = run([0, 1], 2, steps=1)
    for device in (0, 1):
        for grad in model._grad_names:
            acc = workspace.FetchBlob(f"cpu_{device}/{grad}_accumulated")
            assert not acc.any(), grad


@pytest.mark.parametrize("value", [0, -1, 2.0, "2", True])
def test_bad_steps_are_refused_and_model_unchanged(value: Any) -> None:
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="accumulate")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(ParallelizeError, match="accumulate_steps"):
        data_parallel_model.Parallelize(model, lambda m: None, mlp_forward, devices=[0, 1],
                                        cpu_device=True, optimizer_builder_fun=optimizer_fun("sgd"),
                                        accumulate_steps=value)
    assert model.net.Proto().SerializeToString() == before


@pytest.mark.parametrize("option,match", [
    ({"optimize_gradient_memory": True}, "optimize_gradient_memory"),
    ({"dynamic_memory_management": True}, "dynamic_memory_management"),
    ({"shared_model": True}, "shared_model"),
])
def test_unsupported_combinations_are_refused(option: dict[str, Any], match: str) -> None:
    workspace.ResetWorkspace()
    with pytest.raises(ParallelizeError, match=match):
        data_parallel_model.Parallelize(
            model_helper.ModelHelper(name="accumulate"), lambda m: None, mlp_forward,
            devices=[0, 1], cpu_device=True, optimizer_builder_fun=optimizer_fun("sgd"),
            accumulate_steps=2, **option)


def test_sparse_gradients_are_refused_and_model_restored() -> None:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="accumulate")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(ParallelizeError, match="sparse"):
        data_parallel_model.Parallelize(model, lambda m: None, sparse_forward, devices=[0, 1],
                                        optimizer_builder_fun=optimizer_fun("sgd"),
                                        accumulate_steps=2)
    assert model.net.Proto().SerializeToString() == before


def test_spatial_bn_statistics_are_broadcast_on_sync_calls_only() -> None:
    """Computed params (SpatialBN running statistics) follow the master at each sync."""
    k = 2
    model = build([0, 1], k, forward=bn_forward)
    full = data(0)
    data_parallel_model.RunInitNet(model)
    for micro in range(k):
        for i, device in enumerate([0, 1]):
            start = (i * k + micro) * 12
            for name in ("image", "label"):
                workspace.FeedBlob(f"cpu_{device}/{name}", full[name][start:start + 12])
        data_parallel_model.RunNet(model, 1)
        stats = [workspace.FetchBlob(f"cpu_{d}/bn_rm") for d in (0, 1)]
        assert np.array_equal(*stats) == (micro == k - 1)


def test_predictor_export_sees_the_forward_pass() -> None:
    model, _ = run([0, 1], 2, steps=1)
    predict, params = data_parallel_model.ExtractPredictorNet(model, ["data"], ["fc2"], None)
    types = [op.type for op in predict.Proto().op]
    assert types == ["FC", "Relu", "FC"]
    assert {str(p) for p in params} >= {"cpu_0/fc1_w", "cpu_0/fc2_w"}


def test_checkpoint_at_a_sync_boundary_resumes_exactly(tmp_path: Any) -> None:
    """Save after 2 optimizer steps (4 micro-batches), resume in a fresh workspace, take a
    third: equal to 3 uninterrupted steps; the checkpoint holds both counters."""
    from dpgraph import checkpoint

    k, path = 2, str(tmp_path / "ckpt")
    _, ref = run([0, 1], k, steps=3, update="momentum")
    model = build([0, 1], k, update="momentum")
    data_parallel_model.RunInitNet(model)
    _set_params(model, [0, 1], False)
    for step in range(2):
        for micro in range(k):
            feed_micro_batch(model, [0, 1], False, k, micro, seed=step)
            data_parallel_model.RunNet(model, 1)
    names = checkpoint.save_model_checkpoint(model, path)
    assert {"optimizer_iteration", COUNTER} <= set(names)
    model = build([0, 1], k, update="momentum")
    data_parallel_model.RunInitNet(model)
    checkpoint.load_model_checkpoint(model, path)
    assert int(workspace.FetchBlob("optimizer_iteration")[0]) == 2
    for micro in range(k):
        feed_micro_batch(model, [0, 1], False, k, micro, seed=2)
        data_parallel_model.RunNet(model, 1)
    got = {str(p)[len("cpu_0/"):]: workspace.FetchBlob(str(p)) for p in model.GetParams("cpu_0/")}
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    assert data_parallel_model.GetLearningRateBlobNames(model)
