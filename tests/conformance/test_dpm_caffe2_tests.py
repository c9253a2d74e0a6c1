"""data_parallel_model: Caffe2's own data_parallel_model_test cases, run through the
public modules exactly as Caffe2's tests call them (CPU devices and virtual GPUs)."""

from __future__ import annotations

from collections.abc import Iterator
from unittest.mock import Mock

import numpy as np
import pytest

from dpgraph import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)
    yield
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)


def run_model(devices: list[int], gpu: bool) -> np.ndarray:
    """Caffe2's DataParallelModelTest.run_model (test_equiv)."""

    def input_builder_fun(model):
        return None

    def model_build_fun(model, loss_scale):
        fc = model.FC("data", "fc", 16, 1, ("ConstantFill", {}), ("ConstantFill", {}))
        fc_fl = model.FlattenToVec(fc, "fc_fl")
        sigm = model.Sigmoid(fc_fl, "sigm")
        sq = model.SquaredL2Distance([sigm, "label"], "sq")
        loss = model.AveragedLoss(sq, "loss")
        loss = model.Scale(loss, scale=loss_scale)
        # For testing explicit sync
        model.param_init_net.UniformFill([], ["sync_num"], shape=[1])
        return [loss]

    def add_optimizer(model):
        return optimizer.build_sgd(model, 0.1, policy="fixed", max_gradient_norm=5.0,
                                   allow_lr_injection=True)

    workspace.ResetWorkspace()
    model = cnn.CNNModelHelper(order="NHWC", name="test{}".format(devices))
    data_parallel_model.Parallelize(
        model, input_builder_fun=input_builder_fun, forward_pass_builder_fun=model_build_fun,
        optimizer_builder_fun=add_optimizer, devices=devices, cpu_device=not gpu,
        shared_model=not gpu, combine_spatial_bn=not gpu,
    )
    data_parallel_model.AddBlobSync(model, ["sync_num"])
    lr_names = data_parallel_model.GetLearningRateBlobNames(model)
    assert len(lr_names) > 0

    np.random.seed(2603)
    batch_size = 64
    for i in range(0, 4):
        full_data = np.random.rand(batch_size, 16)
        full_labels = np.round(full_data[:, 0])
        batch_per_device = batch_size // len(devices)
        for (j, g) in enumerate(devices):
            st = j * batch_per_device
            en = st + batch_per_device
            data = full_data[st:en, :].astype(np.float32)
            labels = full_labels[st:en].astype(np.float32)
            with core.DeviceScope(core.DeviceOption(model._device_type, g)):
                workspace.FeedBlob("{}_{}/data".format(model._device_prefix, g), data)
                workspace.FeedBlob("{}_{}/label".format(model._device_prefix, g), labels)
        if i == 0:
            workspace.RunNetOnce(model.param_init_net)
            workspace.CreateNet(model.net)
        workspace.FeedBlob(
            model._device_prefix + "_0/sync_num", np.array([i * 2]).astype(np.float32),
            device_option=core.DeviceOption(model._device_type, 0))
        workspace.RunNet(model.net.Proto().name)
        for j in model._devices:
            sync = workspace.FetchBlob(model._device_prefix + "_{}/sync_num".format(j))[0]
            assert abs(sync - i * 2) < 0.01
    return workspace.FetchBlob("{}_0/fc_w".format(model._device_prefix))


@pytest.mark.parametrize("gpu", [False, True])
def test_equiv(gpu: bool) -> None:
    if gpu:
        workspace.SetVirtualGpus(4)
    result_1 = run_model([0], gpu=gpu)
    result_2 = run_model([0, 1], gpu=gpu)
    assert np.allclose(result_1, result_2)
    result_4 = run_model(list(range(4)), gpu=gpu)
    assert np.allclose(result_1, result_4)


def _conv_model_ops(model, loss_scale, dim_out=100, label=True):
    model.NHWC2NCHW("data", "data_nchw")
    model.Conv("data_nchw", "conv1", 3, 64, weight_init=("MSRAFill", {}), kernel=7,
               stride=2, pad=3, no_bias=0)
    model.SpatialBN("conv1", "conv1_spatbn_relu", 64, epsilon=1e-3, is_test=False)
    model.Relu("conv1_spatbn_relu", "conv1_spatbn_relu")
    model.MaxPool("conv1_spatbn_relu", "pool1", kernel=3, stride=2)
    model.FC("pool1", "fc", dim_in=(64 * 56 * 56), dim_out=dim_out)


def test_checkpoint_params() -> None:
    def add_input_ops(model):
        pass

    def add_model_ops(model, loss_scale):
        _conv_model_ops(model, loss_scale)
        model.Sigmoid("fc", "fc_sigm")
        model.Softmax("fc_sigm", "softmax")
        model.LabelCrossEntropy(["softmax", "label"], "xent")
        loss = model.AveragedLoss("xent", "loss")
        # Add a duplicate param init to ensure it does not cause issues
        model.param_init_net.ConstantFill([], ["fc_w"], shape=((64 * 56 * 56), 1000))
        return [loss]

    def add_optimizer(model):
        optimizer.build_sgd(model, 0.1, policy="fixed", momentum=0.9)

    model = cnn.CNNModelHelper(order="NHWC", name="test")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=add_input_ops, forward_pass_builder_fun=add_model_ops,
        optimizer_builder_fun=add_optimizer, devices=[1, 2, 3],
    )
    checkpoint_params = data_parallel_model.GetCheckpointParams(model)
    assert model.GetParams("cpu_1/")
    for p in model.GetParams("cpu_1/"):
        assert p in checkpoint_params
        assert p + "_momentum" in checkpoint_params
    for p in model.GetParams("cpu_2/"):
        assert p not in checkpoint_params
    assert core.BlobReference("cpu_1/fc_w_momentum") in checkpoint_params
    assert model.GetComputedParams("cpu_1/")
    for c in model.GetComputedParams("cpu_1/"):
        assert c in checkpoint_params
    for c in model.GetComputedParams("cpu_2/"):
        assert c not in checkpoint_params
    assert core.BlobReference("cpu_1/data") not in checkpoint_params
    assert core.BlobReference("optimizer_iteration") in checkpoint_params


def test_net_conversion_and_append_net() -> None:
    other = model_helper.ModelHelper()
    fc1 = brew.fc(other, "data", "other_fc1", dim_in=3 * 32 * 32, dim_out=10)
    fc2 = brew.fc(other, fc1, "other_fc2", dim_in=10, dim_out=10)
    brew.fc(other, fc2, "other_fc3", dim_in=10, dim_out=10)

    def add_input_ops(model):
        model.net.UniformFill([], ["data"], shape=[4, 32, 32, 3])
        model.net.UniformFill([], ["label"], shape=[4])

    def add_model_ops(model, loss_scale):
        model.NHWC2NCHW("data", "data_nchw")
        model.Conv("data_nchw", "conv1", 3, 4, weight_init=("MSRAFill", {}), kernel=7,
                   stride=2, pad=3, no_bias=0)
        model.SpatialBN("conv1", "conv1_spatbn_relu", 4, epsilon=1e-3, is_test=False)
        model.Relu("conv1_spatbn_relu", "conv1_spatbn_relu")
        model.MaxPool("conv1_spatbn_relu", "pool1", kernel=3, stride=2)
        model.FC("pool1", "fc", dim_in=(4 * 7 * 7), dim_out=10)
        appendnet = data_parallel_model.ConvertNetForDevice(other.net)
        model.net.AppendNet(appendnet)
        model.param_init_net.AppendNet(
            data_parallel_model.ConvertNetForDevice(other.param_init_net))
        model.Sigmoid("fc", "fc_sigm")
        model.Softmax("fc_sigm", "softmax")
        loss = model.AveragedLoss("softmax", "loss")
        return [loss]

    def add_optimizer(model):
        optimizer.build_sgd(model, 0.1, policy="fixed", momentum=0.9)

    model = cnn.CNNModelHelper(order="NCHW", name="test")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=add_input_ops, forward_pass_builder_fun=add_model_ops,
        optimizer_builder_fun=add_optimizer, devices=range(4),
    )
    assert "cpu_3/other_fc3" in [o for op in model.net.Proto().op for o in op.output]
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    assert workspace.FetchBlob("cpu_2/other_fc3").shape == (4, 10)


def test_device_scope_check() -> None:
    with pytest.raises(AssertionError):
        with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 0)):
            data_parallel_model.Parallelize_GPU(None, None, None)


def test_net_transformer_function() -> None:
    devices = [1, 2, 3]

    def add_input_ops(model):
        model.param_init_net.UniformFill([], ["data"], shape=[32, 8])

    def add_optimizer(model):
        optimizer.build_sgd(model, 0.1)

    def add_model_ops(model, loss_scale):
        fc1 = brew.fc(model, "data", "fc1", dim_in=8, dim_out=8)
        return [fc1]

    kwargs = {"input_builder_fun": add_input_ops, "forward_pass_builder_fun": add_model_ops,
              "devices": devices}
    transform = Mock()
    kwargs["net_transformer_fun"] = transform
    model = model_helper.ModelHelper(name="r", init_params=False)
    data_parallel_model.Parallelize_CPU(model, **kwargs)
    assert transform.called
    assert transform.call_count == 1

    transform = Mock()
    kwargs["net_transformer_fun"] = transform
    kwargs["optimizer_builder_fun"] = add_optimizer
    model = model_helper.ModelHelper(name="r", init_params=True)
    data_parallel_model.Parallelize_CPU(model, **kwargs)
    assert transform.called
    assert transform.call_count == 1
    transform.assert_called_once_with(model, 3, "cpu", model._device_type)
