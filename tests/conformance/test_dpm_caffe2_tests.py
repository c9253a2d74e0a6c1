"""data_parallel_model: Caffe2's own data_parallel_model_test cases, run through the
public modules exactly as Caffe2's tests call them (CPU devices and virtual GPUs)."""

from __future__ import annotations

from unittest.mock import Mock

import numpy as np
import pytest
from _workspace import clean_workspace  # noqa: F401  (autouse)

from dpgraph import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace


def _feed_device_shards(batch_size, devices, device_type, device_prefix):
    """Draw a random batch (label = round(column 0)) and feed one equal shard to each
    device's ``data`` and ``label`` blobs, as Caffe2's data_parallel_model tests do."""
    full_data = np.random.rand(batch_size, 16)
    full_labels = np.round(full_data[:, 0])
    batch_per_device = batch_size // len(devices)
    for (j, g) in enumerate(devices):
        st = j * batch_per_device
        en = st + batch_per_device
        data = full_data[st:en, :].astype(np.float32)
        labels = full_labels[st:en].astype(np.float32)
        with core.DeviceScope(core.DeviceOption(device_type, g)):
            workspace.FeedBlob(f"{device_prefix}_{g}/data", data)
            workspace.FeedBlob(f"{device_prefix}_{g}/label", labels)


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
    model = cnn.CNNModelHelper(order="NHWC", name=f"test{devices}")
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
        _feed_device_shards(batch_size, devices, model._device_type, model._device_prefix)
        if i == 0:
            workspace.RunNetOnce(model.param_init_net)
            workspace.CreateNet(model.net)
        workspace.FeedBlob(
            model._device_prefix + "_0/sync_num", np.array([i * 2]).astype(np.float32),
            device_option=core.DeviceOption(model._device_type, 0))
        workspace.RunNet(model.net.Proto().name)
        for j in model._devices:
            sync = workspace.FetchBlob(model._device_prefix + f"_{j}/sync_num")[0]
            assert abs(sync - i * 2) < 0.01
    return workspace.FetchBlob(f"{model._device_prefix}_0/fc_w")


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


# ------------------------------------------------------------------ ParallelizeBMUFTest

def _bmuf_model_build_fun(model, loss_scale):
    fc = model.FC("data", "fc", 16, 1, ("ConstantFill", {}), ("ConstantFill", {}))
    fc_fl = model.FlattenToVec(fc, "fc_fl")
    sigm = model.Sigmoid(fc_fl, "sigm")
    sq = model.SquaredL2Distance([sigm, "label"], "sq")
    loss = model.AveragedLoss(sq, "loss")
    loss = model.Scale(loss, scale=loss_scale)
    return [loss]


def _bmuf_param_update_fun(model):
    ITER = model.Iter("ITER")
    LR = model.net.LearningRate([ITER], "LR", base_lr=(-0.1), policy="fixed")
    ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.GetParams():
        grad = model.param_to_grad[param]
        model.WeightedSum([param, ONE, grad, LR], param)


def _bmuf_generate_data(devices, device_type, device_prefix):
    np.random.seed(26)
    batch_size = 64
    for _ in range(0, 10):
        _feed_device_shards(batch_size, devices, device_type, device_prefix)


@pytest.mark.parametrize("cpu_device", [True, False])
def test_parallelize_bmuf(cpu_device: bool) -> None:
    from dpgraph.proto import caffe2_pb2

    workspace.ResetWorkspace()
    model = cnn.CNNModelHelper(order="NHWC", name="test")
    devices = [0, 1]
    if not cpu_device:
        workspace.SetVirtualGpus(2)
        device_type, device_prefix = workspace.GpuDeviceType, "gpu"
    else:
        device_type, device_prefix = caffe2_pb2.CPU, "cpu"
    _bmuf_generate_data(devices, device_type, device_prefix)
    data_parallel_model.Parallelize_BMUF(
        model, lambda m: None, _bmuf_model_build_fun, _bmuf_param_update_fun,
        devices=devices, cpu_device=cpu_device)
    data_parallel_model.RunInitNet(model)

    assert list(model._device_grouped_blobs.keys()) == ["fc_w", "fc_b"]
    assert workspace.FetchBlob(f"{device_prefix}_0/fc_b_v") == 0
    np.testing.assert_equal(workspace.FetchBlob(f"{device_prefix}_0/fc_w_v"),
                            np.zeros(16).astype(np.float32).reshape(1, 16))

    data_parallel_model.RunNet(model, 1)
    v_b_ = workspace.FetchBlob(f"{device_prefix}_0/fc_b_v")
    v_w_ = workspace.FetchBlob(f"{device_prefix}_0/fc_w_v")
    workspace.RunNetOnce(model.net)

    b_0_ = workspace.FetchBlob(f"{device_prefix}_0/fc_b")
    w_0_ = workspace.FetchBlob(f"{device_prefix}_0/fc_w")
    b_1_ = workspace.FetchBlob(f"{device_prefix}_1/fc_b")
    w_1_ = workspace.FetchBlob(f"{device_prefix}_1/fc_w")
    b_g_ = workspace.FetchBlob(f"{device_prefix}_0/fc_b_g")
    w_g_ = workspace.FetchBlob(f"{device_prefix}_0/fc_w_g")
    workspace.RunNetOnce(model._global_model_param_updates_net)

    g_b = (b_0_ + b_1_) / 2 - b_g_
    g_w = (w_0_ + w_1_) / 2 - w_g_
    v_b = workspace.FetchBlob(f"{device_prefix}_0/fc_b_v")
    v_w = workspace.FetchBlob(f"{device_prefix}_0/fc_w_v")
    w_g = workspace.FetchBlob(f"{device_prefix}_0/fc_w_g")
    b_g = workspace.FetchBlob(f"{device_prefix}_0/fc_b_g")
    w_0 = workspace.FetchBlob(f"{device_prefix}_0/fc_w")
    b_0 = workspace.FetchBlob(f"{device_prefix}_0/fc_b")
    w_1 = workspace.FetchBlob(f"{device_prefix}_1/fc_w")
    b_1 = workspace.FetchBlob(f"{device_prefix}_1/fc_b")

    np.testing.assert_allclose(v_b, 0.5 * v_b_ + g_b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v_w, 0.5 * v_w_ + g_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_equal(w_g, w_0)
    np.testing.assert_equal(w_g, w_1)
    np.testing.assert_equal(b_g, b_0)
    np.testing.assert_equal(b_g, b_1)
    np.testing.assert_allclose(w_0, w_g_ + v_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b_0, b_g_ + v_b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------- SparseDataParallelModelTest

def run_sparse_model(V: int, gpu_devices: list[int], cpu_indices: bool):
    from dpgraph.proto import caffe2_pb2

    state: dict = {}

    def input_builder_fun(model):
        return None

    def model_build_fun(model, loss_scale):
        if cpu_indices:
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
                gathered_cpu = model.net.Gather([state["vecs"], "indices"], "gathered_cpu")
            gathered = model.CopyCPUToGPU(gathered_cpu, "gathered")
        else:
            gpu_vecs = model.param_init_net.CopyCPUToGPU(state["vecs"], "gpuvecs")
            model.params.append(gpu_vecs)
            gathered = model.net.Gather([gpu_vecs, "indices"], "gathered")
        flattened = model.Flatten(gathered, "flattened")
        fc = model.FC(flattened, "fc", 16 * 16, 1, ("ConstantFill", {}), ("ConstantFill", {}))
        fc_fl = model.FlattenToVec(fc, "fc_fl")
        sigm = model.Sigmoid(fc_fl, "sigm")
        sq = model.SquaredL2Distance([sigm, "label"], "sq")
        loss = model.AveragedLoss(sq, "loss")
        loss = model.Scale(loss, scale=loss_scale)
        return [loss]

    def param_update_fun(model):
        ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        LR = model.CopyCPUToGPU(state["LR"], "LR")
        for param in model.GetParams():
            param_grad = model.param_to_grad[param]
            if not isinstance(param_grad, core.GradientSlice):
                model.WeightedSum([param, ONE, param_grad, LR], param)
            else:
                param_momentum = model.param_init_net.ConstantFill(
                    [param], param + "_momentum", value=0.0)
                model.net.SparseMomentumSGDUpdate(
                    [param_grad.values, param_momentum, LR, param, param_grad.indices],
                    [param_grad.values, param_momentum, param], momentum=0.1, nesterov=0)

    workspace.ResetWorkspace()
    model = cnn.CNNModelHelper(order="NHWC", name=f"sparse_test{gpu_devices}")
    with core.NameScope("cpu"):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            state["ITER"] = model.Iter("ITER")
            state["LR"] = model.net.LearningRate([state["ITER"]], "LR", base_lr=(-0.1),
                                                 policy="fixed")
            state["vecs"] = model.param_init_net.UniformFill([], "vecs", shape=[V, 16])
            if cpu_indices:
                model.params.append(state["vecs"])
            state["ONE_CPU"] = model.param_init_net.ConstantFill([], "ONE_CPU", shape=[1],
                                                                 value=1.0)
    data_parallel_model.Parallelize_GPU(
        model, input_builder_fun=input_builder_fun, forward_pass_builder_fun=model_build_fun,
        param_update_builder_fun=param_update_fun, devices=gpu_devices)
    if cpu_indices:
        with core.NameScope("cpu"):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
                for param in model.GetParams():
                    param_grad = model.param_to_grad[param]
                    model.ScatterWeightedSum([param, state["ONE_CPU"], param_grad.indices,
                                              param_grad.values, state["LR"]], state["vecs"])
    else:
        with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 0)):
            model.CopyGPUToCPU("gpu_0/gpuvecs", state["vecs"])

    np.random.seed(2603)
    batch_size = 32
    for i in range(0, 3):
        full_indices = np.random.permutation(V)[:batch_size * 16].reshape(batch_size, 16)
        full_labels = full_indices[:, 0] % 2
        batch_per_device = batch_size // len(gpu_devices)
        for (j, g) in enumerate(gpu_devices):
            st = j * batch_per_device
            en = st + batch_per_device
            indices = full_indices[st:en, :].astype(np.int32)
            labels = full_labels[st:en].astype(np.float32)
            device_for_indices = core.DeviceOption(workspace.GpuDeviceType, g)
            if cpu_indices:
                device_for_indices = core.DeviceOption(caffe2_pb2.CPU)
            with core.DeviceScope(device_for_indices):
                workspace.FeedBlob(f"gpu_{g}/indices", indices)
            with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, g)):
                workspace.FeedBlob(f"gpu_{g}/label", labels)
        if i == 0:
            workspace.RunNetOnce(model.param_init_net)
            orig_vecs = np.random.rand(V, 16).astype(np.float32)
            workspace.FeedBlob(state["vecs"], orig_vecs)
            if not cpu_indices:
                for g in gpu_devices:
                    workspace.FeedBlob(
                        f"gpu_{g}/gpuvecs", orig_vecs,
                        device_option=core.DeviceOption(workspace.GpuDeviceType, g))
            workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Proto().name)
        if len(gpu_devices) == 2 and not cpu_indices:
            idx = list(workspace.FetchBlob("gpu_0/indices").flatten())
            assert len(idx) == len(set(idx)), "We cannot have duplicate indices"
    assert not np.allclose(workspace.FetchBlob(state["vecs"]), orig_vecs)
    return [workspace.FetchBlob(state["vecs"] if cpu_indices else "gpu_0/gpuvecs"),
            workspace.FetchBlob("gpu_0/fc_w")]


@pytest.mark.parametrize("cpu_indices", [True, False])
def test_equiv_sparse(cpu_indices: bool) -> None:
    workspace.SetVirtualGpus(4)
    V = 2000
    result_2 = run_sparse_model(V, [0, 1], cpu_indices)
    result_1 = run_sparse_model(V, [0], cpu_indices)
    assert np.allclose(result_1[0], result_2[0])
    assert np.allclose(result_1[1], result_2[1])
    result_4 = run_sparse_model(V, list(range(4)), cpu_indices)
    assert np.allclose(result_1[0], result_4[0])
    assert np.allclose(result_1[1], result_4[1])


# ------------------------------------------------ multi-device SpatialBN (combine_spatial_bn)

@pytest.mark.parametrize("seed,batch_size", [(0, 1), (7, 5), (123, 12)])
def test_multi_device_bn_op_level_cpu(seed: int, batch_size: int) -> None:
    devices = [0, 1]
    epsilon = 1e-3
    np.random.seed(seed)
    scale = np.random.rand(1).astype(np.float32)
    bias = np.random.rand(1).astype(np.float32)
    xs = [np.random.rand(batch_size, 1, 1, 1).astype(np.float32) for _ in devices]

    def add_input_ops(model):
        for device in devices:
            workspace.FeedBlob(f"cpu_{device}/data", xs[device])

    def add_model_ops(model, loss_scale):
        model.SpatialBN("data", "bn_out", 1, epsilon=epsilon, is_test=False)
        model.Sqr("bn_out", "bn_out_sq")
        loss = model.SumElements("bn_out_sq", "loss")
        return [model.Scale(loss, "loss_scaled", scale=loss_scale)]

    model = cnn.CNNModelHelper(order="NCHW", name="test")
    data_parallel_model.Parallelize(
        model, input_builder_fun=add_input_ops, forward_pass_builder_fun=add_model_ops,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1), devices=devices,
        cpu_device=True, shared_model=False, combine_spatial_bn=True)
    workspace.RunNetOnce(model.param_init_net)
    for device in devices:
        workspace.FeedBlob(f"cpu_{device}/bn_out_s", scale)
        workspace.FeedBlob(f"cpu_{device}/bn_out_b", bias)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)

    x = np.concatenate(xs)
    mean, var = np.mean(x, axis=0), np.var(x, axis=0)
    inv_std = 1.0 / np.sqrt(var + epsilon)
    x_hats = [(xi - mean) * inv_std for xi in xs]
    for device in devices:
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{device}/bn_out"),
                                   scale * x_hats[device] + bias, rtol=5e-3, atol=1e-5)
    dys = [workspace.FetchBlob(f"cpu_{d}/bn_out_grad") for d in devices]
    d_bias = sum(np.sum(dy) for dy in dys)
    d_gamma = sum(np.sum(dy * xh) for dy, xh in zip(dys, x_hats))
    n = x.shape[0]
    for device in devices:
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{device}/bn_out_b_grad"),
                                   [d_bias], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{device}/bn_out_s_grad"),
                                   [d_gamma], rtol=1e-3, atol=1e-4)
        expected_dx = scale * inv_std / n * (n * dys[device] - d_bias - x_hats[device] * d_gamma)
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{device}/data_grad"),
                                   expected_dx, rtol=1e-3, atol=1e-4)


def test_equiv_cpu_8_and_16_devices() -> None:
    result_1 = run_model([0], gpu=False)
    assert np.allclose(result_1, run_model(list(range(8)), gpu=False))
    assert np.allclose(result_1, run_model(list(range(16)), gpu=False))


def test_equiv_gpu_without_peer_access(monkeypatch: pytest.MonkeyPatch) -> None:
    workspace.SetVirtualGpus(16)
    monkeypatch.setattr(workspace, "GetGpuPeerAccessPattern",
                        lambda: np.eye(16, dtype=bool))
    result_1 = run_model([0], gpu=True)
    for devices in ([0, 1], list(range(4)), list(range(8)), list(range(16))):
        assert np.allclose(result_1, run_model(devices, gpu=True))


# ------------------------------------------------ SparseDataParallelModelTestWithSharedIndices

def run_shared_indices_model(V: int, gpu_devices: list[int]) -> None:
    from dpgraph.proto import caffe2_pb2

    state: dict = {}

    def model_build_fun(model, loss_scale):
        gpu_vecs_gathered = []
        gpu_vecs = []
        for num, vec in enumerate(state["vecs"]):
            gpu_vec = model.param_init_net.CopyCPUToGPU(vec, f"gpuvec_{num}")
            if num != 2:
                model.params.append(gpu_vec)
            gpu_vecs.append(gpu_vec)
        for num, gpu_vec in enumerate(gpu_vecs):
            gpu_vec_gathered = model.net.Gather([gpu_vec, "indices"],
                                                [f"gpu_vec_gathered_{num}"])
            gpu_vecs_gathered.append(gpu_vec_gathered)
        assert len(gpu_vecs_gathered) == 3
        fc = model.net.FC([gpu_vecs_gathered[2], gpu_vecs_gathered[0], gpu_vecs_gathered[1]],
                          ["fc"])
        _, loss = model.net.SoftmaxWithLoss([fc, "label"], ["ce_loss", "avg_loss"],
                                            only_loss=True)
        loss = model.Scale(loss, scale=loss_scale)
        model.net.Print(loss, [], limit=10)
        return [loss]

    def param_update_fun(model):
        ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        LR = model.CopyCPUToGPU(state["LR"], "LR")
        for param in model.GetParams():
            param_grad = model.param_to_grad[param]
            if not isinstance(param_grad, core.GradientSlice):
                model.WeightedSum([param, ONE, param_grad, LR], param)
            else:
                model.net.ScatterWeightedSum(
                    [param, ONE, param_grad.indices, param_grad.values, ONE], param)

    workspace.ResetWorkspace()
    model = cnn.CNNModelHelper(order="NHWC", name=f"sparse_test{gpu_devices}")
    batch_size = 32
    batch_per_device = batch_size // len(gpu_devices)
    with core.NameScope("cpu"):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
            state["ITER"] = model.Iter("ITER")
            state["LR"] = model.net.LearningRate([state["ITER"]], "LR", base_lr=(-0.1),
                                                 policy="fixed")
            state["vecs"] = [model.param_init_net.UniformFill([], f"vec_{num}",
                                                              shape=[V, 16])
                             for num in range(2)]
            state["vecs"].append(model.param_init_net.UniformFill(
                [], "vec_2", shape=[batch_per_device, 16]))
            model.param_init_net.ConstantFill([], "ONE_CPU", shape=[1], value=1.0)
    data_parallel_model.Parallelize_GPU(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=model_build_fun,
        param_update_builder_fun=param_update_fun, devices=gpu_devices)
    with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, 0)):
        for num, vec in enumerate(state["vecs"][:-1]):
            model.CopyGPUToCPU(f"gpu_0/gpuvec_{num}", vec)

    for i in range(0, 3):
        np.random.seed(2603)
        full_indices = np.random.permutation(V)[:batch_size].reshape(batch_size)
        full_labels = full_indices[:] % batch_per_device
        for (j, g) in enumerate(gpu_devices):
            st = j * batch_per_device
            en = st + batch_per_device
            with core.DeviceScope(core.DeviceOption(workspace.GpuDeviceType, g)):
                workspace.FeedBlob(f"gpu_{g}/indices",
                                   full_indices[st:en].astype(np.int32))
                workspace.FeedBlob(f"gpu_{g}/label",
                                   full_labels[st:en].astype(np.int32))
        if i == 0:
            workspace.RunNetOnce(model.param_init_net)
            orig_vecs = [np.random.rand(V, 16).astype(np.float32),
                         np.random.rand(V).astype(np.float32),
                         np.random.rand(V, 16).astype(np.float32)]
            for vec, orig_vec in zip(state["vecs"], orig_vecs):
                workspace.FeedBlob(vec, orig_vec)
            for g in gpu_devices:
                for num, orig_vec in enumerate(orig_vecs):
                    workspace.FeedBlob(f"gpu_{g}/gpuvec_{num}", orig_vec,
                                       device_option=core.DeviceOption(
                                           workspace.GpuDeviceType, g))
            workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Proto().name)
        idx = workspace.FetchBlob("gpu_0/indices")
        grad_slices = [workspace.FetchBlob(f"gpu_{g}/gpu_vec_gathered_{num}_grad")
                       for g in gpu_devices for num in range(2)]
        for grad_slice in grad_slices:
            assert len(idx) == len(grad_slice)


def test_sparse_shared_indices_gpu() -> None:
    workspace.SetVirtualGpus(4)
    V = 1000
    run_shared_indices_model(V, [0, 1])
    run_shared_indices_model(V, [0])
    run_shared_indices_model(V, list(range(4)))
