"""data_parallel_model graph facts, continued (see test_dpm_graph.py): the module-level
helpers (checkpoint params, blob sync, learning rate names, net conversion, lifecycle,
predictor extraction), shared models, memory optimisation and module globals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _dpm_graph_builders import (
    PARAMS,
    build_sgd,
    feed,
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
    optimizer,
    scope,
    workspace,
)
from dpgraph.proto import caffe2_pb2

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
