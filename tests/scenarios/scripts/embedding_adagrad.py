"""Embedding model with sparse gradients (Gather) and Adagrad, on virtual GPUs."""
import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import brew, cnn, core, data_parallel_model, model_helper, optimizer, workspace

VOCAB, DIM = 20, 4


def run(num_gpus, steps=5, batch=8, use_dpm_param_update=False):
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(4)

    def input_builder(model):
        pass

    def forward(model, loss_scale):
        emb = model.param_init_net.GaussianFill([], "emb", shape=[VOCAB, DIM], std=0.5)
        model.AddParameter(emb)
        gathered = model.net.Gather([emb, "indices"], "gathered")
        fc = brew.fc(model, gathered, "fc", dim_in=DIM, dim_out=2)
        sm, loss = model.net.SoftmaxWithLoss([fc, "label"], ["softmax", "loss"], scale=loss_scale)
        return [loss]

    def opt(model):
        return optimizer.build_adagrad(model, base_learning_rate=0.3, epsilon=1e-4)

    def sparse_update(model):
        # the SparseDataParallelModelTest style update
        ITER = model.Iter("ITER")
        LR = model.net.LearningRate([ITER], "LR", base_lr=-0.3, policy="fixed")
        ONE = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in model.GetParams():
            grad = model.param_to_grad[param]
            if isinstance(grad, core.GradientSlice):
                model.ScatterWeightedSum([param, ONE, grad.indices, grad.values, LR], param)
            else:
                model.WeightedSum([param, ONE, grad, LR], param)

    model = (cnn.CNNModelHelper(order="NHWC", name=f"sparse_test{num_gpus}") if use_dpm_param_update
             else model_helper.ModelHelper(name=f"emb{num_gpus}"))
    kwargs = ({"param_update_builder_fun": sparse_update} if use_dpm_param_update
              else {"optimizer_builder_fun": opt})
    data_parallel_model.Parallelize_GPU(model, input_builder_fun=input_builder,
                                        forward_pass_builder_fun=forward,
                                        devices=list(range(num_gpus)), **kwargs)
    sparse = [str(p) for p, g in model.param_to_grad.items()
              if isinstance(g, core.GradientSlice)]
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    init = {n: rng.normal(size=workspace.FetchBlob(f"gpu_0/{n}").shape).astype(np.float32)
            for n in ("emb", "fc_w", "fc_b")}
    for g in range(num_gpus):
        for n, v in init.items():
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(f"gpu_{g}/{n}", v)
    workspace.CreateNet(model.net)
    idx = rng.integers(0, VOCAB, batch * steps).astype(np.int32)
    idx[:batch] = 3  # repeated indices in a batch
    lab = (idx % 2).astype(np.int32)
    per = batch // num_gpus
    losses = []
    for s in range(steps):
        for g in range(num_gpus):
            lo = s * batch + g * per
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, g)):
                workspace.FeedBlob(f"gpu_{g}/indices", idx[lo:lo + per])
                workspace.FeedBlob(f"gpu_{g}/label", lab[lo:lo + per])
        workspace.RunNet(model.net.Proto().name)
        losses.append(sum(float(workspace.FetchBlob(f"gpu_{g}/loss")) for g in range(num_gpus)))
    final = {n: workspace.FetchBlob(f"gpu_0/{n}") for n in init}
    spread = max(float(np.abs(workspace.FetchBlob(f"gpu_{g}/{n}") - final[n]).max())
                 for g in range(num_gpus) for n in init)
    return losses, final, spread, sparse


def main():
    out = {}
    for upd in (False, True):
        l1, f1, _, sp1 = run(1, use_dpm_param_update=upd)
        for n in (2, 4):
            ln, fn, spread, spn = run(n, use_dpm_param_update=upd)
            diff = max(float(np.abs(f1[k] - fn[k]).max()) for k in f1)
            out[(upd, n)] = (l1, ln, diff, spread, spn)
            print(upd, n, "diff", diff, "spread", spread, spn)
            print("  ", l1)
            print("  ", ln)
    return out


if __name__ == "__main__":
    main()
