"""data_parallel_model graph facts (caffe2-behavior-facts.md §2, dpm-distributed-facts.md
single-host parts), checked through the public modules the way Caffe2's tests use them:
validation, model attributes, replication, gradient all-reduce, sync and net settings.
The module-level helpers are in test_dpm_graph_helpers.py."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
from _dpm_graph_builders import (
    GRADS,
    PARAMS,
    build_sgd,
    forward,
    input_fun,
    ops,
    parallelize,
    param_update,
)
from _workspace import clean_workspace  # noqa: F401  (autouse)

from dpgraph import (
    brew,
    core,
    data_parallel_model,
    model_helper,
    scope,
    workspace,
)
from dpgraph.proto import caffe2_pb2

# ---------------------------------------------------------------- validation (fact 1)

def test_gpu_device_scope_is_an_assertion() -> None:
    with pytest.raises(AssertionError, match="without device-scope"):
        with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 0)):
            data_parallel_model.Parallelize_GPU(None, None, None)


def test_cpu_device_scope_is_allowed() -> None:
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
        model = parallelize([0, 1])
    assert model._devices == [0, 1]


def test_update_builders_are_mutually_exclusive() -> None:
    with pytest.raises(AssertionError, match="Can only specify one of"):
        parallelize([0, 1], param_update_builder_fun=param_update,
                    optimizer_builder_fun=build_sgd)


def test_forward_must_return_list_of_blob_references() -> None:
    with pytest.raises(AssertionError, match="list of loss blobs"):
        parallelize([0, 1], forward_pass_builder_fun=lambda m, s: forward(m, s)[0])
    with pytest.raises(AssertionError, match="list of loss blobs"):
        parallelize([0, 1], forward_pass_builder_fun=lambda m, s: [str(forward(m, s)[0])])


def test_shared_model_only_on_cpu() -> None:
    with pytest.raises(AssertionError, match="Shared model only supported on CPU"):
        parallelize([0, 1], gpu=True, shared_model=True)


def test_duplicate_params_are_an_assertion() -> None:
    def twice(model, loss_scale):
        losses = forward(model, loss_scale)
        model.params.append(model.params[-1])
        return losses

    with pytest.raises(AssertionError, match="[Dd]uplicate"):
        parallelize([0, 1], forward_pass_builder_fun=twice)


def test_params_must_be_created_by_param_init_net() -> None:
    def no_init(model, loss_scale):
        losses = forward(model, loss_scale)
        w = model.params[0]
        keep = [op for op in model.param_init_net.Proto().op if str(w) not in op.output]
        del model.param_init_net.Proto().op[:]
        model.param_init_net.Proto().op.extend(keep)
        return losses

    with pytest.raises(AssertionError, match="Some params not instantiated in param init net"):
        parallelize([0], forward_pass_builder_fun=no_init)


def test_testing_model_with_init_params_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        model = parallelize([0, 1], param_update_builder_fun=None)
    assert "init_params" in caplog.text
    assert not model.param_to_grad


# ---------------------------------------------------------------- model attributes

@pytest.mark.parametrize("gpu", [False, True])
def test_model_attributes(gpu: bool) -> None:
    model = parallelize([1, 2], gpu=gpu)
    prefix = "gpu" if gpu else "cpu"
    assert model._device_prefix == prefix
    assert model._device_type == (workspace.GpuDeviceType if gpu else caffe2_pb2.CPU)
    assert list(model._devices) == [1, 2]
    grouped = model._device_grouped_blobs
    assert isinstance(grouped, OrderedDict)
    assert list(grouped)[:8] == PARAMS + GRADS
    for name in PARAMS + GRADS:
        assert grouped[name] == {d: f"{prefix}_{d}/{name}" for d in (1, 2)}
        assert all(isinstance(b, core.BlobReference) for b in grouped[name].values())
    assert {"ITER", "ONE"} <= set(grouped)
    assert [str(p) for p in model.GetParams(f"{prefix}_2/")] == [
        f"{prefix}_2/{p}" for p in PARAMS]
    assert model.param_to_grad[model.params[0]] == f"{prefix}_1/fc1_w_grad"
    # core.Net uniquifies names (like Caffe2): "dpm_conformance", "..._1", ...
    assert model.net.Proto().name.startswith("dpm_conformance")


def test_computed_params_are_grouped_and_broadcast() -> None:
    def bn_forward(model, loss_scale):
        bn = brew.spatial_bn(model, "data", "bn", 4, epsilon=1e-3, is_test=False)
        sq = model.net.SquaredL2Distance([model.net.Flatten(bn, "flat"), "label"], "sq")
        return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]

    model = parallelize([0, 1, 2], forward_pass_builder_fun=bn_forward)
    computed = [str(c) for c in model.GetComputedParams("cpu_0/")]
    assert computed == ["cpu_0/bn_rm", "cpu_0/bn_riv"]
    assert {"bn_rm", "bn_riv"} <= set(model._device_grouped_blobs)
    # broadcast from devices[0] with Copy, before the gradient all-reduce
    first_sum = next(i for i, op in enumerate(model.net.Proto().op) if op.type == "Sum")
    copies = [(op.input[0], op.output[0]) for op in model.net.Proto().op[:first_sum]
              if op.type == "Copy"]
    assert copies == [(f"cpu_0/{n}", f"cpu_{d}/{n}") for n in ("bn_rm", "bn_riv")
                      for d in (1, 2)]


# ---------------------------------------------------------------- replication

def test_builders_run_per_device_in_device_and_name_scope() -> None:
    seen: list[tuple[str, str, int, float | None]] = []

    def record(tag):
        def fun(model, loss_scale=None):
            device = scope.CurrentDeviceScope()
            seen.append((tag, scope.CurrentNameScope(), device.device_id, loss_scale))
            return forward(model, loss_scale) if tag == "fwd" else None
        return fun

    def opt(model):
        seen.append(("opt", scope.CurrentNameScope(), -1, None))
        assert scope.CurrentDeviceScope() is None
        return build_sgd(model)

    model = parallelize([2, 5, 7, 9], input_builder_fun=record("in"),
                        forward_pass_builder_fun=record("fwd"), optimizer_builder_fun=opt,
                        post_sync_builder_fun=record("post"))
    expected = []
    for d in (2, 5, 7, 9):
        expected += [("in", f"cpu_{d}/", d, None), ("fwd", f"cpu_{d}/", d, 0.25)]
    expected.append(("opt", "", -1, None))
    expected += [("post", f"cpu_{d}/", d, None) for d in (2, 5, 7, 9)]
    assert seen == expected
    fcs = [(list(op.input), op.device_option.device_id) for op in ops(model.net, "FC")]
    assert fcs[:8:2] == [([f"cpu_{d}/data", f"cpu_{d}/fc1_w", f"cpu_{d}/fc1_b"], d)
                         for d in (2, 5, 7, 9)]


def test_loss_gradient_constant_fill() -> None:
    model = parallelize([0, 1], gpu=True)
    fills = [op for op in model.net.Proto().op
             if op.type == "ConstantFill" and op.output[0].endswith("loss_scaled_grad")]
    assert [(list(op.input), list(op.output), op.device_option.device_id) for op in fills] == [
        (["gpu_0/loss_scaled"], ["gpu_0/loss_scaled_grad"], 0),
        (["gpu_1/loss_scaled"], ["gpu_1/loss_scaled_grad"], 1),
    ]
    for op in fills:
        assert op.device_option.device_type == workspace.GpuDeviceType
        assert [(a.name, a.f) for a in op.arg] == [("value", 1.0)]


def test_loss_scale_with_rendezvous_shards_formula() -> None:
    scales = []
    model = parallelize([0, 1, 2], forward_pass_builder_fun=lambda m, s: scales.append(s) or
                        forward(m, s))
    assert scales == [pytest.approx(1 / 3)] * 3
    loss_scales = [a.f for op in ops(model.net, "Scale") if op.output[0].endswith("/loss_scaled")
                   for a in op.arg if a.name == "scale"]
    assert loss_scales == [pytest.approx(1 / 3)] * 3


# ---------------------------------------------------------------- gradient all-reduce

def test_cpu_allreduce_sum_then_broadcast_reverse_order() -> None:
    model = parallelize([0, 1, 2])
    red = [op for op in model.net.Proto().op if op.type in ("Sum", "Copy")
           and op.output[0].endswith("_grad")]
    expected = []
    for g in reversed(GRADS):
        expected.append(("Sum", [f"cpu_{d}/{g}" for d in range(3)], [f"cpu_0/{g}"], ""))
        expected += [("Copy", [f"cpu_0/{g}"], [f"cpu_{d}/{g}"], "") for d in (1, 2)]
    assert [(op.type, list(op.input), list(op.output), op.name) for op in red] == expected
    for op in red:
        assert op.device_option.device_type == caffe2_pb2.CPU


def test_cpu_shared_model_skips_broadcast_and_prunes() -> None:
    model = parallelize([0, 1], shared_model=True)
    red = [op for op in model.net.Proto().op if op.output and op.output[0].endswith("_grad")
           and op.type in ("Sum", "Copy")]
    assert [op.type for op in red] == ["Sum"] * 4
    assert [str(p) for p in model.params] == [f"cpu_0/{p}" for p in PARAMS]
    # non-master params are not produced any more; their reads go to the master copy
    for net in (model.param_init_net, model.net):
        for op in net.Proto().op:
            assert not any(o in {f"cpu_1/{p}" for p in PARAMS} for o in op.output)
    fc_cpu1 = next(op for op in model.net.Proto().op
                   if op.type == "FC" and op.output[0] == "cpu_1/fc1")
    assert list(fc_cpu1.input)[1:] == ["cpu_0/fc1_w", "cpu_0/fc1_b"]


@pytest.mark.parametrize("ndev,groups", [
    (2, [(0, 1)]),
    (3, [(0, 1, 2)]),
    (4, [(0, 1), (2, 3), (0, 2)]),
    (8, [(0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (4, 6), (0, 4)]),
    (16, [(j, j + 1) for j in range(0, 16, 2)] + [(j, j + 2) for j in range(0, 16, 4)]
     + [(0, 4), (8, 12), (0, 8)]),
])
def test_gpu_sum_tree(ndev: int, groups) -> None:
    model = parallelize(list(range(ndev)), gpu=True)
    sums = [op for op in model.net.Proto().op if op.type == "Sum"]
    per_grad = len(sums) // 4
    assert per_grad == len(groups)
    g = GRADS[-1]
    first = sums[:per_grad]
    assert [tuple(int(b.split("/")[0][4:]) for b in op.input) for op in first] == groups
    for op, group in zip(first, groups):
        assert op.name == "dpm"
        assert list(op.output) == [f"gpu_{group[0]}/{g}"]
        assert op.device_option.device_id == group[0]
        assert op.device_option.device_type == workspace.GpuDeviceType


def test_gpu_broadcast_after_reduction() -> None:
    model = parallelize([0, 1, 2], gpu=True)
    net_ops = model.net.Proto().op
    g = GRADS[-1]
    start = next(i for i, op in enumerate(net_ops) if op.type == "Sum")
    tail = [(op.type, list(op.input), list(op.output), op.device_option.device_id)
            for op in net_ops[start:start + 3]]
    assert tail == [
        ("Sum", [f"gpu_{d}/{g}" for d in range(3)], [f"gpu_0/{g}"], 0),
        ("Copy", [f"gpu_0/{g}"], [f"gpu_1/{g}"], 1),
        ("Copy", [f"gpu_0/{g}"], [f"gpu_2/{g}"], 2),
    ]


def test_gpu_copy_when_peers_lack_access(monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = np.array([[True, False], [False, True]])
    monkeypatch.setattr(workspace, "GetGpuPeerAccessPattern", lambda: pattern)
    model = parallelize([0, 1], gpu=True)
    g = GRADS[-1]
    net_ops = [(op.type, list(op.input), list(op.output), op.device_option.device_id, op.name)
               for op in model.net.Proto().op]
    i = net_ops.index(("Copy", [f"gpu_1/{g}"], [f"gpu_0/{g}_gpu1_copy"], 0, ""))
    assert net_ops[i + 1] == ("Sum", [f"gpu_0/{g}", f"gpu_0/{g}_gpu1_copy"], [f"gpu_0/{g}"],
                              0, "dpm")


def test_nccl_allreduce() -> None:
    model = parallelize([0, 1], gpu=True, use_nccl=True)
    nccl = ops(model.net, "NCCLAllreduce")
    assert [list(op.input) for op in nccl] == [[f"gpu_{d}/{g}" for d in (0, 1)]
                                               for g in reversed(GRADS)]
    assert [list(op.output) for op in nccl] == [list(op.input) for op in nccl]
    # serialised: each NCCL op waits on the previous gradient's master blob
    assert list(nccl[0].control_input) == []
    assert [list(op.control_input) for op in nccl[1:]] == [
        [f"gpu_0/{g}"] for g in list(reversed(GRADS))[:-1]]


def sparse_forward(model: Any, loss_scale: float) -> list[Any]:
    emb = model.param_init_net.XavierFill([], "emb", shape=[10, 4])
    model.params.append(emb)
    rows = model.net.Gather([emb, "indices"], "rows")
    out = brew.fc(model, rows, "fc", 4, 2)
    sq = model.net.SquaredL2Distance([out, "label"], "sq")
    return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]


def test_cpu_gradient_slice_is_an_assertion() -> None:
    with pytest.raises(AssertionError, match="Synchronizing gradient slices not supported"):
        parallelize([0, 1], forward_pass_builder_fun=sparse_forward)


def test_gpu_gradient_slice_concat() -> None:
    model = parallelize([0, 1], gpu=True, forward_pass_builder_fun=sparse_forward)
    emb = next(p for p in model.params if str(p) == "gpu_0/emb")
    grad = model.param_to_grad[emb]
    assert isinstance(grad, core.GradientSlice)
    concat = ops(model.net, "Concat")
    name = data_parallel_model.stripBlobName(grad)
    assert [list(op.output) for op in concat] == [
        [f"gpu_0/{name}_index_concat", f"gpu_0/{name}_index_splitinfo"],
        [f"gpu_0/{name}_val_concat", f"gpu_0/{name}_val_splitinfo"],
    ]
    for op in concat:
        assert [(a.name, a.i) for a in op.arg] == [("axis", 0)]
        assert op.name == "note:data_parallel_model"
    net_ops = list(model.net.Proto().op)
    i = net_ops.index(concat[0])
    assert [(op.type, op.input[0], op.output[0]) for op in net_ops[i + 1:i + 3]] == [
        ("Copy", f"gpu_0/{name}_index_concat", str(model._device_grouped_blobs[name][d].indices))
        for d in (0, 1)]


# ---------------------------------------------------------------- sync and net settings

def test_initial_sync_copies_appended_to_param_init_net() -> None:
    model = parallelize([3, 1, 2])
    init_ops = model.param_init_net.Proto().op
    first = next(i for i, op in enumerate(init_ops) if op.type == "Copy")
    synced = init_ops[first:]
    names = sorted(PARAMS + ["ITER", "ONE"])
    assert sorted((op.input[0], op.output[0]) for op in synced) == sorted(
        (f"cpu_3/{n}", f"cpu_{d}/{n}") for n in names for d in (1, 2))
    for op in synced:
        assert op.type == "Copy" and op.device_option.device_type == caffe2_pb2.CPU


def test_blobs_to_sync_are_every_prefixed_param_init_output() -> None:
    def extra(model, loss_scale):
        model.param_init_net.UniformFill([], ["sync_num"], shape=[1])
        return forward(model, loss_scale)

    model = parallelize([0, 1], forward_pass_builder_fun=extra)
    model.param_init_net.ConstantFill([], "not_synced", shape=[1], value=3.0)
    copies = {op.output[0] for op in ops(model.param_init_net, "Copy")}
    assert "cpu_1/sync_num" in copies and "not_synced" not in copies
    assert model._device_grouped_blobs["sync_num"] == {0: "cpu_0/sync_num",
                                                       1: "cpu_1/sync_num"}


@pytest.mark.parametrize("net_type,threads,ndev", [("dag", 4, 2), ("simple", 2, 3)])
def test_net_proto_settings(net_type: str, threads: int, ndev: int) -> None:
    model = parallelize(list(range(ndev)), net_type=net_type, num_threads_per_device=threads)
    proto = model.net.Proto()
    assert proto.type == net_type
    assert proto.num_workers == ndev * threads
    assert [(a.name, a.i) for a in proto.arg if a.name == "first_iter_only_one_worker"] == [
        ("first_iter_only_one_worker", 1)]


def test_forward_only_model_returns_early() -> None:
    calls = []
    model = model_helper.ModelHelper(name="test_model", init_params=False)
    data_parallel_model.Parallelize(
        model, input_fun, forward, devices=[0, 1], cpu_device=True,
        net_transformer_fun=lambda *a: calls.append(a[1:]))
    assert calls == [(2, "cpu", caffe2_pb2.CPU)]
    assert not ops(model.net, "Sum", "Copy")
    assert not any(op.is_gradient_op for op in model.net.Proto().op)
    assert model.net.Proto().type == "dag" and model.net.Proto().num_workers == 8
    assert list(model._device_grouped_blobs) == PARAMS
