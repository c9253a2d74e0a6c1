"""Detectron-like training: CNNModelHelper subclass, NamedCudaScope, muji / NCCL allreduce."""
import contextlib
import json

import numpy as np
from caffe2.proto import caffe2_pb2
from caffe2.python import cnn, core, muji, scope, workspace
from caffe2.python.modeling import initializers
from caffe2.python.modeling.parameter_info import ParameterTags

NUM_GPUS = 4
BASE_LR = 0.02
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4


@contextlib.contextmanager
def NamedCudaScope(gpu_id):
    with core.NameScope(f"gpu_{gpu_id:d}"):
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, gpu_id)):
            yield


@contextlib.contextmanager
def CudaScope(gpu_id):
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, gpu_id)):
        yield


class DetectionModelHelper(cnn.CNNModelHelper):
    def __init__(self, **kwargs):
        self.train = kwargs.pop("train", False)
        self.num_classes = kwargs.pop("num_classes", -1)
        assert self.num_classes > 0
        kwargs["order"] = "NCHW"
        kwargs["cudnn_exhaustive_search"] = False
        super().__init__(**kwargs)
        self.losses = []
        self.do_not_update_params = []
        self.net.Proto().type = "dag"
        self.net.Proto().num_workers = NUM_GPUS * 4
        self.gn_params = []

    def TrainableParams(self, gpu_id=-1):
        return [
            p for p in self.params
            if p in self.param_to_grad and p not in self.do_not_update_params
            and (gpu_id == -1 or str(p).find(f"gpu_{gpu_id}") == 0)
        ]

    def AffineChannel(self, blob_in, blob_out, dim, inplace=False):
        blob_out = blob_out or self.net.NextName()
        scale = self.create_param(
            param_name=blob_out + "_s", shape=[dim], tags=ParameterTags.WEIGHT,
            initializer=initializers.Initializer("ConstantFill", value=1.))
        bias = self.create_param(
            param_name=blob_out + "_b", shape=[dim], tags=ParameterTags.BIAS,
            initializer=initializers.Initializer("ConstantFill", value=0.))
        if inplace:
            return self.net.AffineChannel([blob_in, scale, bias], blob_in)
        return self.net.AffineChannel([blob_in, scale, bias], blob_out)

    def GetLossScale(self):
        return 1.0 / NUM_GPUS

    def UpdateWorkspaceLr(self, new_lr):
        cur_lr = workspace.FetchBlob("gpu_0/lr")[0]
        if cur_lr != new_lr:
            for i in range(NUM_GPUS):
                with CudaScope(i):
                    workspace.FeedBlob(f"gpu_{i}/lr", np.array([new_lr], dtype=np.float32))
            ratio = max(new_lr / max(cur_lr, 1e-10), cur_lr / max(new_lr, 1e-10))
            if cur_lr > 1e-7 and ratio > 1.1:
                self._CorrectMomentum(new_lr / cur_lr)
        return new_lr

    def _CorrectMomentum(self, correction):
        for i in range(NUM_GPUS):
            with CudaScope(i):
                for param in self.TrainableParams(gpu_id=i):
                    op = core.CreateOperator("Scale", [param + "_momentum"],
                                             [param + "_momentum"], scale=correction)
                    workspace.RunOperatorOnce(op)


def py_op_copy_blob(blob_in, blob_out):
    """Copy a numpy array into a Caffe2 CPUTensor inside a Python op (float32 or int32)."""
    needs_int32_init = False
    try:
        _ = blob_out.data.dtype  # noqa
    except Exception:
        needs_int32_init = blob_in.dtype == np.int32
    if needs_int32_init or blob_in.dtype == np.int32:
        blob_out.init(list(blob_in.shape), caffe2_pb2.TensorProto.INT32)
    else:
        blob_out.reshape(blob_in.shape)
    blob_out.data[...] = blob_in


class RoIDataLabelsOp:
    """A Detectron-style Python op: turns the loader's float labels into int32 labels."""

    def forward(self, inputs, outputs):
        labels = inputs[0].data.astype(np.int32)
        py_op_copy_blob(labels, outputs[0])


def gauss_fill(std):
    return ("GaussianFill", {"std": std})


def const_fill(value):
    return ("ConstantFill", {"value": value})


def single_gpu_build(model):
    conv = model.Conv("data", "conv1", 3, 4, 3, pad=1,
                      weight_init=gauss_fill(0.1), bias_init=const_fill(0.0))
    model.AffineChannel(conv, "conv1_ac", dim=4, inplace=True)
    relu = model.Relu(conv, conv)
    pool = model.AveragePool(relu, "pool", kernel=4, stride=4)
    fc = model.FC(pool, "cls_score", 4 * 2 * 2, model.num_classes,
                  weight_init=gauss_fill(0.1), bias_init=const_fill(0.0))
    model.net.Python(RoIDataLabelsOp().forward)(["labels_float"], ["labels"])
    prob, loss = model.net.SoftmaxWithLoss([fc, "labels"], ["cls_prob", "loss_cls"],
                                           scale=model.GetLossScale())
    model.losses.append("loss_cls")
    return {loss: model.net.ConstantFill(loss, [loss + "_grad"], value=1.0)}


def add_single_gpu_param_update_ops(model, gpu_id):
    lr = model.param_init_net.ConstantFill([], "lr", shape=[1], value=0.0)
    one = model.param_init_net.ConstantFill([], "one", shape=[1], value=1.0)
    wd = model.param_init_net.ConstantFill([], "wd", shape=[1], value=WEIGHT_DECAY)
    for param in model.TrainableParams(gpu_id=gpu_id):
        param_grad = model.param_to_grad[param]
        param_momentum = model.param_init_net.ConstantFill([param], param + "_momentum", value=0.0)
        if param in model.biases:
            model.Scale(param_grad, param_grad, scale=2.0)
        elif WEIGHT_DECAY > 0:
            model.WeightedSum([param_grad, one, param, wd], param_grad)
        model.net.MomentumSGDUpdate([param_grad, param_momentum, lr, param],
                                    [param_grad, param_momentum, param], momentum=MOMENTUM)


def add_allreduce_graph(model, use_nccl):
    all_params = model.TrainableParams()
    assert len(all_params) % NUM_GPUS == 0
    params_per_gpu = len(all_params) // NUM_GPUS
    with CudaScope(0):
        for i in range(params_per_gpu):
            gradients = [model.param_to_grad[p] for p in all_params[i::params_per_gpu]]
            if len(gradients) > 0:
                if use_nccl:
                    model.net.NCCLAllreduce(gradients, gradients)
                else:
                    muji.Allreduce(model.net, gradients, reduced_affix="")


def build_data_parallel_model(model, use_nccl):
    all_loss_gradients = {}
    for gpu_id in range(NUM_GPUS):
        with NamedCudaScope(gpu_id):
            all_loss_gradients.update(single_gpu_build(model))
    model.AddGradientOperators(all_loss_gradients)
    if NUM_GPUS > 1:
        add_allreduce_graph(model, use_nccl)
    for gpu_id in range(NUM_GPUS):
        with NamedCudaScope(gpu_id):
            add_single_gpu_param_update_ops(model, gpu_id)


def broadcast_parameters(model):
    if NUM_GPUS == 1:
        return
    all_params = model.params
    blobs_per_gpu = len(all_params) // NUM_GPUS
    for i in range(blobs_per_gpu):
        blobs = [p for p in all_params[i::blobs_per_gpu]]
        data = workspace.FetchBlob(blobs[0])
        for j, p in enumerate(blobs[1:]):
            with CudaScope(j + 1):
                workspace.FeedBlob(p, data)


def run(num_gpus, use_nccl, steps=5, batch=8):
    global NUM_GPUS
    NUM_GPUS = num_gpus
    workspace.ResetWorkspace()
    assert workspace.NumCudaDevices() >= num_gpus, "run with DPGRAPH_VIRTUAL_GPUS=4"
    model = DetectionModelHelper(name="generalized_rcnn", train=True, num_classes=3,
                                 init_params=True)
    build_data_parallel_model(model, use_nccl)
    assert scope.CurrentNameScope() == ""
    workspace.RunNetOnce(model.param_init_net)
    broadcast_parameters(model)
    workspace.CreateNet(model.net)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(batch, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 3, batch).astype(np.int32)
    per = batch // num_gpus
    # deterministic params across gpu counts
    prng = np.random.default_rng(5)
    for p in model.params[: len(model.params) // num_gpus]:
        v = (prng.normal(size=workspace.FetchBlob(p).shape) * 0.1).astype(np.float32)
        for g in range(num_gpus):
            with CudaScope(g):
                workspace.FeedBlob(str(p).replace("gpu_0/", f"gpu_{g}/"), v)
    losses = []
    for it in range(steps):
        model.UpdateWorkspaceLr(BASE_LR if it < 3 else BASE_LR * 0.1)
        for g in range(num_gpus):
            with NamedCudaScope(g):
                workspace.FeedBlob(core.ScopedName("data"), data[g * per:(g + 1) * per])
                workspace.FeedBlob(core.ScopedName("labels_float"),
                                   labels[g * per:(g + 1) * per].astype(np.float32))
        workspace.RunNet(model.net.Proto().name)
        losses.append(sum(float(workspace.FetchBlob(f"gpu_{g}/loss_cls"))
                          for g in range(num_gpus)))
    params = {str(p)[6:]: workspace.FetchBlob(p) for p in model.params
              if str(p).startswith("gpu_0/")}
    spread = max(float(np.abs(workspace.FetchBlob(p) - params[str(p)[6:]]).max())
                 for p in model.params)
    return losses, params, spread, model


def main():
    l1, p1, _, _ = run(1, False)
    out = {"losses_1": l1}
    for use_nccl in (False, True):
        l4, p4, spread, _ = run(4, use_nccl)
        diff = max(float(np.abs(p1[k] - p4[k]).max()) for k in p1)
        out["nccl" if use_nccl else "muji"] = {"losses": l4, "diff": diff, "spread": spread}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
