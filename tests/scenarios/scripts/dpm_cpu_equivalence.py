"""data_parallel_model_test-like CPU script: N devices vs 1 device with the whole batch."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace


def run_model(devices, batch_size=16, steps=8):
    workspace.ResetWorkspace()

    def input_builder_fun(model):
        return None

    def model_build_fun(model, loss_scale):
        fc = model.FC("data", "fc", 16, 1, ("ConstantFill", {}), ("ConstantFill", {}))
        model.param_init_net.UniformFill([], ["sync_num"], shape=[1])
        fc_fl = model.FlattenToVec(fc, "fc_fl")
        sigm = model.Sigmoid(fc_fl, "sigm")
        sq = model.SquaredL2Distance([sigm, "label"], "sq")
        loss = model.AveragedLoss(sq, "loss")
        loss = model.Scale(loss, scale=loss_scale)
        return [loss]

    def param_update_fun(model):
        ITER = model.Iter("ITER")
        LR = model.net.LearningRate([ITER], "LR", base_lr=(-0.1), policy="fixed")
        ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in model.GetParams():
            grad = model.param_to_grad[param]
            model.WeightedSum([param, ONE, grad, LR], param)

    model = cnn.CNNModelHelper(order="NHWC", name=f"test{devices}")
    data_parallel_model.Parallelize_CPU(
        model, input_builder_fun=input_builder_fun, forward_pass_builder_fun=model_build_fun,
        param_update_builder_fun=param_update_fun, devices=devices)
    np.random.seed(2603)
    full_data = np.random.rand(batch_size * steps, 16).astype(np.float32)
    full_labels = np.round(full_data[:, 0]).astype(np.float32)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    per = batch_size // len(devices)
    for i in range(steps):
        data = full_data[i * batch_size:(i + 1) * batch_size]
        labels = full_labels[i * batch_size:(i + 1) * batch_size]
        for j, d in enumerate(devices):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, d)):
                workspace.FeedBlob(f"cpu_{d}/data", data[j * per:(j + 1) * per])
                workspace.FeedBlob(f"cpu_{d}/label", labels[j * per:(j + 1) * per])
        data_parallel_model.RunNet(model, 1)
    return workspace.FetchBlob(f"cpu_{devices[0]}/fc_w"), model


def run_sgd_model(devices, steps=6, batch_size=8):
    """Same but with build_sgd + momentum and the model's own weight decay."""
    workspace.ResetWorkspace()

    def fwd(model, loss_scale):
        h = brew.fc(model, "data", "h", dim_in=6, dim_out=5)
        h = brew.relu(model, h, h)
        pred = brew.fc(model, h, "pred", dim_in=5, dim_out=3)
        softmax = brew.softmax(model, pred, "softmax")
        xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
        loss = model.net.AveragedLoss(xent, "loss")
        brew.accuracy(model, [softmax, "label"], "accuracy")
        return [model.net.Scale(loss, "scaled_loss", scale=loss_scale)]

    def opt(model):
        optimizer.add_weight_decay(model, 1e-3)
        return optimizer.build_sgd(model, 0.2, momentum=0.9, policy="step", stepsize=3, gamma=0.5)

    model = model_helper.ModelHelper(name="sgd_model")
    data_parallel_model.Parallelize(model, input_builder_fun=lambda m: None,
                                    forward_pass_builder_fun=fwd, optimizer_builder_fun=opt,
                                    devices=devices, cpu_device=True)
    data_parallel_model.RunInitNet(model)
    rng = np.random.default_rng(3)
    # common init
    for name in ("h_w", "h_b", "pred_w", "pred_b"):
        shape = workspace.FetchBlob(f"cpu_{devices[0]}/{name}").shape
        v = rng.normal(size=shape).astype(np.float32)
        for d in devices:
            workspace.FeedBlob(f"cpu_{d}/{name}", v)
    data = rng.normal(size=(batch_size * steps, 6)).astype(np.float32)
    label = (data[:, 0] > 0).astype(np.int32) + (data[:, 1] > 0).astype(np.int32)
    losses = []
    per = batch_size // len(devices)
    for s in range(steps):
        for j, d in enumerate(devices):
            lo = s * batch_size + j * per
            workspace.FeedBlob(f"cpu_{d}/data", data[lo:lo + per])
            workspace.FeedBlob(f"cpu_{d}/label", label[lo:lo + per])
        data_parallel_model.RunNet(model, 1)
        losses.append(sum(float(workspace.FetchBlob(f"cpu_{d}/loss")) for d in devices)
                      / len(devices))
    lrs = data_parallel_model.GetLearningRateBlobNames(model)
    lr = [float(workspace.FetchBlob(b)) for b in lrs]
    params = {n: workspace.FetchBlob(f"cpu_{devices[0]}/{n}") for n in ("h_w", "pred_w", "pred_b")}
    return params, losses, lrs, lr


def main():
    w1, _ = run_model([0])
    w2, _ = run_model([0, 1])
    w4, m4 = run_model([0, 1, 2, 3])
    print("dpm_test diff", np.abs(w1 - w2).max(), np.abs(w1 - w4).max())
    p1, l1, _, _ = run_sgd_model([0])
    p4, l4, lrs, lr = run_sgd_model([0, 1, 2, 3])
    print("sgd diff", {k: float(np.abs(p1[k] - p4[k]).max()) for k in p1}, l1, l4, lrs, lr)
    return w1, w2, w4, p1, p4, l1, l4, lrs, lr


if __name__ == "__main__":
    main()
