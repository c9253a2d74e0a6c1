"""data_parallel_model graph facts (caffe2-behavior-facts.md §2, dpm-distributed-facts.md
single-host parts), checked through the public modules the way Caffe2's tests use them."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dpgraph import (
    brew,
    core,
    data_parallel_model,
    model_helper,
    optimizer,
    scope,
    workspace,
)
from dpgraph.proto import caffe2_pb2

PARAMS = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]
GRADS = [p + "_grad" for p in PARAMS]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)
    yield
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)


def input_fun(model: Any) -> None:
    return None


def forward(model: Any, loss_scale: float) -> list[Any]:
    hidden = brew.fc(model, "data", "fc1", 4, 3)
    hidden = brew.relu(model, hidden, hidden)
    out = brew.fc(model, hidden, "fc2", 3, 2)
    sq = model.net.SquaredL2Distance([out, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def param_update(model: Any) -> None:
    """Caffe2's DPM test update: per-device Iter, LearningRate and WeightedSum."""
    it = brew.iter(model, "ITER")
    lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        if isinstance(grad, core.GradientSlice):
            model.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        else:
            model.WeightedSum([param, one, grad, lr], param)


def build_sgd(model: Any) -> Any:
    return optimizer.build_sgd(model, 0.1, policy="fixed")


def parallelize(devices: list[int], gpu: bool = False, **kwargs: Any) -> Any:
    if gpu:
        workspace.SetVirtualGpus(max(8, max(devices) + 1))
    model = model_helper.ModelHelper(name="dpm_conformance")
    kwargs.setdefault("input_builder_fun", input_fun)
    kwargs.setdefault("forward_pass_builder_fun", forward)
    if "optimizer_builder_fun" not in kwargs:
        kwargs.setdefault("param_update_builder_fun", param_update)
    data_parallel_model.Parallelize(model, devices=devices, cpu_device=not gpu, **kwargs)
    return model


def ops(net: Any, *types: str) -> list[Any]:
    return [op for op in net.Proto().op if not types or op.type in types]


def feed(model: Any, devices: list[int], batch: int = 8, seed: int = 0) -> None:
    rs = np.random.RandomState(seed)
    data = rs.rand(batch, 4).astype(np.float32)
    label = rs.rand(batch, 2).astype(np.float32)
    per = batch // len(devices)
    for i, d in enumerate(devices):
        with core.DeviceScope(core.DeviceOption(model._device_type, d)):
            workspace.FeedBlob(f"{model._device_prefix}_{d}/data", data[i * per:(i + 1) * per])
            workspace.FeedBlob(f"{model._device_prefix}_{d}/label",
                               label[i * per:(i + 1) * per])


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

    parallelize([2, 5, 7, 9], input_builder_fun=record("in"),
                forward_pass_builder_fun=record("fwd"), optimizer_builder_fun=opt,
                post_sync_builder_fun=record("post"))
    expected = []
    for d in (2, 5, 7, 9):
        expected += [("in", f"cpu_{d}/", d, None), ("fwd", f"cpu_{d}/", d, 0.25)]
    expected.append(("opt", "", -1, None))
    expected += [("post", f"cpu_{d}/", d, None) for d in (2, 5, 7, 9)]
    assert seen == expected


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
    parallelize([0, 1, 2], forward_pass_builder_fun=lambda m, s: scales.append(s) or
                forward(m, s))
    assert scales == [pytest.approx(1 / 3)] * 3


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


# ---------------------------------------------------------------- helpers

def test_checkpoint_params_contents() -> None:
    model = parallelize([1, 2], optimizer_builder_fun=lambda m: optimizer.build_sgd(
        m, 0.1, policy="fixed", momentum=0.9))
    params = data_parallel_model.GetCheckpointParams(model)
    assert isinstance(params, set)
    names = {str(p) for p in params}
    expected = {f"cpu_1/{p}" for p in PARAMS} | {f"cpu_1/{p}_momentum" for p in PARAMS}
    assert expected <= names
    assert "optimizer_iteration" in names
    assert not any(n.startswith("cpu_2/") for n in names)
    assert names - expected - {"optimizer_iteration"} <= {
        n for n in names if n.startswith("cpu_1/")}
    assert core.BlobReference("optimizer_iteration") in params
    for p in model.GetParams("cpu_1/"):
        assert p in params


def test_checkpoint_params_iter_without_prefix_only() -> None:
    model = parallelize([0, 1])  # per-device Iter: "cpu_0/ITER" is a synced blob
    names = {str(p) for p in data_parallel_model.GetCheckpointParams(model)}
    assert names == {f"cpu_0/{n}" for n in PARAMS + ["ITER", "ONE"]}


@pytest.mark.parametrize("gpu", [False, True])
def test_add_blob_sync(gpu: bool) -> None:
    model = parallelize([0, 1, 2], gpu=gpu)
    prefix = model._device_prefix
    before = len(model.net.Proto().op)
    data_parallel_model.AddBlobSync(model, ["sync_num"])
    new = model.net.Proto().op[before:]
    assert [(op.type, list(op.input), list(op.output)) for op in new] == [
        ("Copy", [f"{prefix}_0/sync_num"], [f"{prefix}_{d}/sync_num"]) for d in (1, 2)]
    assert model._device_grouped_blobs["sync_num"] == {
        d: f"{prefix}_{d}/sync_num" for d in range(3)}
    other = core.Net("other")
    data_parallel_model.AddBlobSync(model, ["other_blob"], net=other)
    assert len(other.Proto().op) == 2 and len(model.net.Proto().op) == before + 2
    with pytest.raises(AssertionError, match="Provide unprefixed blob name"):
        data_parallel_model.AddBlobSync(model, [f"{prefix}_0/sync_num"])
    data_parallel_model.AddBlobSync(model, [])
    assert len(model.net.Proto().op) == before + 2


def test_add_blob_sync_runs() -> None:
    model = parallelize([0, 1, 2])
    data_parallel_model.AddBlobSync(model, ["ONE"])
    feed(model, [0, 1, 2], batch=9)
    data_parallel_model.RunInitNet(model)
    workspace.FeedBlob("cpu_0/ONE", np.array([7.0], dtype=np.float32))
    data_parallel_model.RunNet(model, 1)
    for d in range(3):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/ONE"), [7.0])


def test_learning_rate_blob_names_with_optimizer_cpu() -> None:
    model = parallelize([0, 1], optimizer_builder_fun=build_sgd)
    names = data_parallel_model.GetLearningRateBlobNames(model)
    opt = model._optimizer
    assert names == [opt.get_cpu_blob_name("lr")]
    assert names[0] == f"SgdOptimizer_{opt._instance_num}_lr_cpu"
    lr_outputs = {op.output[0] for op in ops(model.net, "LearningRate")}
    assert set(names) == lr_outputs


def test_learning_rate_blob_names_with_optimizer_gpu() -> None:
    model = parallelize([0, 1, 3], gpu=True, optimizer_builder_fun=build_sgd)
    names = data_parallel_model.GetLearningRateBlobNames(model)
    k = model._optimizer._instance_num
    assert names == [f"SgdOptimizer_{k}_lr_gpu{d}" for d in (0, 1, 3)]
    assert set(names) == {op.output[0] for op in ops(model.net, "LearningRate")}


def test_learning_rate_blob_names_without_optimizer() -> None:
    model = parallelize([0, 1])
    assert data_parallel_model.GetLearningRateBlobNames(model) == ["cpu_0/LR", "cpu_1/LR"]


def test_convert_net_for_device() -> None:
    other = model_helper.ModelHelper(name="other")
    brew.fc(other, "data", "other_fc1", dim_in=3, dim_out=2)
    with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 2)):
        converted = data_parallel_model.ConvertNetForDevice(other.net)
    op = converted.Proto().op[0]
    assert list(op.input) == ["gpu_2/data", "gpu_2/other_fc1_w", "gpu_2/other_fc1_b"]
    assert list(op.output) == ["gpu_2/other_fc1"]
    assert op.device_option.device_type == workspace.GpuDeviceType
    assert op.device_option.device_id == 2
    assert "gpu_2/data" in converted.Proto().external_input
    assert other.net.Proto().op[0].input[0] == "data"  # the original is untouched
    init = data_parallel_model.ConvertNetForDevice(
        other.param_init_net, core.DeviceOption(caffe2_pb2.CPU, 1))
    assert [o for op in init.Proto().op for o in op.output] == [
        "cpu_1/other_fc1_w", "cpu_1/other_fc1_b"]


def test_param_init_net_ops_mutated_by_test() -> None:
    """Caffe2's recurrent DPM test turns every *Fill into ConstantFill after Parallelize."""
    model = parallelize([0, 1])
    for op in model.param_init_net.Proto().op:
        if op.type.endswith("Fill"):
            op.type = "ConstantFill"
    feed(model, [0, 1])
    data_parallel_model.RunInitNet(model)
    for d in (0, 1):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/fc1_w"),
                                      np.zeros((3, 4), np.float32))
    data_parallel_model.RunNet(model, 2)
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_0/fc2_w"),
                                  workspace.FetchBlob("cpu_1/fc2_w"))


def test_lifecycle_run_init_net_and_run_net() -> None:
    model = parallelize([0, 1])
    assert model._data_parallel_model_init_nets == [model.param_init_net]
    assert model._data_parallel_model_nets == [model.net]
    feed(model, [0, 1])
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 3)
    assert workspace.FetchBlob("cpu_0/ITER") == 3
    data_parallel_model.CreateNet(model, overwrite=True)


def test_finalize_after_checkpoint() -> None:
    model = parallelize([0, 1, 2])
    feed(model, [0, 1, 2], batch=9)
    data_parallel_model.RunInitNet(model)
    value = np.full((3, 4), 5.0, np.float32)
    workspace.FeedBlob("cpu_0/fc1_w", value)
    data_parallel_model.FinalizeAfterCheckpoint(model)
    for d in (1, 2):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/fc1_w"), value)
    assert model._checkpoint_net.Proto().name.startswith("checkpoint_sync_net")
    workspace.FeedBlob("cpu_0/fc1_w", value * 2)
    data_parallel_model.FinalizeAfterCheckpoint(model)  # cached net, run again
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_2/fc1_w"), value * 2)


def test_extract_predictor_net() -> None:
    model = parallelize([1, 2], param_update_builder_fun=None)
    net, export_blobs = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["fc2"], core.DeviceOption(caffe2_pb2.CPU, 0))
    proto = net.Proto()
    assert list(proto.external_input)[:1] == ["data"]
    assert list(proto.external_output) == ["fc2"]
    assert proto.op[0].input[0] == "data" and proto.op[-1].output[0] == "fc2"
    assert {str(b) for b in export_blobs} >= {f"cpu_1/{p}" for p in PARAMS}


def test_default_timeout_is_settable(monkeypatch: pytest.MonkeyPatch) -> None:
    rendezvous = {"kv_handler": "store", "shard_id": 0, "num_shards": 2, "engine": "GLOO"}
    net = core.Net("init")
    control = data_parallel_model.CollectivesConcurrencyControl("allreduce", 2, net,
                                                                rendezvous)
    monkeypatch.setattr(data_parallel_model, "_DEFAULT_TIMEOUT_SEC", 120)
    results = [control.get_control_and_context(f"out{k}") for k in range(5)]
    assert [str(cw) for cw, _ in results] == ["allreduce_0_cw", "allreduce_1_cw",
                                             "allreduce_0_cw", "allreduce_1_cw",
                                             "allreduce_0_cw"]
    assert [ci for _, ci in results] == [None, None, "out0", "out1", "out2"]
    created = net.Proto().op
    assert [op.type for op in created] == ["CreateCommonWorld", "CloneCommonWorld"]
    args = {a.name: a for a in created[0].arg}
    assert args["timeout_ms"].i == 120000
    assert args["size"].i == 2 and args["rank"].i == 0
    assert created[0].engine == "GLOO" and list(created[0].input) == ["store"]
    assert list(created[1].input) == ["allreduce_0_cw"]
    assert created[0].name == "allreduce_0_cw_op"


def test_shared_model_syncs_only_computed_params() -> None:
    def bn_forward(model, loss_scale):
        bn = brew.spatial_bn(model, "data", "bn", 4, epsilon=1e-3, is_test=False)
        sq = model.net.SquaredL2Distance([model.net.Flatten(bn, "flat"), "label"], "sq")
        return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]

    model = parallelize([0, 1], forward_pass_builder_fun=bn_forward, shared_model=True)
    copies = [(op.input[0], op.output[0]) for op in ops(model.param_init_net, "Copy")]
    assert sorted(copies) == [("cpu_0/bn_riv", "cpu_1/bn_riv"), ("cpu_0/bn_rm", "cpu_1/bn_rm")]


def test_rendezvous_single_shard_adds_workers_and_keeps_loss_scale() -> None:
    scales = []
    rendezvous = {"kv_handler": None, "shard_id": 0, "num_shards": 1, "engine": "GLOO"}
    model = parallelize([0, 1], rendezvous=rendezvous,
                        forward_pass_builder_fun=lambda m, s: scales.append(s) or forward(m, s))
    assert model.net.Proto().num_workers == 2 * 4 + 8
    assert scales == [0.5, 0.5]
    assert model._rendezvous == rendezvous


def test_synchronize_is_deprecated() -> None:
    model = parallelize([0, 1])
    with pytest.warns(DeprecationWarning):
        data_parallel_model.Synchronize(model)


def _train(devices: list[int], iters: int = 3, **kwargs: Any) -> np.ndarray:
    workspace.ResetWorkspace()
    model = parallelize(devices, optimizer_builder_fun=build_sgd, **kwargs)
    feed(model, devices, batch=8)
    data_parallel_model.RunInitNet(model)
    for name in PARAMS:  # the same start on every run
        shape = workspace.FetchBlob(f"cpu_{devices[0]}/{name}").shape
        value = (np.arange(np.prod(shape)).reshape(shape) % 5 * 0.1 - 0.2).astype(np.float32)
        for d in devices:
            workspace.FeedBlob(f"cpu_{d}/{name}", value)
    data_parallel_model.RunNet(model, iters)
    return workspace.FetchBlob(f"cpu_{devices[0]}/fc1_w")


def test_optimize_gradient_memory_keeps_results() -> None:
    reference = _train([0, 1])
    np.testing.assert_allclose(_train([0, 1], optimize_gradient_memory=True), reference,
                               rtol=1e-6)
    np.testing.assert_allclose(_train([0]), reference, rtol=1e-5, atol=1e-6)


def test_optimize_gradient_memory_function() -> None:
    model = parallelize([0, 1], optimizer_builder_fun=build_sgd)
    data_parallel_model.OptimizeGradientMemory(model, {}, set(), False)
    feed(model, [0, 1])
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 1)
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_0/fc1_w"),
                                  workspace.FetchBlob("cpu_1/fc1_w"))


def test_test_model_shares_trained_params() -> None:
    """Caffe2's pattern: a forward-only test model (init_params=False) built with the same
    builders reads the blobs the training model synchronised."""
    train_model = parallelize([0, 1])
    feed(train_model, [0, 1])
    data_parallel_model.RunInitNet(train_model)
    data_parallel_model.RunNet(train_model, 2)
    test_model = model_helper.ModelHelper(name="test_model", init_params=False)
    data_parallel_model.Parallelize(test_model, input_fun, forward, devices=[0, 1],
                                    cpu_device=True)
    workspace.CreateNet(test_model.net)
    workspace.RunNet(test_model.net.Proto().name)
    assert not test_model.param_init_net.Proto().op
    assert workspace.FetchBlob("cpu_1/loss_scaled").shape == ()


def test_cnn_model_helper_iter() -> None:
    from dpgraph import cnn

    model = cnn.CNNModelHelper(order="NHWC", name="iter_test")
    it = model.Iter("ITER")
    assert str(it) == "ITER"
    assert [op.type for op in model.net.Proto().op] == ["Iter"]
    assert list(model.net.Proto().op[0].input) == ["ITER"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("ITER") == 1


def test_nccl_broadcast_of_computed_params() -> None:
    def bn_forward(model, loss_scale):
        bn = brew.spatial_bn(model, "data", "bn", 4, epsilon=1e-3, is_test=False)
        sq = model.net.SquaredL2Distance([model.net.Flatten(bn, "flat"), "label"], "sq")
        return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]

    model = parallelize([0, 1], gpu=True, use_nccl=True, forward_pass_builder_fun=bn_forward)
    bcast = ops(model.net, "NCCLBroadcast")
    assert [list(op.input) for op in bcast] == [["gpu_0/bn_rm", "gpu_1/bn_rm"],
                                                ["gpu_0/bn_riv", "gpu_1/bn_riv"]]
    for op in bcast:
        assert list(op.output) == list(op.input)
        assert list(op.arg) == []
        assert op.device_option.device_id == 0
        assert op.device_option.device_type == workspace.GpuDeviceType


def test_parallelize_gpu_is_a_pass_through() -> None:
    workspace.SetVirtualGpus(2)
    model = model_helper.ModelHelper(name="gpu_pass")
    data_parallel_model.Parallelize_GPU(model, input_builder_fun=input_fun,
                                        forward_pass_builder_fun=forward,
                                        param_update_builder_fun=param_update, devices=[0, 1])
    assert model._device_prefix == "gpu"
    model = model_helper.ModelHelper(name="cpu_pass")
    data_parallel_model.Parallelize_CPU(model, input_fun, forward, param_update, devices=[0, 1])
    assert model._device_prefix == "cpu"


def test_combine_spatial_bn_cpu_structure() -> None:
    def bn_forward(model, loss_scale):
        bn = brew.spatial_bn(model, "data", "bn", 4, epsilon=1e-3, is_test=False)
        sq = model.net.SquaredL2Distance([model.net.Flatten(bn, "flat"), "label"], "sq")
        return [model.net.Scale(model.net.AveragedLoss(sq, "loss"), "ls", scale=loss_scale)]

    model = parallelize([0, 1], forward_pass_builder_fun=bn_forward,
                        optimizer_builder_fun=build_sgd, combine_spatial_bn=True)
    net_ops = list(model.net.Proto().op)
    i = next(k for k, op in enumerate(net_ops) if op.type == "ChannelStats")
    summary = [(op.type, list(op.input), list(op.output)) for op in net_ops[i:i + 6]]
    assert summary[:4] == [
        ("ChannelStats", ["cpu_0/data"], ["cpu_0/data_sums", "cpu_0/data_sumsq"]),
        ("ChannelStats", ["cpu_1/data"], ["cpu_1/data_sums", "cpu_1/data_sumsq"]),
        ("Sum", ["cpu_0/data_sums", "cpu_1/data_sums"], ["cpu_0/data_sums_combined"]),
        ("Sum", ["cpu_0/data_sumsq", "cpu_1/data_sumsq"], ["cpu_0/data_sumsq_combined"]),
    ]
    for op in net_ops[i:i + 4]:
        assert not op.HasField("device_option")
    for op, d in zip(net_ops[i + 4:i + 6], (0, 1)):
        assert op.type == "SpatialBN"
        assert list(op.input)[-2:] == ["cpu_0/data_sums_combined", "cpu_0/data_sumsq_combined"]
        assert list(op.input)[0] == f"cpu_{d}/data"
        assert [a.i for a in op.arg if a.name == "num_batches"] == [2]
    j = next(k for k, op in enumerate(net_ops) if op.type == "ChannelBackpropStats")
    back = [(op.type, list(op.input), list(op.output)) for op in net_ops[j:j + 10]]
    assert back[0] == ("ChannelBackpropStats",
                       ["cpu_0/data", "cpu_0/bn_sm", "cpu_0/bn_siv", "cpu_0/bn_grad"],
                       ["cpu_0/bn_s_grad", "cpu_0/bn_b_grad"])
    assert back[2:8] == [
        ("Sum", ["cpu_0/bn_s_grad", "cpu_1/bn_s_grad"], ["cpu_0/bn_s_grad_combined"]),
        ("Copy", ["cpu_0/bn_s_grad_combined"], ["cpu_0/bn_s_grad"]),
        ("Copy", ["cpu_0/bn_s_grad_combined"], ["cpu_1/bn_s_grad"]),
        ("Sum", ["cpu_0/bn_b_grad", "cpu_1/bn_b_grad"], ["cpu_0/bn_b_grad_combined"]),
        ("Copy", ["cpu_0/bn_b_grad_combined"], ["cpu_0/bn_b_grad"]),
        ("Copy", ["cpu_0/bn_b_grad_combined"], ["cpu_1/bn_b_grad"]),
    ]
    for op in net_ops[j + 8:j + 10]:
        assert op.type == "SpatialBNGradient"
        assert list(op.input)[-2:] == list(op.output)[1:3]
        assert [a.i for a in op.arg if a.name == "num_batches"] == [2]


def test_combine_spatial_bn_interleaves_forward_ops() -> None:
    model = parallelize([0, 1, 2], optimizer_builder_fun=build_sgd, combine_spatial_bn=True)
    fcs = [op.device_option.device_id for op in model.net.Proto().op if op.type == "FC"]
    assert fcs == [0, 1, 2, 0, 1, 2]


def test_ideep_graph() -> None:
    model = model_helper.ModelHelper(name="ideep")
    data_parallel_model.Parallelize_iDeep(model, input_fun, forward,
                                          optimizer_builder_fun=build_sgd, devices=[0, 1])
    assert model._device_prefix == "ideep"
    assert model._device_type == caffe2_pb2.IDEEP
    sums = ops(model.net, "Sum")
    assert sums and all(op.device_option.device_type == caffe2_pb2.IDEEP for op in sums)
    assert data_parallel_model.GetLearningRateBlobNames(model) == [
        model._optimizer.get_cpu_blob_name("lr")]
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.IDEEP, 1)):
        converted = data_parallel_model.ConvertNetForDevice(model_helper.ModelHelper().net)
    assert converted.Proto().op[:] == []
    net = core.Net("n")
    net.Relu("x", "y")
    converted = data_parallel_model.ConvertNetForDevice(net, core.DeviceOption(caffe2_pb2.IDEEP, 1))
    assert converted.Proto().op[0].input[0] == "ideep_1/x"


def test_params_created_before_parallelize_are_not_data_parallel() -> None:
    model = model_helper.ModelHelper(name="pre_params")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
        shared = model.create_param("shared_w", [1], _constant_init())
    data_parallel_model.Parallelize(model, input_fun, forward,
                                    param_update_builder_fun=param_update,
                                    devices=[0, 1], cpu_device=True)
    assert "shared_w" not in model._device_grouped_blobs
    assert str(shared) not in {str(k) for k in model._device_grouped_blobs}
    assert list(model._device_grouped_blobs)[:4] == PARAMS


def _constant_init() -> Any:
    from dpgraph.modeling.initializers import Initializer

    return Initializer("ConstantFill", value=0.5)


def test_iter_blobs_are_cpu_in_blob_device_map() -> None:
    model = parallelize([0, 1], gpu=True)
    assert model._blob_to_device["gpu_1/ITER"].device_type == caffe2_pb2.CPU
    assert model._blob_to_device["gpu_1/fc1_w"].device_type == workspace.GpuDeviceType
    assert model._blob_to_device["gpu_1/fc1_w"].device_id == 1


def test_cross_device_op_is_refused() -> None:
    def cheat(model, loss_scale):
        losses = forward(model, loss_scale)
        if scope.CurrentNameScope() == "gpu_1/":
            model.net.Relu(core.BlobReference("gpu_0/fc1"), "peek")
        return losses

    with pytest.raises(Exception, match="should have namescope gpu_1/"):
        parallelize([0, 1], gpu=True, forward_pass_builder_fun=cheat)


def test_run_net_runs_pairs_their_own_count() -> None:
    model = parallelize([0, 1])
    counter = core.Net("counter_net")
    counter.ConstantFill([], "pair_count", shape=[1], value=0.0)
    counter_once = core.Net("inc_net")
    counter_once.Add(["pair_count", "pair_one"], "pair_count")
    model._data_parallel_model_nets.append((counter_once, 2))
    feed(model, [0, 1])
    workspace.FeedBlob("pair_one", np.array([1.0], np.float32))
    workspace.RunNetOnce(counter)
    data_parallel_model.RunInitNet(model)
    data_parallel_model.RunNet(model, 3)
    assert workspace.FetchBlob("cpu_0/ITER") == 3
    np.testing.assert_array_equal(workspace.FetchBlob("pair_count"), [2.0])


def test_gpu_initial_sync_device_options() -> None:
    model = parallelize([0, 1, 2], gpu=True)
    copies = {op.output[0]: op.device_option for op in ops(model.param_init_net, "Copy")}
    # brew.iter creates ITER on the CPU: its sync copy runs on the CPU
    assert copies["gpu_2/ITER"].device_type == caffe2_pb2.CPU
    assert copies["gpu_2/fc1_w"].device_type == workspace.GpuDeviceType
    assert copies["gpu_2/fc1_w"].device_id == 2


def test_module_globals_like_caffe2() -> None:
    from unittest import mock

    for name, module in (("workspace", workspace), ("core", core), ("scope", scope),
                         ("model_helper", model_helper)):
        assert getattr(data_parallel_model, name) is module
    assert data_parallel_model.caffe2_pb2 is caffe2_pb2
    with mock.patch("dpgraph.data_parallel_model.workspace.GetGpuPeerAccessPattern",
                    return_value=np.eye(2, dtype=bool)):
        model = parallelize([0, 1], gpu=True)
    assert any(op.output[0].endswith("_gpu1_copy") for op in ops(model.net, "Copy"))
