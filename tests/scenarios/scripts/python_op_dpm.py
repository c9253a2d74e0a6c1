"""A custom layer written as a Python op (net.Python(f, grad_f)) inside Parallelize."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, core, data_parallel_model, model_helper, optimizer, workspace


def square(inputs, outputs):
    outputs[0].feed(inputs[0].data ** 2)


def square_grad(inputs, outputs):
    x, _, grad_y = inputs
    outputs[0].feed(2 * x.data * grad_y.data)


def forward(model, loss_scale):
    h = brew.fc(model, "data", "h", 4, 3)
    h2 = model.net.Python(square, square_grad)([h], ["h2"])
    out = brew.fc(model, h2, "out", 3, 1)
    dist = model.net.SquaredL2Distance([out, "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def run(num_devices, cpu, steps=10, batch=8):
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="python_layer")
    data_parallel_model.Parallelize(
        model, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.05, momentum=0.5),
        devices=list(range(num_devices)), cpu_device=cpu)
    prefix = "cpu" if cpu else "gpu"

    def dev(g):
        return core.DeviceOption(caffe2_pb2.CPU if cpu else caffe2_pb2.CUDA, g)

    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    for name in ("h_w", "h_b", "out_w", "out_b"):
        shape = workspace.FetchBlob(f"{prefix}_0/{name}").shape
        value = (rng.normal(size=shape) * 0.5).astype(np.float32)
        for g in range(num_devices):
            workspace.FeedBlob(f"{prefix}_{g}/{name}", value, device_option=dev(g))
    workspace.CreateNet(model.net)
    x = rng.normal(size=(batch, 4)).astype(np.float32)
    t = rng.normal(size=(batch, 1)).astype(np.float32)
    per = batch // num_devices
    losses = []
    for _ in range(steps):
        for g in range(num_devices):
            part = slice(g * per, (g + 1) * per)
            workspace.FeedBlob(f"{prefix}_{g}/data", x[part], device_option=dev(g))
            workspace.FeedBlob(f"{prefix}_{g}/target", t[part], device_option=dev(g))
        workspace.RunNet(model.net.Proto().name)
        losses.append(float(np.mean([workspace.FetchBlob(f"{prefix}_{g}/loss")
                                     for g in range(num_devices)])))
    params = {n: workspace.FetchBlob(f"{prefix}_0/{n}") for n in ("h_w", "out_w")}
    return losses, params, model


def main():
    workspace.SetVirtualGpus(4)
    for cpu in (True, False):
        l1, p1, _ = run(1, cpu)
        l4, p4, _ = run(4, cpu)
        print(cpu, l1[0], l1[-1], max(float(np.abs(p1[k] - p4[k]).max()) for k in p1))


if __name__ == "__main__":
    main()
