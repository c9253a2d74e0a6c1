"""resnet50_trainer-like flow (tiny ResNet) on virtual GPUs."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace

IS_TEST = {"value": False}


def create_model(model, loss_scale):
    conv1 = brew.conv(model, "data", "conv1", dim_in=3, dim_out=8, kernel=3, pad=1,
                      no_bias=1)
    bn1 = brew.spatial_bn(model, conv1, "conv1_spatbn", 8, epsilon=1e-3, momentum=0.1,
                          is_test=IS_TEST["value"])
    relu1 = brew.relu(model, bn1, bn1)
    pool1 = brew.max_pool(model, relu1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool1, "conv2", dim_in=8, dim_out=8, kernel=3, pad=1)
    relu2 = brew.relu(model, conv2, conv2)
    sum_ = brew.sum(model, [relu2, pool1], "res_sum")
    pool2 = brew.average_pool(model, sum_, "final_avg", kernel=4, stride=1)
    fc = brew.fc(model, pool2, "last_out_L10", dim_in=8, dim_out=10)
    if IS_TEST["value"]:
        softmax = brew.softmax(model, fc, "softmax")
        brew.accuracy(model, [softmax, "label"], "accuracy")
        return []
    softmax, loss = model.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"])
    loss = model.Scale(loss, scale=loss_scale)
    brew.accuracy(model, [softmax, "label"], "accuracy")
    return [loss]


def add_post_sync_ops(model):
    """Add ops applied after initial parameter sync."""
    for param_info in model.GetOptimizationParamInfo(model.GetParams()):
        if param_info.blob_copy is not None:
            model.param_init_net.HalfToFloat(param_info.blob,
                                             param_info.blob_copy[core.DataType.FLOAT])


def build_test_model(num_gpus):
    test_arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": True}
    test_model = model_helper.ModelHelper(name="resnet_test", arg_scope=test_arg_scope,
                                          init_params=False)
    IS_TEST["value"] = True
    try:
        data_parallel_model.Parallelize(
            test_model, input_builder_fun=add_image_input, forward_pass_builder_fun=create_model,
            param_update_builder_fun=None, devices=list(range(num_gpus)))
    finally:
        IS_TEST["value"] = False
    workspace.RunNetOnce(test_model.param_init_net)
    workspace.CreateNet(test_model.net)
    return test_model


def add_image_input(model):
    pass


OPTS = {"multi_precision": True, "net_type": "dag", "use_nccl": False,
        "optimize_gradient_memory": False}


def add_optimizer(model):
    optimizer.add_weight_decay(model, 1e-4)
    build = (optimizer.build_multi_precision_sgd if OPTS["multi_precision"]
             else optimizer.build_sgd)
    opt = build(model, base_learning_rate=0.1, momentum=0.9, nesterov=1, policy="step",
                stepsize=100, gamma=0.1)
    return opt


def build(num_gpus, name):
    arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": True,
                 "ws_nbytes_limit": 64 * 1024 * 1024}
    model = model_helper.ModelHelper(name=name, arg_scope=arg_scope)
    data_parallel_model.Parallelize_GPU(
        model, input_builder_fun=add_image_input, forward_pass_builder_fun=create_model,
        optimizer_builder_fun=add_optimizer, post_sync_builder_fun=add_post_sync_ops,
        devices=list(range(num_gpus)),
        optimize_gradient_memory=OPTS["optimize_gradient_memory"],
        combine_spatial_bn=num_gpus > 1, net_type=OPTS["net_type"], use_nccl=OPTS["use_nccl"])
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    return model


def feed(data, label, num_gpus):
    per = data.shape[0] // num_gpus
    for g in range(num_gpus):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
            workspace.FeedBlob(f"gpu_{g}/data", data[g * per:(g + 1) * per])
            workspace.FeedBlob(f"gpu_{g}/label", label[g * per:(g + 1) * per])


RESULTS = {}


def train(num_gpus, steps=6, batch=8):
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(4)
    model = build(num_gpus, f"resnet_{num_gpus}")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(batch, 3, 8, 8)).astype(np.float32)
    label = rng.integers(0, 10, batch).astype(np.int32)
    # init params identical across runs: feed gpu_0 params from a fixed rng
    prng = np.random.default_rng(1)
    for p in model.GetParams("gpu_0/"):
        v = workspace.FetchBlob(p)
        new = (prng.normal(size=v.shape) * 0.1).astype(v.dtype)
        for g in range(num_gpus):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(str(p).replace("gpu_0/", f"gpu_{g}/"), new)
    losses = []
    for _ in range(steps):
        feed(data, label, num_gpus)
        workspace.RunNet(model.net.Proto().name)
        losses.append(sum(float(workspace.FetchBlob(f"gpu_{g}/loss")) for g in range(num_gpus)))
    lrs = data_parallel_model.GetLearningRateBlobNames(model)
    test_model = build_test_model(num_gpus)
    workspace.RunNet(test_model.net.Proto().name)
    prefix = f"{test_model._device_prefix}_{test_model._devices[0]}"
    test_acc = float(workspace.FetchBlob(prefix + "/accuracy"))
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
        workspace.FeedBlob("optimizer_iteration", np.array([200], dtype=np.int64))
    workspace.RunNet(model.net.Proto().name)
    lr_after = float(workspace.FetchBlob(lrs[0]))
    params = {str(p)[len("gpu_0/"):]: workspace.FetchBlob(p) for p in model.GetParams("gpu_0/")}
    rm = workspace.FetchBlob("gpu_0/conv1_spatbn_rm")
    RESULTS.update(test_acc=test_acc, lr_after=lr_after)
    return losses, params, lrs, model, rm


def checkpoint_roundtrip(model, num_gpus):
    """Save the checkpoint blobs, scramble every device, load gpu_0 back and finalize."""
    names = data_parallel_model.GetCheckpointParams(model)
    saved = {str(b): workspace.FetchBlob(str(b)) for b in names}
    for g in range(num_gpus):
        for p in model.GetParams(f"gpu_{g}/"):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(str(p), np.zeros_like(workspace.FetchBlob(str(p))))
    for name, value in saved.items():
        if name.startswith("gpu_"):
            gpu = int(name[4:name.index("/")])
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, gpu)):
                workspace.FeedBlob(name, value)
        else:
            workspace.FeedBlob(name, value)
    data_parallel_model.FinalizeAfterCheckpoint(model)
    worst = 0.0
    for g in range(num_gpus):
        for p in model.GetParams(f"gpu_{g}/"):
            ref = saved[str(p).replace(f"gpu_{g}/", "gpu_0/")]
            worst = max(worst, float(np.abs(workspace.FetchBlob(str(p)) - ref).max()))
    return sorted(str(b) for b in names), worst


def main():
    l1, p1, lrs1, _, rm1 = train(1)
    l4, p4, lrs4, model, rm4 = train(4)
    print("losses 1:", l1)
    print("losses 4:", l4)
    print("lrs", lrs4)
    for k in p1:
        print(k, np.abs(p1[k] - p4[k]).max())
    print("rm", np.abs(rm1 - rm4).max())
    names, worst = checkpoint_roundtrip(model, 4)
    print("ckpt", names, worst)
    return l1, l4, p1, p4, lrs4, names, worst


if __name__ == "__main__":
    main()
