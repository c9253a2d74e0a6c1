"""Optimizer graph structure: blob names, iteration counter, clipping, lr injection."""

from __future__ import annotations

from typing import Any

import pytest

from dpgraph import brew, core, optimizer
from dpgraph.errors import ModelConfigError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.model_helper import ModelHelper
from dpgraph.modeling import PseudoFP16Initializer
from dpgraph.proto import caffe2_pb2

CUDA = caffe2_pb2.PROTO_CUDA


def _model(name: str = "opt") -> ModelHelper:
    model = ModelHelper(name=name)
    hidden = brew.fc(model, "data", "fc1", dim_in=4, dim_out=3)
    pred = brew.fc(model, hidden, "fc2", dim_in=3, dim_out=1)
    dist = model.net.SquaredL2Distance([pred, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    return model


def _ops(net: core.Net, op_type: str) -> list[caffe2_pb2.OperatorDef]:
    return [op for op in net.Proto().op if op.type == op_type]


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, Any]:
    return arguments_dict(op.arg)


def _next_instance(cls_name: str) -> int:
    return optimizer._optimizer_instance_count[cls_name]


def test_instance_counters_are_per_class() -> None:
    sgd_next, adam_next = _next_instance("SgdOptimizer"), _next_instance("AdamOptimizer")
    first, second = optimizer.SgdOptimizer(), optimizer.SgdOptimizer()
    adam = optimizer.AdamOptimizer()
    assert (first._instance_num, second._instance_num) == (sgd_next, sgd_next + 1)
    assert adam._instance_num == adam_next
    assert first.get_cpu_blob_name("lr") == f"SgdOptimizer_{sgd_next}_lr_cpu"
    assert first.get_gpu_blob_name("lr", 3, "") == f"SgdOptimizer_{sgd_next}_lr_gpu3"
    with core.DeviceScope(core.DeviceOption(CUDA, 2)):
        assert first.make_unique_blob_name("lr") == f"SgdOptimizer_{sgd_next}_lr_gpu2"
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.PROTO_CPU, 0, node_name="n1")):
        assert first.make_unique_blob_name("lr") == f"SgdOptimizer_{sgd_next}_lrn1_cpu"
    optimizer.reset_optimizer_instance_count("SgdOptimizer")
    assert optimizer.SgdOptimizer()._instance_num == 0
    optimizer.reset_optimizer_instance_count()
    assert optimizer.AdamOptimizer()._instance_num == 0


def test_sgd_no_momentum_graph() -> None:
    model = _model()
    k = _next_instance("SgdOptimizer")
    opt = optimizer.build_sgd(model, 0.1)
    assert isinstance(opt, optimizer.SgdOptimizer) and opt._instance_num == k
    init = model.param_init_net
    iteration = [op for op in _ops(init, "ConstantFill")
                 if list(op.output) == ["optimizer_iteration"]][0]
    assert list(init.Proto().op).index(iteration) == 4, "after the 4 param fills"
    assert _args(iteration) == {"shape": [1], "value": 0, "dtype": caffe2_pb2.TensorProto.INT64}
    assert iteration.device_option.device_type == caffe2_pb2.PROTO_CPU
    assert list(_ops(init, "CreateMutex")[0].output) == ["iteration_mutex"]
    atomic = _ops(model.net, "AtomicIter")
    assert len(atomic) == 1
    assert list(atomic[0].input) == ["iteration_mutex", "optimizer_iteration"]
    assert list(atomic[0].output) == ["optimizer_iteration"]
    lr_ops = _ops(model.net, "LearningRate")
    assert len(lr_ops) == 1, "the CPU lr blob is shared by all params"
    assert list(lr_ops[0].output) == [f"SgdOptimizer_{k}_lr_cpu"]
    assert _args(lr_ops[0]) == {"base_lr": pytest.approx(-0.1), "policy": "fixed"}
    ones = [op for op in _ops(init, "ConstantFill") if op.output[0].startswith("ONE")]
    assert {op.output[0] for op in ones} == {"ONE_0_0"}
    updates = _ops(model.net, "WeightedSum")
    assert [list(op.input) for op in updates] == [
        [p, "ONE_0_0", p + "_grad", f"SgdOptimizer_{k}_lr_cpu"]
        for p in ("fc1_w", "fc1_b", "fc2_w", "fc2_b")]
    aux = opt.get_auxiliary_parameters()
    assert aux.local == [] and {str(b) for b in aux.shared} == {"ONE_0_0"}


def test_sgd_momentum_graph() -> None:
    model = _model()
    k = _next_instance("SgdOptimizer")
    opt = optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=0, policy="step",
                              stepsize=10, gamma=0.5)
    lr = _ops(model.net, "LearningRate")[0]
    assert _args(lr) == {"base_lr": pytest.approx(0.1), "policy": "step", "stepsize": 10,
                         "gamma": pytest.approx(0.5)}
    momenta = [op for op in _ops(model.param_init_net, "ConstantFill")
               if op.output[0].endswith("_momentum")]
    assert [(list(op.input), op.output[0]) for op in momenta] == [
        ([p], p + "_momentum") for p in ("fc1_w", "fc1_b", "fc2_w", "fc2_b")]
    update = _ops(model.net, "MomentumSGDUpdate")[0]
    assert list(update.input) == ["fc1_w_grad", "fc1_w_momentum", f"SgdOptimizer_{k}_lr_cpu",
                                  "fc1_w"]
    assert list(update.output) == ["fc1_w_grad", "fc1_w_momentum", "fc1_w"]
    assert _args(update) == {"momentum": pytest.approx(0.9), "nesterov": 0}
    assert [str(b) for b in opt.get_auxiliary_parameters().local][:1] == ["fc1_w_momentum"]


def test_per_device_lr_and_one_blobs() -> None:
    model = ModelHelper(name="two_gpus")
    losses = []
    for gpu in (0, 1):
        with core.DeviceScope(core.DeviceOption(CUDA, gpu)), core.NameScope(f"gpu_{gpu}"):
            pred = brew.fc(model, "data", "fc", 3, 1)
            losses.append(model.net.AveragedLoss(pred, "loss"))
    model.AddGradientOperators(losses)
    k = _next_instance("SgdOptimizer")
    optimizer.build_sgd(model, 0.1)
    lrs = [op.output[0] for op in _ops(model.net, "LearningRate")]
    assert lrs == [f"SgdOptimizer_{k}_lr_gpu0", f"SgdOptimizer_{k}_lr_gpu1"]
    for op in _ops(model.net, "LearningRate"):
        assert op.device_option.device_type == CUDA
    ones = {op.output[0] for op in _ops(model.param_init_net, "ConstantFill")
            if op.output[0].startswith("ONE")}
    assert ones == {f"ONE_{CUDA}_0", f"ONE_{CUDA}_1"}
    iteration = [op for op in model.param_init_net.Proto().op
                 if list(op.output) == ["optimizer_iteration"]]
    assert len(iteration) == 1 and iteration[0].device_option.device_type == 0


def test_norm_clipping_and_lr_injection_graph() -> None:
    model = _model()
    k = _next_instance("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, max_gradient_norm=1.0, allow_lr_injection=True)
    net_ops = [(op.type, list(op.input), list(op.output)) for op in model.net.Proto().op]
    prefix = "norm_clipped_grad_update/"
    for i, param in enumerate(("fc1_w", "fc1_b", "fc2_w", "fc2_b")):
        assert ("SumSqrElements", [param + "_grad"], [f"{prefix}grad_{i}_squared_sum"]) in net_ops
    ensure = [op for op in model.net.Proto().op if op.type == "EnsureCPUOutput"]
    assert [op.input[0] for op in ensure] == [f"{prefix}grad_{i}_squared_sum" for i in range(4)]
    total = _ops(model.net, "Sum")[-1]
    assert list(total.input) == [op.output[0] for op in ensure]
    assert list(total.output) == [prefix + "grad_squared_full_sum"]
    power = _ops(model.net, "Pow")[0]
    assert list(power.output) == [prefix + "global_norm"] and _args(power)["exponent"] == 0.5
    clip = [op for op in model.param_init_net.Proto().op if op.output[0] == prefix + "clip_norm"]
    assert _args(clip[0]) == {"shape": [], "value": 1.0}
    assert ("Max", [prefix + "global_norm", prefix + "clip_norm"], [prefix + "max_norm"]) \
        in net_ops
    assert ("Div", [prefix + "clip_norm", prefix + "max_norm"], [prefix + "norm_ratio"]) \
        in net_ops
    injection = [op for op in model.param_init_net.Proto().op if op.output[0] == "lr_injection"]
    assert _args(injection[0]) == {"shape": [1], "value": 1.0}
    mul = [op for op in model.net.Proto().op if list(op.output) == ["lr_multiplier"]]
    assert list(mul[0].input) == [prefix + "norm_ratio", "lr_injection"]
    assert _args(mul[0]) == {"broadcast": 1}
    copy = _ops(model.net, "CopyFromCPUInput")[0]
    assert list(copy.input) == ["lr_multiplier"]
    assert list(copy.output) == [f"SgdOptimizer_{k}_lr_multiplier_cpu"]
    scaled = [op for op in _ops(model.net, "Mul") if op.output[0].endswith("scaled_lr_cpu")][0]
    assert list(scaled.input) == [f"SgdOptimizer_{k}_lr_cpu", f"SgdOptimizer_{k}_lr_multiplier_cpu"]
    assert list(scaled.output) == [f"SgdOptimizer_{k}_scaled_lr_cpu"]
    update = _ops(model.net, "WeightedSum")[0]
    assert update.input[3] == f"SgdOptimizer_{k}_scaled_lr_cpu"


def test_lr_injection_without_clipping() -> None:
    model = _model()
    k = _next_instance("AdagradOptimizer")
    optimizer.build_adagrad(model, 0.1, allow_lr_injection=True)
    copy = _ops(model.net, "CopyFromCPUInput")[0]
    assert list(copy.input) == ["lr_injection"]
    assert list(copy.output) == [f"AdagradOptimizer_{k}_lr_multiplier_cpu"]


def test_adagrad_and_adam_graphs() -> None:
    model = _model()
    k = _next_instance("AdagradOptimizer")
    opt = optimizer.build_adagrad(model, 0.05, epsilon=1e-6)
    assert isinstance(opt, optimizer.AdagradOptimizer)
    update = _ops(model.net, "Adagrad")[0]
    assert list(update.input) == ["fc1_w", "fc1_w_squared_sum", "fc1_w_grad",
                                  f"AdagradOptimizer_{k}_lr_cpu"]
    assert list(update.output) == ["fc1_w", "fc1_w_squared_sum"]
    assert _args(update) == {"epsilon": pytest.approx(1e-6), "decay": 1.0}
    assert update.engine == ""
    assert _args(_ops(model.net, "LearningRate")[0])["base_lr"] == pytest.approx(-0.05)
    model = _model()
    k = _next_instance("AdamOptimizer")
    opt = optimizer.build_adam(model, 0.01)
    update = _ops(model.net, "Adam")[0]
    assert list(update.input) == ["fc1_w", "fc1_w_first_moment", "fc1_w_second_moment",
                                  "fc1_w_grad", f"AdamOptimizer_{k}_lr_cpu",
                                  "optimizer_iteration"]
    assert list(update.output) == ["fc1_w", "fc1_w_first_moment", "fc1_w_second_moment"]
    assert set(_args(update)) == {"beta1", "beta2", "epsilon"}
    assert {str(b) for b in opt.get_auxiliary_parameters().shared} == {"optimizer_iteration"}


def test_sparse_updates() -> None:
    net, init = core.Net("sparse"), core.Net("sparse_init")
    init.XavierFill([], "emb", shape=[10, 4])
    grad = core.GradientSlice(indices=core.BlobReference("idx"),
                              values=core.BlobReference("vals"))
    k = _next_instance("SgdOptimizer")
    optimizer.SgdOptimizer(0.1)(net, init, core.BlobReference("emb"), grad)
    scatter = _ops(net, "ScatterWeightedSum")[0]
    assert list(scatter.input) == ["emb", "ONE_0_0", "idx", "vals", f"SgdOptimizer_{k}_lr_cpu"]
    optimizer.SgdOptimizer(0.1, momentum=0.5)(net, init, "emb", grad)
    sparse = _ops(net, "SparseMomentumSGDUpdate")[0]
    assert list(sparse.input)[:2] == ["vals", "emb_momentum"] and sparse.input[4] == "idx"
    optimizer.AdagradOptimizer(rowWise=True)(net, init, "emb", grad)
    rowwise = [op for op in init.Proto().op if op.output[0] == "emb_avg_squared_sum"][0]
    assert _args(rowwise)["shape"] == [10]
    assert _ops(net, "RowWiseSparseAdagrad")[0].input[1] == "emb_avg_squared_sum"
    optimizer.AdamOptimizer()(net, init, "emb", grad)
    assert list(_ops(net, "SparseAdam")[0].input)[3:5] == ["idx", "vals"]
    with pytest.raises(ModelConfigError):
        optimizer.AdagradOptimizer(rowWise=True)(net, init, "emb", core.BlobReference("g"))


def test_weight_decay_and_misuse() -> None:
    model = _model()
    optimizer.add_weight_decay(model, 1e-4)
    decays = _ops(model.net, "WeightedSum")
    assert [list(op.input) for op in decays] == [
        [p + "_grad", "ONE_0_0", p, "wd_0_0"] for p in ("fc1_w", "fc2_w")]
    with pytest.raises(ModelConfigError):
        optimizer.build_sgd(_model(), -0.1)
    model = _model()
    optimizer.build_sgd(model, 0.0)
    assert not _ops(model.net, "WeightedSum")
    with pytest.raises(ModelConfigError, match="Lars offset"):
        optimizer.build_sgd(_model(), 0.1, lars=-1.0)
    with pytest.raises(NotImplementedError):
        optimizer.Optimizer().scale_learning_rate(2.0)
    sgd = optimizer.SgdOptimizer(0.1)
    sgd.scale_learning_rate(0.5)
    assert sgd.base_learning_rate == pytest.approx(0.05)


def test_multi_precision_sgd_graph() -> None:
    model = ModelHelper(name="mp")
    brew.fc(model, "data", "fc", 2, 1, WeightInitializer=PseudoFP16Initializer,
            BiasInitializer=PseudoFP16Initializer)
    model.AddGradientOperators([model.net.AveragedLoss("fc", "loss")])
    k = _next_instance("MultiPrecisionSgdOptimizer")
    opt = optimizer.build_multi_precision_sgd(model, 0.1, momentum=0.9)
    assert isinstance(opt, optimizer.MultiPrecisionSgdOptimizer)
    types = [op.type for op in model.net.Proto().op][-6:]
    assert types == ["HalfToFloat", "MomentumSGDUpdate", "FloatToHalf"] * 2
    update = _ops(model.net, "MomentumSGDUpdate")[0]
    assert list(update.input) == ["fc_w_grad_fp32", "fc_w_momentum",
                                  f"MultiPrecisionSgdOptimizer_{k}_lr_cpu", "fc_w_fp32"]
    momentum = [op for op in model.param_init_net.Proto().op
                if op.output[0] == "fc_w_momentum"][0]
    assert list(momentum.input) == ["fc_w_fp32"]
    assert list(_ops(model.net, "FloatToHalf")[0].output) == ["fc_w"]


def test_rms_prop_and_ftrl_graphs() -> None:
    model = _model()
    k = _next_instance("RmsPropOptimizer")
    opt = optimizer.build_rms_prop(model, 0.01)
    assert isinstance(opt, optimizer.RmsPropOptimizer)
    rms = _ops(model.net, "RmsProp")[0]
    assert list(rms.input) == ["fc1_w_grad", "fc1_w_mean_squares", "fc1_w_momentum", "ONE_0_0"]
    assert list(rms.output) == ["fc1_w_grad_o", "fc1_w_mean_squares", "fc1_w_momentum"]
    update = _ops(model.net, "MomentumSGDUpdate")[0]
    assert list(update.input) == ["fc1_w_grad_o", "fc1_w_momentum",
                                  f"RmsPropOptimizer_{k}_lr_cpu", "fc1_w"]
    model = _model()
    opt = optimizer.build_ftrl(model, alpha=0.1)
    ftrl = _ops(model.net, "Ftrl")[0]
    assert list(ftrl.input) == ["fc1_w", "fc1_w_ftrl_nz", "fc1_w_grad"]
    assert ftrl.engine == "SIMD" and _args(ftrl)["alpha"] == pytest.approx(0.1)
    nz = [op for op in model.param_init_net.Proto().op if op.output[0] == "fc1_w_ftrl_nz"][0]
    assert _args(nz)["extra_shape"] == [2]
