"""resnet50_trainer's --dtype float16 path: pFP16Initializer params, FloatToHalf input,
HalfToFloat logits, build_multi_precision_sgd and the post-sync HalfToFloat ops."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace
from caffe2.python.modeling.initializers import pFP16Initializer


def create_model(model, loss_scale):
    data = model.net.FloatToHalf("data", "data_fp16")
    with brew.arg_scope([brew.conv, brew.fc], WeightInitializer=pFP16Initializer,
                        BiasInitializer=pFP16Initializer, enable_tensor_core=True,
                        float16_compute=True):
        conv = brew.conv(model, data, "conv1", 3, 4, 3, pad=1)
        relu = brew.relu(model, conv, conv)
        pool = brew.average_pool(model, relu, "pool", global_pooling=True)
        pred = brew.fc(model, pool, "pred", 4, 5)
    pred = model.net.HalfToFloat(pred, pred + "_fp32")
    softmax, loss = model.SoftmaxWithLoss([pred, "label"], ["softmax", "loss"])
    loss = model.Scale(loss, scale=loss_scale)
    brew.accuracy(model, [softmax, "label"], "accuracy", top_k=1)
    brew.accuracy(model, [softmax, "label"], "accuracy_top5", top_k=5)
    return [loss]


def add_optimizer(model):
    optimizer.add_weight_decay(model, 1e-4)
    return optimizer.build_multi_precision_sgd(model, base_learning_rate=0.5, momentum=0.9,
                                               nesterov=1, policy="fixed")


def add_post_sync_ops(model):
    for param_info in model.GetOptimizationParamInfo(model.GetParams()):
        if param_info.blob_copy is not None:
            model.param_init_net.HalfToFloat(param_info.blob,
                                             param_info.blob_copy[core.DataType.FLOAT])


def train(num_gpus, steps=8, batch=8):
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name=f"fp16_{num_gpus}",
                                     arg_scope={"order": "NCHW", "use_cudnn": True})
    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=create_model,
        optimizer_builder_fun=add_optimizer, post_sync_builder_fun=add_post_sync_ops,
        devices=list(range(num_gpus)))
    rng = np.random.default_rng(0)
    workspace.RunNetOnce(model.param_init_net)
    for name in ("conv1_w", "conv1_b", "pred_w", "pred_b"):
        shape = workspace.FetchBlob(f"gpu_0/{name}").shape
        fp32 = (rng.normal(size=shape) * 0.3).astype(np.float32)
        for g in range(num_gpus):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(f"gpu_{g}/{name}_fp32", fp32)
                workspace.FeedBlob(f"gpu_{g}/{name}", fp32.astype(np.float16))
    workspace.CreateNet(model.net)
    data = rng.normal(size=(batch, 3, 6, 6)).astype(np.float32)
    label = rng.integers(0, 5, batch).astype(np.int32)
    per = batch // num_gpus
    losses = []
    for _ in range(steps):
        for g in range(num_gpus):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(f"gpu_{g}/data", data[g * per:(g + 1) * per])
                workspace.FeedBlob(f"gpu_{g}/label", label[g * per:(g + 1) * per])
        workspace.RunNet(model.net.Proto().name)
        losses.append(float(np.mean([workspace.FetchBlob(f"gpu_{g}/loss")
                                     for g in range(num_gpus)])))
    return model, losses


def main():
    workspace.SetVirtualGpus(2)
    _, l1 = train(1)
    model, l2 = train(2)
    print("1 gpu", l1)
    print("2 gpus", l2)
    print(sorted(str(b) for b in data_parallel_model.GetCheckpointParams(model)))


if __name__ == "__main__":
    main()
