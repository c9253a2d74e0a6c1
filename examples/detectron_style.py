"""A Detectron-style data-parallel training script, run on dpgraph's virtual GPUs.

It is written the way Detectron (facebookresearch/Detectron) builds its multi-GPU
training graph, through the Caffe2 import alias: per-GPU ``NamedCudaScope`` name and device
scopes, one ``AddGradientOperators`` over all the losses of all GPUs, ``muji.Allreduce`` of
the gradients (in place, ``reduced_affix=''``) or ``NCCLAllreduce``, and per-GPU momentum
SGD updates with weight decay.  Running it trains on 8 virtual GPUs and on 1, and checks
that the parameters agree::

    python examples/detectron_style.py [--gpus 8] [--iters 5] [--nccl]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpgraph.compat import caffe2 as caffe2_alias

caffe2_alias.install()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import cnn, core, muji, workspace  # noqa: E402

BATCH, CLASSES, WEIGHT_DECAY, MOMENTUM, BASE_LR = 16, 4, 1e-4, 0.9, 0.05
LAST_MODEL: list[Any] = []  # the most recently trained model (for tests)


# --- detectron/utils/c2.py -----------------------------------------------------------------
def CudaDevice(gpu_id: int) -> caffe2_pb2.DeviceOption:
    return core.DeviceOption(caffe2_pb2.CUDA, gpu_id)


@contextlib.contextmanager
def NamedCudaScope(gpu_id: int) -> Iterator[None]:
    with core.NameScope(f"gpu_{gpu_id}"), core.DeviceScope(CudaDevice(gpu_id)):
        yield


@contextlib.contextmanager
def CudaScope(gpu_id: int) -> Iterator[None]:
    with core.DeviceScope(CudaDevice(gpu_id)):
        yield


# --- detectron/modeling/detector.py (the data-parallel parts) ------------------------------
class DetectionModelHelper(cnn.CNNModelHelper):
    def __init__(self, num_gpus: int, **kwargs: Any) -> None:
        kwargs.setdefault("order", "NCHW")
        super().__init__(**kwargs)
        self.num_gpus = num_gpus
        self.do_not_update_params: list[Any] = []
        self.net.Proto().num_workers = num_gpus * 4

    def TrainableParams(self, gpu_id: int = -1) -> list[Any]:
        return [p for p in self.params
                if p in self.param_to_grad and p not in self.do_not_update_params
                and (gpu_id == -1 or str(p).find(f"gpu_{gpu_id}") == 0)]

    def GetLossScale(self) -> float:
        return 1.0 / self.num_gpus


def single_gpu_build(model: DetectionModelHelper) -> dict[Any, Any]:
    """A tiny two-headed 'detector': classification + box regression losses."""
    conv = model.Conv("data", "conv1", 3, 8, 3, pad=1)
    relu = model.Relu(conv, "conv1_relu")
    pool = model.MaxPool(relu, "pool1", kernel=2, stride=2)
    cls = model.FC(pool, "cls_score", 8 * 4 * 4, CLASSES)
    box = model.FC(pool, "bbox_pred", 8 * 4 * 4, 4)
    _, loss_cls = model.net.SoftmaxWithLoss([cls, "labels"], ["cls_prob", "loss_cls_raw"])
    loss_cls = model.net.Scale(loss_cls, "loss_cls", scale=model.GetLossScale())
    dist = model.net.SquaredL2Distance([box, "bbox_targets"], "bbox_dist")
    loss_box = model.net.AveragedLoss(dist, "loss_bbox_raw")
    loss_box = model.net.Scale(loss_box, "loss_bbox", scale=model.GetLossScale())
    return {loss: model.net.ConstantFill(loss, [loss + "_grad"], value=1.0)
            for loss in (loss_cls, loss_box)}


# --- detectron/modeling/optimizer.py -------------------------------------------------------
def build_data_parallel_model(model: DetectionModelHelper, use_nccl: bool) -> None:
    all_loss_gradients: dict[Any, Any] = {}
    for gpu_id in range(model.num_gpus):
        with NamedCudaScope(gpu_id):
            all_loss_gradients.update(single_gpu_build(model))
    model.AddGradientOperators(all_loss_gradients)
    if model.num_gpus > 1:
        _add_allreduce_graph(model, use_nccl)
    for gpu_id in range(model.num_gpus):
        with NamedCudaScope(gpu_id):
            add_single_gpu_param_update_ops(model, gpu_id)


def _add_allreduce_graph(model: DetectionModelHelper, use_nccl: bool) -> None:
    all_params = model.TrainableParams()
    assert len(all_params) % model.num_gpus == 0
    params_per_gpu = len(all_params) // model.num_gpus
    with CudaScope(0):
        for i in range(params_per_gpu):
            gradients = [model.param_to_grad[p] for p in all_params[i::params_per_gpu]]
            if use_nccl:
                model.NCCLAllreduce(gradients, gradients)
            else:
                muji.Allreduce(model.net, gradients, reduced_affix="")


def add_single_gpu_param_update_ops(model: DetectionModelHelper, gpu_id: int) -> None:
    lr = model.param_init_net.ConstantFill([], "lr", shape=[1], value=0.0)
    one = model.param_init_net.ConstantFill([], "one", shape=[1], value=1.0)
    wd = model.param_init_net.ConstantFill([], "wd", shape=[1], value=WEIGHT_DECAY)
    for param in model.TrainableParams(gpu_id=gpu_id):
        grad = model.param_to_grad[param]
        momentum = model.param_init_net.ConstantFill(param, param + "_momentum", value=0.0)
        if param in model.biases:
            model.Scale(grad, grad, scale=2.0)
        else:
            model.WeightedSum([grad, one, param, wd], grad)
        model.net.MomentumSGDUpdate([grad, momentum, lr, param], [grad, momentum, param],
                                    momentum=MOMENTUM)


# --- detectron/utils/net.py + tools/train_net.py -------------------------------------------
def broadcast_parameters(model: DetectionModelHelper) -> None:
    """Copy GPU 0's initial parameters to the other GPUs (FetchBlob/FeedBlob)."""
    if model.num_gpus == 1:
        return
    blobs_per_gpu = len(model.params) // model.num_gpus
    for i in range(blobs_per_gpu):
        blobs = model.params[i::blobs_per_gpu]
        data = workspace.FetchBlob(blobs[0])
        for gpu_id, blob in enumerate(blobs[1:], start=1):
            with CudaScope(gpu_id):
                workspace.FeedBlob(blob, data)


def make_batch(seed: int = 0) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    return {"data": rs.randn(BATCH, 3, 8, 8).astype(np.float32),
            "labels": rs.randint(0, CLASSES, size=BATCH).astype(np.int32),
            "bbox_targets": rs.randn(BATCH, 4).astype(np.float32)}


def initial_params(model: DetectionModelHelper) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(1234)
    return {str(p)[len("gpu_0/"):]: (0.1 * rs.randn(*workspace.FetchBlob(p).shape))
            .astype(np.float32) for p in model.GetParams("gpu_0/")}


def train(num_gpus: int, iters: int = 5, use_nccl: bool = False) -> dict[str, np.ndarray]:
    """Build and train; returns GPU 0's parameters after ``iters`` iterations."""
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(max(num_gpus, workspace.NumGpuDevices()))
    model = DetectionModelHelper(num_gpus, name=f"detectron_{num_gpus}gpu", init_params=True)
    build_data_parallel_model(model, use_nccl)
    LAST_MODEL[:] = [model]
    workspace.RunNetOnce(model.param_init_net)
    with CudaScope(0):
        for name, value in initial_params(model).items():
            workspace.FeedBlob(f"gpu_0/{name}", value)
    broadcast_parameters(model)
    for gpu_id in range(num_gpus):
        with CudaScope(gpu_id):
            workspace.FeedBlob(f"gpu_{gpu_id}/lr", np.array([BASE_LR], dtype=np.float32))
    workspace.CreateNet(model.net)
    batch, per = make_batch(), BATCH // num_gpus
    for _ in range(iters):
        for gpu_id in range(num_gpus):
            with CudaScope(gpu_id):
                for name, value in batch.items():
                    workspace.FeedBlob(f"gpu_{gpu_id}/{name}",
                                       value[gpu_id * per:(gpu_id + 1) * per])
        workspace.RunNet(model.net.Proto().name)
    return {str(p)[len("gpu_0/"):]: workspace.FetchBlob(p) for p in model.GetParams("gpu_0/")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--nccl", action="store_true", help="NCCLAllreduce instead of muji")
    args = parser.parse_args(argv)
    many = train(args.gpus, args.iters, args.nccl)
    one = train(1, args.iters)
    diff = max(float(np.abs(many[n] - one[n]).max()) for n in one)
    same = all(np.allclose(many[n], one[n], rtol=1e-5, atol=1e-6) for n in one)
    print(f"{args.gpus} virtual GPUs vs 1 GPU after {args.iters} iterations: "
          f"max |diff| = {diff:.2e} -> {'same parameters' if same else 'MISMATCH'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
