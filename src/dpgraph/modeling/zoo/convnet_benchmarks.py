"""Soumith Chintala's convnet benchmark models built with brew (Caffe2's
``caffe2.python.convnet_benchmarks``): MLP, AlexNet, OverFeat, VGGA and Inception (GoogLeNet
v1), with a plain-SGD update and the ``Benchmark`` driver and its argument parser.

Every builder takes ``(order, cudnn_ws)`` and returns ``(model, input_size)``; the nets read
``data`` and ``label`` and end in ``pred`` (softmax), ``xent`` and ``loss``.  A convolution
named ``convN`` is followed by an in-place Relu on the same blob; parameters are
``<layer>_w`` (XavierFill) and ``<layer>_b`` (ConstantFill).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dpgraph.modeling.brew import brew
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.runtime import api as ws_api

_XAVIER: tuple[str, dict[str, Any]] = ("XavierFill", {})
_CONSTANT: tuple[str, dict[str, Any]] = ("ConstantFill", {})

# Layer specs: ("conv", name, dim_in, dim_out, kernel, {stride/pad}) -- conv + in-place Relu;
# ("max"|"avg", name, {kernel/stride/pad}) -- pooling; ("fc", name, dim_in, dim_out, relu).
Spec = tuple[Any, ...]


def _conv_relu(model: Any, blob_in: Any, name: str, dim_in: int, dim_out: int, kernel: int,
               **kwargs: Any) -> Any:
    """Convolution ``name`` and a Relu writing over it."""
    conv = brew.conv(model, blob_in, name, dim_in, dim_out, kernel, _XAVIER, _CONSTANT, **kwargs)
    return brew.relu(model, conv, conv)


def _apply(model: Any, blob: Any, specs: Sequence[Spec]) -> Any:
    """Add the layers of ``specs`` after ``blob``; returns the last output."""
    for spec in specs:
        kind, name = spec[0], spec[1]
        if kind == "conv":
            blob = _conv_relu(model, blob, name, spec[2], spec[3], spec[4], **spec[5])
        elif kind == "max":
            blob = brew.max_pool(model, blob, name, **spec[2])
        elif kind == "avg":
            blob = brew.average_pool(model, blob, name, **spec[2])
        else:
            blob = brew.fc(model, blob, name, spec[2], spec[3], _XAVIER, _CONSTANT)
            if spec[4]:
                blob = brew.relu(model, blob, blob)
    return blob


def _add_softmax_loss(model: Any, logits: Any) -> None:
    pred = brew.softmax(model, logits, "pred")
    xent = model.net.LabelCrossEntropy([pred, "label"], "xent")
    model.net.AveragedLoss(xent, "loss")


def _conv_model(name: str, order: str, cudnn_ws: Any) -> ModelHelper:
    """A ModelHelper whose arg scope asks for cuDNN with exhaustive search (and the cuDNN
    workspace limit when ``cudnn_ws`` is given)."""
    arg_scope: dict[str, Any] = {"order": order, "use_cudnn": True,
                                 "cudnn_exhaustive_search": True}
    if cudnn_ws:
        arg_scope["ws_nbytes_limit"] = cudnn_ws
    return ModelHelper(name=name, arg_scope=arg_scope)


def _classifier(name: str, order: str, cudnn_ws: Any, specs: Sequence[Spec],
                input_size: int) -> tuple[ModelHelper, int]:
    model = _conv_model(name, order, cudnn_ws)
    _add_softmax_loss(model, _apply(model, "data", specs))
    return model, input_size


def MLP(order: str, cudnn_ws: Any) -> tuple[ModelHelper, int]:
    """Three parallel 20-layer 256-wide FC towers (XavierFill weights and biases), summed,
    then a 1000-way FC; LabelCrossEntropy on the raw outputs."""
    model = ModelHelper(name="MLP")
    width, depth, towers = 256, 20, 3
    for i in range(depth):
        for j in range(towers):
            source = f"fc_{i}_{j}" if i > 0 else "data"
            brew.fc(model, source, f"fc_{i + 1}_{j}", dim_in=width, dim_out=width,
                    weight_init=_XAVIER, bias_init=_XAVIER)
    brew.sum(model, [f"fc_{depth}_{j}" for j in range(towers)], ["sum"])
    brew.fc(model, "sum", "last", dim_in=width, dim_out=1000, weight_init=_XAVIER,
            bias_init=_XAVIER)
    xent = model.net.LabelCrossEntropy(["last", "label"], "xent")
    model.net.AveragedLoss(xent, "loss")
    return model, width


def _pool(kind: str, name: str, kernel: int, stride: int, pad: int | None = None) -> Spec:
    args = {"kernel": kernel, "stride": stride}
    if pad is not None:
        args["pad"] = pad
    return (kind, name, args)


def _conv(name: str, dim_in: int, dim_out: int, kernel: int, **kwargs: int) -> Spec:
    return ("conv", name, dim_in, dim_out, kernel, kwargs)


def _fc_head(dim_in: int, hidden: Sequence[int], names: Sequence[str]
             ) -> list[Spec]:
    """FC + Relu layers of widths ``hidden``, then a 1000-way FC without Relu."""
    dims = [dim_in, *hidden, 1000]
    return [("fc", names[i], dims[i], dims[i + 1], i < len(hidden)) for i in range(len(names))]


def AlexNet(order: str, cudnn_ws: Any) -> tuple[ModelHelper, int]:
    """AlexNet (one-tower, 64-192-384-256-256 filters), 224x224 inputs."""
    specs = [
        _conv("conv1", 3, 64, 11, stride=4, pad=2), _pool("max", "pool1", 3, 2),
        _conv("conv2", 64, 192, 5, pad=2), _pool("max", "pool2", 3, 2),
        _conv("conv3", 192, 384, 3, pad=1), _conv("conv4", 384, 256, 3, pad=1),
        _conv("conv5", 256, 256, 3, pad=1), _pool("max", "pool5", 3, 2),
        *_fc_head(256 * 6 * 6, [4096, 4096], ["fc6", "fc7", "fc8"]),
    ]
    return _classifier("alexnet", order, cudnn_ws, specs, 224)


def OverFeat(order: str, cudnn_ws: Any) -> tuple[ModelHelper, int]:
    """OverFeat (fast), 231x231 inputs."""
    specs = [
        _conv("conv1", 3, 96, 11, stride=4), _pool("max", "pool1", 2, 2),
        _conv("conv2", 96, 256, 5), _pool("max", "pool2", 2, 2),
        _conv("conv3", 256, 512, 3, pad=1), _conv("conv4", 512, 1024, 3, pad=1),
        _conv("conv5", 1024, 1024, 3, pad=1), _pool("max", "pool5", 2, 2),
        *_fc_head(1024 * 6 * 6, [3072, 4096], ["fc6", "fc7", "fc8"]),
    ]
    return _classifier("overfeat", order, cudnn_ws, specs, 231)


def VGGA(order: str, cudnn_ws: Any) -> tuple[ModelHelper, int]:
    """VGG model A (eight 3x3 convolutions), 231x231 inputs."""
    widths = [(3, 64), (64, 128), (128, 256), (256, 256), (256, 512), (512, 512),
              (512, 512), (512, 512)]
    pooled_after = {1, 2, 4, 6, 8}
    specs: list[Spec] = []
    for i, (dim_in, dim_out) in enumerate(widths, start=1):
        specs.append(_conv(f"conv{i}", dim_in, dim_out, 3, pad=1))
        if i in pooled_after:
            specs.append(_pool("max", f"pool{i}", 2, 2))
    specs += _fc_head(512 * 7 * 7, [4096, 4096], ["fcix", "fcx", "fcxi"])
    return _classifier("vgga", order, cudnn_ws, specs, 231)


def _InceptionModule(model: Any, input_blob: Any, input_depth: int, output_name: str,
                     conv1_depth: int, conv3_depths: Sequence[int],
                     conv5_depths: Sequence[int], pool_depth: int) -> Any:
    """Four towers concatenated into ``output_name``: 1x1; 1x1 then 3x3; 1x1 then 5x5;
    3x3 max pool then 1x1 (each convolution followed by an in-place Relu)."""
    prefix = output_name + ":"
    tower1 = _conv_relu(model, input_blob, prefix + "conv1", input_depth, conv1_depth, 1)
    reduce3 = _conv_relu(model, input_blob, prefix + "conv3_reduce", input_depth,
                         conv3_depths[0], 1)
    tower3 = _conv_relu(model, reduce3, prefix + "conv3", conv3_depths[0], conv3_depths[1],
                        3, pad=1)
    reduce5 = _conv_relu(model, input_blob, prefix + "conv5_reduce", input_depth,
                         conv5_depths[0], 1)
    tower5 = _conv_relu(model, reduce5, prefix + "conv5", conv5_depths[0], conv5_depths[1],
                        5, pad=2)
    pool = brew.max_pool(model, input_blob, prefix + "pool", kernel=3, stride=1, pad=1)
    tower_pool = _conv_relu(model, pool, prefix + "pool_proj", input_depth, pool_depth, 1)
    return brew.concat(model, [tower1, tower3, tower5, tower_pool], output_name)


# GoogLeNet's inception modules: (name, input depth, 1x1, [3x3 reduce, 3x3],
# [5x5 reduce, 5x5], pool projection), and where the stride-2 max pools go.
_INCEPTION_MODULES = (
    ("inc3", 192, 64, (96, 128), (16, 32), 32),
    ("inc4", 256, 128, (128, 192), (32, 96), 64),
    ("pool5",),
    ("inc5", 480, 192, (96, 208), (16, 48), 64),
    ("inc6", 512, 160, (112, 224), (24, 64), 64),
    ("inc7", 512, 128, (128, 256), (24, 64), 64),
    ("inc8", 512, 112, (144, 288), (32, 64), 64),
    ("inc9", 528, 256, (160, 320), (32, 128), 128),
    ("pool9",),
    ("inc10", 832, 256, (160, 320), (32, 128), 128),
    ("inc11", 832, 384, (192, 384), (48, 128), 128),
)


def Inception(order: str, cudnn_ws: Any) -> tuple[ModelHelper, int]:
    """GoogLeNet v1 (nine inception modules), 224x224 inputs; a softmax is added on top so
    the backward pass has a proper loss."""
    model = _conv_model("inception", order, cudnn_ws)
    blob = _apply(model, "data", [
        _conv("conv1", 3, 64, 7, stride=2, pad=3), _pool("max", "pool1", 3, 2, 1),
        _conv("conv2a", 64, 64, 1), _conv("conv2", 64, 192, 3, pad=1),
        _pool("max", "pool2", 3, 2, 1),
    ])
    for module in _INCEPTION_MODULES:
        if len(module) == 1:
            blob = brew.max_pool(model, blob, module[0], kernel=3, stride=2, pad=1)
        else:
            blob = _InceptionModule(model, blob, module[1], module[0], *module[2:])
    blob = brew.average_pool(model, blob, "pool11", kernel=7, stride=1)
    _add_softmax_loss(model, brew.fc(model, blob, "fc", 1024, 1000, _XAVIER, _CONSTANT))
    return model, 224


def AddParameterUpdate(model: Any) -> None:
    """Plain SGD (``param += LR * grad``, LR = -1e-8 decayed 0.999 every 10000 steps); not
    tuned to train, only to time an update."""
    iteration = brew.iter(model, "iter")
    lr = model.net.LearningRate(iteration, "LR", base_lr=-1e-8, policy="step",
                                stepsize=10000, gamma=0.999)
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    for param in model.params:
        model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)


def _input_shape(arg: Any, input_size: int) -> list[int]:
    if arg.model == "MLP":
        return [arg.batch_size, input_size]
    if arg.order == "NCHW":
        return [arg.batch_size, 3, input_size, input_size]
    return [arg.batch_size, input_size, input_size, 3]


def _write_pbtxt(model: Any, arg: Any) -> None:
    """The init net and the net as text protos (for benchmarks on other platforms)."""
    with open(f"{arg.model}_init_batch_{arg.batch_size}.pbtxt", "w") as fid:
        fid.write(str(model.param_init_net.Proto()))
    with open(f"{arg.model}.pbtxt", "w") as fid:
        fid.write(str(model.net.Proto()))


def Benchmark(model_gen: Any, arg: Any) -> Any:
    """Build ``model_gen``'s model (random ``data`` and ``label`` in its init net; forward
    only or with gradients and an SGD update), run the init net and time the net with
    ``BenchmarkNet``; returns what BenchmarkNet returns (milliseconds per run)."""
    model, input_size = model_gen(arg.order, arg.cudnn_ws)
    model.Proto().type = arg.net_type
    model.Proto().num_workers = arg.num_workers
    model.param_init_net.GaussianFill([], "data", shape=_input_shape(arg, input_size),
                                      mean=0.0, std=1.0)
    model.param_init_net.UniformIntFill([], "label", shape=[arg.batch_size], min=0, max=999)
    if arg.forward_only:
        print(f"{arg.model}: running forward only.")
    else:
        print(f"{arg.model}: running forward-backward.")
        model.AddGradientOperators(["loss"])
        AddParameterUpdate(model)
        if arg.order == "NHWC":
            print("==WARNING==\nNHWC order with CuDNN may not be supported yet, so I might\n"
                  "exit suddenly.")
    if not arg.cpu:
        model.param_init_net.RunAllOnGPU()
        model.net.RunAllOnGPU()
    if arg.engine:
        for op in model.net.Proto().op:
            op.engine = arg.engine
    if arg.dump_model:
        _write_pbtxt(model, arg)
    ws_api.RunNetOnce(model.param_init_net)
    ws_api.CreateNet(model.net)
    return ws_api.BenchmarkNet(model.net.Proto().name, arg.warmup_iterations, arg.iterations,
                               arg.layer_wise_benchmark)


def GetArgumentParser() -> argparse.ArgumentParser:
    """The benchmark's command-line flags (Caffe2's names and defaults)."""
    parser = argparse.ArgumentParser(description="Caffe2 benchmark.")
    add = parser.add_argument
    add("--batch_size", type=int, default=128, help="The batch size.")
    add("--model", type=str, help="The model to benchmark.")
    add("--order", type=str, default="NCHW", help="The order to evaluate.")
    add("--cudnn_ws", type=int, help="The cudnn workspace size.")
    add("--iterations", type=int, default=10, help="Number of iterations to run the network.")
    add("--warmup_iterations", type=int, default=10,
        help="Number of warm-up iterations before benchmarking.")
    add("--forward_only", action="store_true", help="If set, only run the forward pass.")
    add("--layer_wise_benchmark", action="store_true",
        help="If True, run the layer-wise benchmark as well.")
    add("--cpu", action="store_true", help="If True, run testing on CPU instead of GPU.")
    add("--engine", type=str, default="",
        help="If set, blindly prefer the given engine(s) for every op.")
    add("--dump_model", action="store_true", help="If True, dump the model prototxts to disk.")
    add("--net_type", type=str, default="dag")
    add("--num_workers", type=int, default=2)
    add("--use-nvtx", default=False, action="store_true")
    add("--htrace_span_log_path", type=str)
    return parser


MODELS = {"AlexNet": AlexNet, "OverFeat": OverFeat, "VGGA": VGGA, "Inception": Inception,
          "MLP": MLP}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dpgraph.convnet_benchmarks --model AlexNet ...``."""
    args, extra_args = GetArgumentParser().parse_known_args(argv)
    if not args.batch_size or not args.model or not args.order:
        GetArgumentParser().print_help()
        return
    flags = ["caffe2", "--caffe2_log_level=0", *extra_args]
    if args.use_nvtx:
        flags.append("--caffe2_use_nvtx")
    if args.htrace_span_log_path:
        flags.append("--caffe2_htrace_span_log_path=" + args.htrace_span_log_path)
    ws_api.GlobalInit(flags)
    Benchmark(MODELS[args.model], args)
