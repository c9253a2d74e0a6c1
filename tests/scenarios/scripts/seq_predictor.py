"""Seq-classifier with brew.fc + Softmax + LabelCrossEntropy + AveragedLoss, test-net clones,
and predictor extraction (model_helper and data_parallel_model)."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace

T, D, H, C = 5, 6, 8, 3


def forward(model, loss_scale=1.0):
    flat = model.net.Reshape(["data"], ["data_flat", "data_old_shape"], shape=[-1, T * D])[0]
    h = brew.fc(model, flat, "hidden", dim_in=T * D, dim_out=H)
    h = brew.tanh(model, h, "hidden_tanh")
    logits = brew.fc(model, h, "logits", dim_in=H, dim_out=C)
    softmax = brew.softmax(model, logits, "softmax")
    xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.net.AveragedLoss(xent, "loss")
    brew.accuracy(model, [softmax, "label"], "accuracy")
    if loss_scale != 1.0:
        loss = model.net.Scale(loss, "loss_scaled", scale=loss_scale)
    return [loss]


def make_data(rng, n):
    data = rng.normal(size=(n, T, D)).astype(np.float32)
    label = (np.argmax(data.sum(axis=1)[:, :C], axis=1)).astype(np.int32)
    return data, label


def single_device():
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="seq_train")
    loss = forward(model)[0]
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.5, policy="fixed")
    # Test net before the backward pass: ClonePartial up to the softmax
    test_net, (softmax_ref,) = model.net.ClonePartial("seq_test", ["data"], ["softmax"])
    full_clone = model.net.Clone("seq_train_clone")
    # an eval net: the forward model only with is_test semantics
    eval_model = model_helper.ModelHelper(name="seq_eval", init_params=False)
    forward(eval_model)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    rng = np.random.default_rng(0)
    data, label = make_data(rng, 32)
    workspace.FeedBlob("data", data)
    workspace.FeedBlob("label", label)
    losses = []
    for _ in range(30):
        workspace.RunNet(model.net.Proto().name)
        losses.append(float(workspace.FetchBlob("loss")))
    acc = float(workspace.FetchBlob("accuracy"))
    # ClonePartial test net
    workspace.RunNetOnce(test_net)
    sm_partial = workspace.FetchBlob(str(softmax_ref))
    # the eval model shares the trained parameter blobs by name
    workspace.RunNetOnce(eval_model.net)
    eval_loss = float(workspace.FetchBlob("loss"))
    # predictor
    pred_net, export_blobs = model_helper.ExtractPredictorNet(
        net_proto=model.net.Proto(), input_blobs=["data"], output_blobs=["softmax"])
    workspace.FeedBlob("data", data[:4])
    workspace.RunNetOnce(pred_net)
    sm_pred = workspace.FetchBlob("softmax")
    info = {
        "losses": losses, "acc": acc, "eval_loss": eval_loss,
        "partial_types": [op.type for op in test_net.Proto().op],
        "clone_ops": len(full_clone.Proto().op), "train_ops": len(model.net.Proto().op),
        "clone_name": full_clone.Proto().name,
        "pred_types": [op.type for op in pred_net.Proto().op],
        "export_blobs": sorted(str(b) for b in export_blobs),
        "sm_partial": sm_partial, "sm_pred": sm_pred,
        "pred_ext_in": list(pred_net.Proto().external_input),
        "pred_ext_out": list(pred_net.Proto().external_output),
    }
    return info


def dpm_predictor(num_devices=2):
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="seq_dpm")
    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.5), devices=range(num_devices),
        cpu_device=True)
    data_parallel_model.RunInitNet(model)
    rng = np.random.default_rng(0)
    data, label = make_data(rng, 8)
    per = 8 // num_devices
    for d in range(num_devices):
        workspace.FeedBlob(f"cpu_{d}/data", data[d * per:(d + 1) * per])
        workspace.FeedBlob(f"cpu_{d}/label", label[d * per:(d + 1) * per])
    data_parallel_model.RunNet(model, 3)
    pred_net, export = data_parallel_model.ExtractPredictorNet(
        model, inputs=["data"], outputs=["softmax"],
        device=core.DeviceOption(caffe2_pb2.CPU, 0))
    workspace.FeedBlob("data", data)
    workspace.RunNetOnce(pred_net)
    sm = workspace.FetchBlob("softmax")
    # reference: the same params used by hand
    w1, b1 = workspace.FetchBlob("cpu_0/hidden_w"), workspace.FetchBlob("cpu_0/hidden_b")
    w2, b2 = workspace.FetchBlob("cpu_0/logits_w"), workspace.FetchBlob("cpu_0/logits_b")
    z = np.tanh(data.reshape(8, -1) @ w1.T + b1) @ w2.T + b2
    ref = np.exp(z - z.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    return {"sm": sm, "ref": ref, "export": sorted(str(b) for b in export),
            "ext_in": list(pred_net.Proto().external_input),
            "types": [op.type for op in pred_net.Proto().op]}


def time_major_forward(model, loss_scale):
    """[T, B, D] inputs: FC over axis 2, then flatten time and batch for the loss."""
    h = brew.fc(model, "data", "h", D, H, axis=2)
    h = brew.relu(model, h, h)
    logits = brew.fc(model, h, "logits", H, C, axis=2)
    flat, _ = model.net.Reshape([logits], ["logits_flat", "logits_old_shape"], shape=[-1, C])
    softmax = brew.softmax(model, flat, "softmax", axis=1)
    labels, _ = model.net.Reshape(["target"], ["target_flat", "target_old_shape"], shape=[-1])
    xent = model.net.LabelCrossEntropy([softmax, labels], "xent")
    loss = model.net.AveragedLoss(xent, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def time_major_dpm(num_devices, steps=8, batch=8):
    """Batch-split time-major sequences over CPU devices, trained with Adam."""
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="seq_time_major")
    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=time_major_forward,
        optimizer_builder_fun=lambda m: optimizer.build_adam(m, 0.05),
        devices=list(range(num_devices)), cpu_device=True)
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    for name in ("h_w", "h_b", "logits_w", "logits_b"):
        shape = workspace.FetchBlob(f"cpu_0/{name}").shape
        value = (rng.normal(size=shape) * 0.3).astype(np.float32)
        for d in range(num_devices):
            workspace.FeedBlob(f"cpu_{d}/{name}", value)
    workspace.CreateNet(model.net)
    x = rng.normal(size=(T, batch, D)).astype(np.float32)
    y = (x[..., 0] > 0).astype(np.int32) + (x[..., 1] > 0).astype(np.int32)
    per = batch // num_devices
    losses = []
    for _ in range(steps):
        for d in range(num_devices):
            part = slice(d * per, (d + 1) * per)
            workspace.FeedBlob(f"cpu_{d}/data", np.ascontiguousarray(x[:, part]))
            workspace.FeedBlob(f"cpu_{d}/target", np.ascontiguousarray(y[:, part]))
        data_parallel_model.RunNet(model, 1)
        losses.append(float(np.mean([workspace.FetchBlob(f"cpu_{d}/loss")
                                     for d in range(num_devices)])))
    return losses, {n: workspace.FetchBlob(f"cpu_0/{n}") for n in ("h_w", "logits_w")}


def main():
    a = single_device()
    for k, v in a.items():
        print(k, v if not isinstance(v, np.ndarray) else v.shape)
    b = dpm_predictor()
    print("dpm", np.abs(b["sm"] - b["ref"]).max(), b["export"], b["ext_in"], b["types"])
    return a, b


if __name__ == "__main__":
    main()
