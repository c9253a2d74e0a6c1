"""Spec conformance: caffe2-api-facts §8 (optimizer.py), behaviour-facts §7 (optimizer)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from _workspace import clean_workspace  # noqa: F401  (autouse)

from dpgraph import brew, cnn, core, model_helper, optimizer, utils, workspace
from dpgraph.ir.arguments import arguments_dict
from dpgraph.proto import caffe2_pb2

ModelHelper = model_helper.ModelHelper
CPU, CUDA = caffe2_pb2.PROTO_CPU, caffe2_pb2.PROTO_CUDA
INT64 = caffe2_pb2.TensorProto.INT64


def _ops(net: Any, op_type: str) -> list[caffe2_pb2.OperatorDef]:
    return [op for op in net.Proto().op if op.type == op_type]


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, Any]:
    return arguments_dict(op.arg)


def _producer(net: Any, blob: str) -> caffe2_pb2.OperatorDef:
    found = [op for op in net.Proto().op if blob in op.output]
    assert len(found) == 1, f"{blob} produced {len(found)} times"
    return found[0]


def _same_fills(net: Any, blob: str) -> caffe2_pb2.OperatorDef:
    """Caffe2 re-adds ONE/wd fills and lr-multiplier copies per param: all identical."""
    found = [op for op in net.Proto().op if blob in op.output]
    assert found and all(op == found[0] for op in found)
    return found[0]


def _model(name: str = "opt", prefix: str = "") -> ModelHelper:
    model = ModelHelper(name=name)
    with core.NameScope(prefix or None):
        hidden = brew.fc(model, "data", "fc1", dim_in=4, dim_out=3)
        pred = brew.fc(model, hidden, "fc2", dim_in=3, dim_out=1)
        dist = model.net.SquaredL2Distance([pred, "label"], "dist")
        loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    return model


def _next(cls_name: str) -> int:
    return optimizer._optimizer_instance_count[cls_name]


def _feed(prefix: str = "", device: Any = None) -> None:
    rng = np.random.default_rng(0)
    workspace.FeedBlob(prefix + "data", rng.standard_normal((5, 4)).astype(np.float32),
                       device_option=device)
    workspace.FeedBlob(prefix + "label", rng.standard_normal((5, 1)).astype(np.float32),
                       device_option=device)


# --- constants ---------------------------------------------------------------------------
def test_constants() -> None:
    assert utils.OPTIMIZER_ITERATION_NAME == "optimizer_iteration"
    assert utils.ITERATION_MUTEX_NAME == "iteration_mutex"
    assert optimizer._LEARNING_RATE_INJECTION == "lr_injection"
    assert optimizer.AuxOptimizerParams._fields == ("local", "shared")


def test_builder_signatures() -> None:
    def params(fn: Any) -> dict[str, Any]:
        return {n: p.default for n, p in inspect.signature(fn).parameters.items()}

    for fn in (optimizer.build_sgd, optimizer.build_multi_precision_sgd, optimizer.build_adam):
        got = params(fn)
        assert list(got)[:4] == ["model", "base_learning_rate", "max_gradient_norm",
                                 "allow_lr_injection"]
        assert got["max_gradient_norm"] is None and got["allow_lr_injection"] is False
    got = params(optimizer.build_adagrad)
    assert list(got)[:5] == ["model", "base_learning_rate", "parameters", "max_gradient_norm",
                             "allow_lr_injection"]
    assert list(params(optimizer.build_fp16_sgd))[:2] == ["model", "base_learning_rate"]
    assert list(params(optimizer.add_weight_decay)) == ["model", "weight_decay"]
    sgd = params(optimizer.SgdOptimizer)
    assert (sgd["base_learning_rate"], sgd["policy"], sgd["momentum"]) == (0.01, "fixed", 0.0)
    assert sgd["nesterov"] is True  # [late] default (2018: 1)
    assert sgd["sparse_dedup_aggregator"] is None and sgd["lars"] is None
    mp = params(optimizer.MultiPrecisionSgdOptimizer)
    assert (mp["base_learning_rate"], mp["momentum"], mp["policy"]) == (0.1, 0.0, "fixed")
    assert mp["nesterov"] is True
    assert callable(optimizer.build_yellowfin) and callable(optimizer.build_rms_prop)
    assert callable(optimizer.build_ftrl)
    ada = params(optimizer.AdagradOptimizer)
    assert (ada["alpha"], ada["epsilon"], ada["decay"], ada["policy"]) == (
        0.01, 1e-4, 1, "fixed")
    assert ada["rowWise"] is False and ada["engine"] == ""
    adam = params(optimizer.AdamOptimizer)
    assert (adam["alpha"], adam["beta1"], adam["beta2"], adam["epsilon"]) == (
        0.001, 0.9, 0.999, 1e-8)
    assert adam["policy"] == "fixed" and adam["rowWise"] is False


# --- names -------------------------------------------------------------------------------
def test_blob_name_forms() -> None:
    k = _next("SgdOptimizer")
    sgd = optimizer.SgdOptimizer()
    assert sgd.get_cpu_blob_name("lr") == f"SgdOptimizer_{k}_lr_cpu"
    assert sgd.get_cpu_blob_name("lr", "n") == f"SgdOptimizer_{k}_lrn_cpu"
    assert sgd.get_gpu_blob_name("lr", 3, "") == f"SgdOptimizer_{k}_lr_gpu3"
    assert sgd.make_unique_blob_name("lr") == f"SgdOptimizer_{k}_lr_cpu"
    with core.DeviceScope(core.DeviceOption(CUDA, 1)):
        assert sgd.make_unique_blob_name("lr") == f"SgdOptimizer_{k}_lr_gpu1"
    assert optimizer.SgdOptimizer()._instance_num == k + 1


def test_iteration_counter_created_once_on_cpu() -> None:
    model = _model()
    optimizer.build_sgd(model, 0.1)
    optimizer.build_sgd(model, 0.1)
    init = _producer(model.param_init_net, "optimizer_iteration")
    assert init.type == "ConstantFill" and list(init.input) == []
    args = _args(init)
    assert list(args["shape"]) == [1] and args["value"] == 0 and args["dtype"] == INT64
    assert init.device_option.device_type == CPU
    mutex = _producer(model.param_init_net, "iteration_mutex")
    assert mutex.type == "CreateMutex" and list(mutex.input) == []
    atomic = _ops(model.net, "AtomicIter")
    assert len(atomic) == 1
    assert list(atomic[0].input) == ["iteration_mutex", "optimizer_iteration"]
    assert list(atomic[0].output) == ["optimizer_iteration"]
    assert atomic[0].device_option.device_type == CPU


def test_build_unique_mutex_iter_util() -> None:
    init, net = core.Net("i"), core.Net("n")
    it = utils.BuildUniqueMutexIter(init, net, iter_val=5)
    assert str(it) == "optimizer_iteration"
    assert _args(_producer(init, "optimizer_iteration"))["value"] == 5
    assert str(utils.BuildUniqueMutexIter(init, net)) == "optimizer_iteration"
    assert len(_ops(net, "AtomicIter")) == 1


# --- SGD ---------------------------------------------------------------------------------
def test_sgd_no_momentum_graph_and_sign() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    returned = optimizer.build_sgd(model, 0.1, policy="step", stepsize=10, gamma=0.5)
    assert isinstance(returned, optimizer.SgdOptimizer)
    lr_ops = _ops(model.net, "LearningRate")
    assert len(lr_ops) == 1
    lr = lr_ops[0]
    assert list(lr.input) == ["optimizer_iteration"]
    assert list(lr.output) == [f"SgdOptimizer_{k}_lr_cpu"]
    args = _args(lr)
    assert args["base_lr"] == pytest.approx(-0.1)
    assert args["policy"] == "step" and args["stepsize"] == 10
    assert args["gamma"] == pytest.approx(0.5)
    one = _same_fills(model.param_init_net, "ONE_0_0")
    assert one.type == "ConstantFill" and list(one.input) == []
    assert _args(one)["value"] == pytest.approx(1.0) and list(_args(one)["shape"]) == [1]
    ws = _ops(model.net, "WeightedSum")
    assert [list(op.input) for op in ws] == [
        [p, "ONE_0_0", p + "_grad", f"SgdOptimizer_{k}_lr_cpu"]
        for p in ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]]
    assert [list(op.output) for op in ws] == [[p] for p in ["fc1_w", "fc1_b", "fc2_w",
                                                            "fc2_b"]]
    assert not _ops(model.net, "MomentumSGDUpdate")


def test_sgd_momentum_graph() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, momentum=0.9, nesterov=0)
    lr = _ops(model.net, "LearningRate")[0]
    assert _args(lr)["base_lr"] == pytest.approx(0.1)
    mom = _producer(model.param_init_net, "fc1_w_momentum")
    assert mom.type == "ConstantFill" and list(mom.input) == ["fc1_w"]
    assert _args(mom)["value"] == 0
    upd = _ops(model.net, "MomentumSGDUpdate")
    assert len(upd) == 4
    assert list(upd[0].input) == ["fc1_w_grad", "fc1_w_momentum", f"SgdOptimizer_{k}_lr_cpu",
                                  "fc1_w"]
    assert list(upd[0].output) == ["fc1_w_grad", "fc1_w_momentum", "fc1_w"]
    assert _args(upd[0])["momentum"] == pytest.approx(0.9)
    assert _args(upd[0])["nesterov"] == 0
    assert not _ops(model.net, "WeightedSum")


def test_sgd_zero_lr_noop_and_negative_asserts() -> None:
    model = _model()
    n_ops = len(model.net.Proto().op)
    optimizer.build_sgd(model, 0.0)
    assert len(model.net.Proto().op) == n_ops
    with pytest.raises(AssertionError):
        optimizer.build_sgd(_model(), -0.1)


def test_sgd_aux_params() -> None:
    model = _model()
    opt = optimizer.build_sgd(model, 0.1, momentum=0.9)
    aux = opt.get_auxiliary_parameters()
    assert sorted(str(b) for b in aux.local) == sorted(
        p + "_momentum" for p in ["fc1_w", "fc1_b", "fc2_w", "fc2_b"])
    assert {str(b) for b in aux.shared} == {"ONE_0_0"}


def test_sgd_runs_and_learns() -> None:
    model = _model()
    optimizer.build_sgd(model, 0.05)
    _feed()
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    before = float(np.asarray(workspace.FetchBlob("loss") if workspace.HasBlob("loss")
                              else np.inf))
    w0 = workspace.FetchBlob("fc2_w").copy()
    workspace.RunNet(model.net.Proto().name)
    first = float(workspace.FetchBlob("loss"))
    grad = workspace.FetchBlob("fc2_w_grad")
    np.testing.assert_allclose(workspace.FetchBlob("fc2_w"), w0 - 0.05 * grad, rtol=1e-5,
                               atol=1e-6)
    for _ in range(20):
        workspace.RunNet(model.net.Proto().name)
    assert float(workspace.FetchBlob("loss")) < first <= before
    assert workspace.FetchBlob("optimizer_iteration").tolist() == [21]
    assert workspace.FetchBlob("optimizer_iteration").dtype == np.int64


def test_per_gpu_lr_and_one_blobs_with_virtual_gpus() -> None:
    workspace.SetVirtualGpus(2)
    model = ModelHelper(name="gpus")
    losses = []
    for gpu in range(2):
        with core.DeviceScope(core.DeviceOption(CUDA, gpu)), core.NameScope(f"gpu_{gpu}"):
            pred = brew.fc(model, "data", "fc", dim_in=4, dim_out=1)
            dist = model.net.SquaredL2Distance([pred, "label"], "dist")
            loss = model.net.AveragedLoss(dist, "loss")
            losses.append((loss, model.net.ConstantFill(loss, "loss_g", value=1.0)))
    model.AddGradientOperators(dict(losses))
    k = _next("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, momentum=0.9)
    lr_out = sorted(op.output[0] for op in _ops(model.net, "LearningRate"))
    assert lr_out == [f"SgdOptimizer_{k}_lr_gpu0", f"SgdOptimizer_{k}_lr_gpu1"]
    for gpu in range(2):
        one = _same_fills(model.param_init_net, f"ONE_{CUDA}_{gpu}")
        assert one.device_option.device_type == CUDA and one.device_option.device_id == gpu
        lr = _producer(model.net, f"SgdOptimizer_{k}_lr_gpu{gpu}")
        assert lr.device_option.device_id == gpu
        assert lr.device_option.device_type == CUDA
    assert {op.input[0] for op in _ops(model.net, "MomentumSGDUpdate")} == {
        f"gpu_{g}/fc_{s}_grad" for g in range(2) for s in "wb"}
    for gpu in range(2):
        _feed(f"gpu_{gpu}/", core.DeviceOption(CUDA, gpu))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    lr0 = workspace.FetchBlob(f"SgdOptimizer_{k}_lr_gpu0")
    np.testing.assert_allclose(lr0, [0.1], rtol=1e-6)


def test_sparse_sgd_ops() -> None:
    for momentum, op_type in [(0.0, "ScatterWeightedSum"), (0.9, "SparseMomentumSGDUpdate")]:
        model = ModelHelper(name="sparse")
        emb = model.param_init_net.UniformFill([], "emb", shape=[10, 3])
        model.AddParameter(emb)
        rows = model.net.Gather([emb, "idx"], "rows")
        loss = model.net.AveragedLoss(model.net.SumElements(rows, "s"), "loss")
        model.AddGradientOperators([loss])
        k = _next("SgdOptimizer")
        optimizer.build_sgd(model, 0.1, momentum=momentum)
        op = _ops(model.net, op_type)[0]
        lr = f"SgdOptimizer_{k}_lr_cpu"
        if momentum:
            assert list(op.input)[1:4] == ["emb_momentum", lr, "emb"]
            assert op.input[4] == "idx"
            assert list(op.output) == [op.input[0], "emb_momentum", "emb"]
        else:
            assert list(op.input) == ["emb", "ONE_0_0", op.input[2], op.input[3], lr]
            assert list(op.output) == ["emb"]
        workspace.ResetWorkspace()
        workspace.FeedBlob("idx", np.array([1, 3, 1], dtype=np.int64))
        workspace.RunNetOnce(model.param_init_net)
        before = workspace.FetchBlob("emb").copy()
        workspace.RunNetOnce(model.net)
        after = workspace.FetchBlob("emb")
        changed = np.where(np.any(after != before, axis=1))[0].tolist()
        assert changed == [1, 3]


# --- clipping and injection --------------------------------------------------------------
def test_norm_clipping_and_lr_injection_graph() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, max_gradient_norm=1.0, allow_lr_injection=True)
    scope_ = "norm_clipped_grad_update/"
    for i in range(4):
        op = _producer(model.net, f"{scope_}grad_{i}_squared_sum")
        assert op.type == "SumSqrElements"
    ensure = _ops(model.net, "EnsureCPUOutput")
    assert len(ensure) == 4
    total = _producer(model.net, scope_ + "grad_squared_full_sum")
    assert total.type == "Sum" and list(total.input) == [op.output[0] for op in ensure]
    norm = _producer(model.net, scope_ + "global_norm")
    assert norm.type == "Pow" and _args(norm)["exponent"] == pytest.approx(0.5)
    clip = _producer(model.param_init_net, scope_ + "clip_norm")
    assert clip.type == "ConstantFill" and list(_args(clip)["shape"]) == []
    assert _args(clip)["value"] == pytest.approx(1.0)
    mx = _producer(model.net, scope_ + "max_norm")
    assert mx.type == "Max" and list(mx.input) == [scope_ + "global_norm", scope_ + "clip_norm"]
    ratio = _producer(model.net, scope_ + "norm_ratio")
    assert ratio.type == "Div" and list(ratio.input) == [scope_ + "clip_norm",
                                                         scope_ + "max_norm"]
    inj = _producer(model.param_init_net, "lr_injection")
    assert inj.type == "ConstantFill" and _args(inj)["value"] == pytest.approx(1.0)
    assert list(_args(inj)["shape"]) == [1]
    mult = _producer(model.net, "lr_multiplier")
    assert mult.type == "Mul" and list(mult.input) == [scope_ + "norm_ratio", "lr_injection"]
    assert _args(mult)["broadcast"] == 1
    copy = _same_fills(model.net, f"SgdOptimizer_{k}_lr_multiplier_cpu")
    assert copy.type == "CopyFromCPUInput" and list(copy.input) == ["lr_multiplier"]
    scaled = _same_fills(model.net, f"SgdOptimizer_{k}_scaled_lr_cpu")
    assert scaled.type == "Mul" and _args(scaled)["broadcast"] == 1
    assert list(scaled.input) == [f"SgdOptimizer_{k}_lr_cpu",
                                  f"SgdOptimizer_{k}_lr_multiplier_cpu"]
    ws = _ops(model.net, "WeightedSum")
    assert all(op.input[3] == f"SgdOptimizer_{k}_scaled_lr_cpu" for op in ws)


def test_norm_clipping_numerics_and_injection_value() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, max_gradient_norm=0.01, allow_lr_injection=True)
    _feed()
    workspace.RunNetOnce(model.param_init_net)
    optimizer.set_lr_injection(0.5)
    assert optimizer.get_lr_injection().tolist() == [0.5]
    workspace.RunNetOnce(model.net)
    grads = [workspace.FetchBlob(p + "_grad") for p in ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]]
    norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
    assert float(workspace.FetchBlob("norm_clipped_grad_update/global_norm")) == (
        pytest.approx(norm, rel=1e-4))
    ratio = 0.01 / max(norm, 0.01)
    assert float(workspace.FetchBlob("norm_clipped_grad_update/norm_ratio")) == (
        pytest.approx(ratio, rel=1e-4))
    scaled = workspace.FetchBlob(f"SgdOptimizer_{k}_scaled_lr_cpu")
    np.testing.assert_allclose(scaled, [-0.1 * ratio * 0.5], rtol=1e-4)


def test_lr_injection_alone_is_the_multiplier() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    optimizer.build_sgd(model, 0.1, allow_lr_injection=True)
    copy = _same_fills(model.net, f"SgdOptimizer_{k}_lr_multiplier_cpu")
    assert list(copy.input) == ["lr_injection"]
    assert not [op for op in model.net.Proto().op if "lr_multiplier" in op.output]


# --- other optimizers --------------------------------------------------------------------
def test_adagrad_graph() -> None:
    model = _model()
    k = _next("AdagradOptimizer")
    optimizer.build_adagrad(model, 0.2, epsilon=1e-3)
    lr = _producer(model.net, f"AdagradOptimizer_{k}_lr_cpu")
    assert _args(lr)["base_lr"] == pytest.approx(-0.2)
    ss = _producer(model.param_init_net, "fc1_w_squared_sum")
    assert ss.type == "ConstantFill" and list(ss.input) == ["fc1_w"]
    op = _ops(model.net, "Adagrad")[0]
    assert list(op.input) == ["fc1_w", "fc1_w_squared_sum", "fc1_w_grad",
                              f"AdagradOptimizer_{k}_lr_cpu"]
    assert list(op.output) == ["fc1_w", "fc1_w_squared_sum"]
    assert _args(op)["epsilon"] == pytest.approx(1e-3)
    assert _args(op)["decay"] == pytest.approx(1.0)


def test_adam_graph() -> None:
    model = _model()
    k = _next("AdamOptimizer")
    opt = optimizer.build_adam(model, 0.01)
    lr = f"AdamOptimizer_{k}_lr_cpu"
    op = _ops(model.net, "Adam")[0]
    assert list(op.input) == ["fc1_w", "fc1_w_first_moment", "fc1_w_second_moment",
                              "fc1_w_grad", lr, "optimizer_iteration"]
    assert list(op.output) == ["fc1_w", "fc1_w_first_moment", "fc1_w_second_moment"]
    args = _args(op)
    assert (args["beta1"], args["beta2"]) == (pytest.approx(0.9), pytest.approx(0.999))
    assert args["epsilon"] == pytest.approx(1e-8)
    assert "optimizer_iteration" in {str(b) for b in opt.get_auxiliary_parameters().shared}


def test_weight_decay_builder_names() -> None:
    model = _model()
    optimizer.add_weight_decay(model, 1e-4)
    assert _args(_same_fills(model.param_init_net, "wd_0_0"))["value"] == pytest.approx(1e-4)
    assert _same_fills(model.param_init_net, "ONE_0_0").type == "ConstantFill"
    ws = _ops(model.net, "WeightedSum")
    assert [list(op.input) for op in ws] == [
        [w + "_grad", "ONE_0_0", w, "wd_0_0"] for w in ["fc1_w", "fc2_w"]]
    assert [list(op.output) for op in ws] == [[w + "_grad"] for w in ["fc1_w", "fc2_w"]]


def test_multi_precision_without_fp32_copy_falls_back_to_sgd() -> None:
    model = _model()
    k = _next("MultiPrecisionSgdOptimizer")
    optimizer.build_multi_precision_sgd(model, 0.1)
    lr = _producer(model.net, f"MultiPrecisionSgdOptimizer_{k}_lr_cpu")
    assert _args(lr)["base_lr"] == pytest.approx(-0.1)
    assert len(_ops(model.net, "WeightedSum")) == 4


def test_param_own_optimizer_is_used() -> None:
    model = ModelHelper(name="m")
    with optimizer.UseOptimizer({"WEIGHT": optimizer.AdagradOptimizer(alpha=0.3)}):
        pred = brew.fc(model, "data", "fc", 4, 1)
    dist = model.net.SquaredL2Distance([pred, "label"], "dist")
    model.AddGradientOperators([model.net.AveragedLoss(dist, "loss")])
    optimizer.build_sgd(model, 0.1)
    assert [op.input[0] for op in _ops(model.net, "Adagrad")] == ["fc_w"]
    assert [op.output[0] for op in _ops(model.net, "WeightedSum")] == ["fc_b"]


def test_model_iter_counter() -> None:
    model = cnn.CNNModelHelper(name="m")
    with core.DeviceScope(core.DeviceOption(CPU, 0)), core.NameScope("cpu_0"):
        it = model.Iter("ITER")
    assert str(it) == "cpu_0/ITER"
    init = _producer(model.param_init_net, "cpu_0/ITER")
    assert init.type == "ConstantFill" and _args(init)["dtype"] == INT64
    assert init.device_option.device_type == CPU
    op = _ops(model.net, "Iter")[0]
    assert list(op.input) == ["cpu_0/ITER"] and list(op.output) == ["cpu_0/ITER"]


def _sparse_model() -> ModelHelper:
    model = ModelHelper(name="sparse")
    emb = model.param_init_net.UniformFill([], "emb", shape=[10, 3])
    model.AddParameter(emb, tags="WEIGHT")
    model.weights.append(emb)
    rows = model.net.Gather([emb, "idx"], "rows")
    model.AddGradientOperators([model.net.SumElements(rows, "loss")])
    return model


def test_sparse_unsupported_raise_like_caffe2() -> None:
    with pytest.raises(ValueError):  # WeightDecayBuilder raises ValueError
        optimizer.add_weight_decay(_sparse_model(), 0.1)
    for build, kwargs in [(optimizer.build_rms_prop, {}),
                          (optimizer.build_adagrad, {"decay": 0.5})]:
        with pytest.raises(AssertionError):  # Caffe2 asserts
            build(_sparse_model(), 0.1, **kwargs)


def test_sgd_momentum_nesterov_default_arg() -> None:
    model = _model()
    optimizer.build_sgd(model, 0.1, momentum=0.9)
    assert _args(_ops(model.net, "MomentumSGDUpdate")[0])["nesterov"] == 1


def test_active_name_scope_prefixes_optimizer_blobs() -> None:
    model = _model()
    k = _next("SgdOptimizer")
    with core.NameScope("ns"):
        optimizer.build_sgd(model, 0.1)
    outputs = {o for op in model.param_init_net.Proto().op for o in op.output}
    assert {"ns/optimizer_iteration", "ns/iteration_mutex", "ns/ONE_0_0"} <= outputs
    assert "optimizer_iteration" not in outputs
    lr = {op.output[0] for op in _ops(model.net, "LearningRate")}
    assert lr == {f"ns/SgdOptimizer_{k}_lr_cpu"}


def test_iteration_counter_is_cpu_under_gpu_scope() -> None:
    init, net = core.Net("i"), core.Net("n")
    with core.DeviceScope(core.DeviceOption(CUDA, 1)):
        utils.BuildUniqueMutexIter(init, net)
    for op in list(init.Proto().op) + list(net.Proto().op):
        assert op.device_option.device_type == CPU


def test_hip_scope_uses_gpu_names() -> None:
    sgd = optimizer.SgdOptimizer()
    k = sgd._instance_num
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.PROTO_HIP, 2)):
        assert sgd.make_unique_blob_name("lr") == f"SgdOptimizer_{k}_lr_gpu2"


def test_direct_call_with_param_and_grad_names() -> None:
    net, init = core.Net("direct"), core.Net("direct_init")
    init.XavierFill([], "w", shape=[2, 2])
    sgd = optimizer.SgdOptimizer(0.5, momentum=0.9)
    sgd(net, init, "w", "w_grad")
    upd = _ops(net, "MomentumSGDUpdate")[0]
    assert list(upd.input) == ["w_grad", "w_momentum", sgd.get_cpu_blob_name("lr"), "w"]


def test_multi_precision_sgd_with_fp32_copy() -> None:
    from dpgraph.modeling.initializers import PseudoFP16Initializer

    model = ModelHelper(name="mp")
    pred = brew.fc(model, "data", "fc", 4, 1, WeightInitializer=PseudoFP16Initializer,
                   BiasInitializer=PseudoFP16Initializer)
    model.AddGradientOperators([model.net.SumElements(pred, "loss")])
    k = _next("MultiPrecisionSgdOptimizer")
    optimizer.build_multi_precision_sgd(model, 0.1, momentum=0.9)
    lr = _producer(model.net, f"MultiPrecisionSgdOptimizer_{k}_lr_cpu")
    assert _args(lr)["base_lr"] == pytest.approx(0.1)
    mom = _producer(model.param_init_net, "fc_w_momentum")
    assert list(mom.input) == ["fc_w_fp32"]
    h2f = [op for op in _ops(model.net, "HalfToFloat") if op.output[0] == "fc_w_grad_fp32"]
    assert len(h2f) == 1 and list(h2f[0].input) == ["fc_w_grad"]
    upd = [op for op in _ops(model.net, "MomentumSGDUpdate") if op.input[0] == "fc_w_grad_fp32"]
    assert list(upd[0].input) == ["fc_w_grad_fp32", "fc_w_momentum",
                                  f"MultiPrecisionSgdOptimizer_{k}_lr_cpu", "fc_w_fp32"]
    assert list(upd[0].output) == ["fc_w_grad_fp32", "fc_w_momentum", "fc_w_fp32"]
    f2h = [op for op in _ops(model.net, "FloatToHalf") if op.output[0] == "fc_w"]
    assert list(f2h[0].input) == ["fc_w_fp32"]


def test_sparse_adagrad_and_adam_names() -> None:
    cases = [(optimizer.build_adagrad, {}, "SparseAdagrad", "emb_squared_sum"),
             (optimizer.build_adagrad, {"rowWise": True}, "RowWiseSparseAdagrad",
              "emb_avg_squared_sum"),
             (optimizer.build_adam, {}, "SparseAdam", "emb_second_moment"),
             (optimizer.build_adam, {"rowWise": True}, "RowWiseSparseAdam",
              "emb_avg_second_moment")]
    for build, kwargs, op_type, state in cases:
        model = _sparse_model()
        build(model, 0.1, **kwargs)
        op = _ops(model.net, op_type)[0]
        assert op.input[0] == "emb" and state in list(op.input)
        if "avg" in state:
            assert list(_args(_producer(model.param_init_net, state))["shape"]) == [10]


def test_build_validates_duplicate_params() -> None:
    model = _model()
    model.params.append(model.params[0])
    with pytest.raises(AssertionError):
        optimizer.build_sgd(model, 0.1)
