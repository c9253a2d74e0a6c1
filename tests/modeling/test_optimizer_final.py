"""The final Caffe2 optimizer builders: blob names, op types, aux params, and that each one
trains the facts' testDense / testSparse models (caffe2-jobs-facts §5.2-5.4)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import brew, core, optimizer, workspace
from dpgraph.cnn import CNNModelHelper
from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import GradientSlice
from dpgraph.model_helper import ModelHelper
from dpgraph.modeling.initializers import Initializer

PERFECT = np.array([2, 6, 5, 0, 1], dtype=np.float32)


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _dense_model() -> ModelHelper:
    model = ModelHelper(name="dense")
    fc = brew.fc(model, "data", "fc", 5, 1, ("ConstantFill", {}), ("ConstantFill", {}),
                 axis=0, WeightInitializer=Initializer, BiasInitializer=Initializer)
    sq = model.net.SquaredL2Distance([fc, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "avg_loss")
    model.AddGradientOperators([loss])
    return model


def _sparse_model() -> CNNModelHelper:
    model = CNNModelHelper(name="sparse")
    w = model.param_init_net.ConstantFill([], "w", shape=[5], value=0.0)
    model.params.append(w)
    gathered = model.net.Gather([w, "indices"], "gather")
    total = model.net.ReduceFrontSum(gathered, "sum")
    sq = model.net.SquaredL2Distance([total, "label"], "sq")
    loss = model.net.AveragedLoss(sq, "avg_loss")
    model.AddGradientOperators([loss])
    return model


def _train_dense(model, iterations):
    rng = np.random.RandomState(123)
    data = rng.randint(2, size=(20, 5)).astype(np.float32)
    label = np.dot(data, PERFECT)[:, np.newaxis]
    workspace.FeedBlob("data", data[0])
    workspace.FeedBlob("label", label[0])
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net, True)
    for _ in range(iterations):
        idx = rng.randint(data.shape[0])
        workspace.FeedBlob("data", data[idx])
        workspace.FeedBlob("label", label[idx])
        workspace.RunNet(model.net.Proto().name)
    return np.asarray(workspace.FetchBlob("fc_w"))[0]


def _train_sparse(model, iterations):
    rng = np.random.RandomState(123)
    workspace.FeedBlob("indices", np.array([0, 0], np.int64))
    workspace.FeedBlob("label", np.array(0.0, np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net, True)
    for _ in range(iterations):
        picked = np.flatnonzero(rng.randint(2, size=5))
        if picked.size == 0:
            continue
        workspace.FeedBlob("indices", np.repeat(picked, 2).astype(np.int64))
        workspace.FeedBlob("label", np.array(2 * PERFECT[picked].sum(), np.float32))
        workspace.RunNet(model.net.Proto().name)
    return np.asarray(workspace.FetchBlob("w"))


def _types(net):
    return [op.type for op in net.Proto().op]


CASES = [
    # builder, kwargs, update op, sparse update op, local-state suffixes, shared non-empty
    (optimizer.build_wngrad, {"base_learning_rate": 25.0}, "Wngrad", "SparseWngrad",
     ["_moment"], False),
    (optimizer.build_storm, {"base_learning_rate": 2.0}, "Storm", "SparseStorm",
     ["_moment", "_grad_sq_sum"], False),
    (optimizer.build_adadelta, {"base_learning_rate": 1.0, "decay": 0.995}, "Adadelta",
     "SparseAdadelta", ["_squared_moment", "_squared_moment_update"], False),
    (optimizer.build_decay_adagrad, {"base_learning_rate": 1.0}, "DecayAdagrad", None,
     ["_first_mo1ment", "_second_moment"], True),
    (optimizer.build_gftrl, {"engine": None, "alpha": 1.0, "beta": 0.1, "lambda1": 0.0,
                             "lambda2": 0.0}, "GFtrl", None, ["_gftrl_nz"], False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[2] for c in CASES])
def test_dense_builder_graph_and_convergence(case):
    build, kwargs, op_type, _, suffixes, shared = case
    model = _dense_model()
    opt = build(model, **kwargs)
    assert isinstance(model.grad_map["fc_w"], core.BlobReference)
    updates = [op for op in model.net.Proto().op if op.type == op_type]
    assert [op.input[0] for op in updates] == ["fc_w", "fc_b"]
    assert all(op.output[0] == op.input[0] for op in updates)
    init_outputs = {o for op in model.param_init_net.Proto().op for o in op.output}
    for suffix in suffixes:
        assert {"fc_w" + suffix, "fc_b" + suffix} <= init_outputs
    aux = opt.get_auxiliary_parameters()
    assert sorted(str(b) for b in aux.local) == sorted(
        p + s for p in ("fc_w", "fc_b") for s in suffixes)
    assert bool(aux.shared) == shared
    if op_type != "GFtrl":
        lr_ops = [op for op in model.net.Proto().op if op.type == "LearningRate"]
        name = type(opt).__name__
        assert lr_ops[0].output[0] == f"{name}_{opt._instance_num}_lr_cpu"
    w = _train_dense(model, 2000)
    np.testing.assert_allclose(w, PERFECT, atol=1e-2)
    if shared:
        assert int(np.asarray(workspace.FetchBlob("optimizer_iteration")).item()) == 2000


@pytest.mark.parametrize("case", [c for c in CASES if c[3]], ids=lambda c: c[3])
def test_sparse_builder_graph_and_convergence(case):
    build, kwargs, _, sparse_type, _, _ = case
    model = _sparse_model()
    assert isinstance(model.param_to_grad["w"], GradientSlice)
    build(model, **kwargs)
    (update,) = [op for op in model.net.Proto().op if op.type == sparse_type]
    grad = model.param_to_grad["w"]
    if sparse_type == "SparseStorm":  # values before indices
        assert list(update.input[3:5]) == [str(grad.values), str(grad.indices)]
    w = _train_sparse(model, 2000)
    # Adadelta with decay 0.995 moves slowly on these 2000 sparse steps; it still has to
    # close most of the gap from w = 0.
    np.testing.assert_allclose(w, PERFECT, atol=0.5 if sparse_type == "SparseAdadelta" else 1e-2)


def test_decay_adagrad_sparse_falls_back_to_sparse_adagrad():
    model = _sparse_model()
    opt = optimizer.build_decay_adagrad(model, 1.0)
    assert "SparseAdagrad" in _types(model.net) and "DecayAdagrad" not in _types(model.net)
    assert [str(b) for b in opt.get_auxiliary_parameters().local] == ["w_squared_sum"]
    assert not opt.get_auxiliary_parameters().shared


def test_gftrl_refuses_sparse_gradients():
    from dpgraph.errors import ModelConfigError

    with pytest.raises(ModelConfigError, match="sparse"):
        optimizer.build_gftrl(_sparse_model(), engine=None, alpha=1.0)


def test_storm_and_wngrad_args_and_constructor_defaults():
    storm = optimizer.StormOptimizer()
    assert (storm.lr, storm.momentum, storm.beta, storm.grad_sq_init) == (0.1, 10.0, 0.1, 0.01)
    wngrad = optimizer.WngradOptimizer()
    assert (wngrad.alpha, wngrad.epsilon, wngrad.moment_init) == (1.0, 1e-9, 100.0)
    decay = optimizer.DecayAdagradOptimizer()
    assert (decay.alpha, decay.beta1, decay.beta2, decay.epsilon) == (0.01, 0.0, 0.999, 0.1)
    model = _dense_model()
    optimizer.build_storm(model, 0.5, momentum=3.0, beta=0.2)
    (op, *_) = [op for op in model.net.Proto().op if op.type == "Storm"]
    args = {a.name: a.f for a in op.arg}
    assert args == {"momentum": 3.0, "beta": pytest.approx(0.2)}
    fills = {op.output[0]: op for op in model.param_init_net.Proto().op}
    assert [a.f for a in fills["fc_w_grad_sq_sum"].arg if a.name == "value"] == [
        pytest.approx(0.01)]


def test_wngrad_effective_lr_outputs():
    model = _dense_model()
    optimizer.build_wngrad(model, 1.0, output_effective_lr_and_update=True)
    ops = [op for op in model.net.Proto().op if op.type == "Wngrad"]
    assert list(ops[0].output) == ["fc_w", "fc_w_moment", "fc_w_effective_lr", "fc_w_update"]


def test_add_weight_decay_then_sgd_has_no_early_return_for_zero():
    model = _dense_model()
    optimizer.add_weight_decay(model, 0.0)
    wd = [op for op in model.net.Proto().op if op.type == "WeightedSum"]
    assert [op.output[0] for op in wd] == ["fc_w_grad"]  # weights only


def test_storm_and_gftrl_on_a_virtual_gpu_match_cpu():
    workspace.SetVirtualGpus(1)
    results = []
    for device in (core.DeviceOption(0), core.DeviceOption(1, 0)):
        workspace.ResetWorkspace()
        with core.DeviceScope(device):
            model = _dense_model()
            optimizer.build_storm(model, 2.0)
        results.append(_train_dense(model, 50))
    np.testing.assert_array_equal(results[0], results[1])


def _op_args(op):
    from dpgraph.ir.arguments import arguments_dict

    return arguments_dict(op.arg)


def test_adagrad_final_options_graph():
    model = _dense_model()
    opt = optimizer.build_adagrad(model, 0.5, weight_decay=0.01,
                                  output_effective_lr_and_update=True)
    updates = {op.input[0]: op for op in model.net.Proto().op if op.type == "Adagrad"}
    # weight decay is dropped for 1-D params (the bias)
    assert _op_args(updates["fc_w"])["weight_decay"] == pytest.approx(0.01)
    assert "weight_decay" not in _op_args(updates["fc_b"])
    assert list(updates["fc_w"].output) == ["fc_w", "fc_w_squared_sum", "fc_w_effective_lr",
                                            "fc_w_update"]
    assert not opt.get_auxiliary_parameters().shared
    with pytest.raises(Exception, match="not supported"):
        optimizer.AdagradOptimizer(swa_options={"swa_avg_start_it": 1})


def test_row_wise_adagrad_with_counter_graph_and_training():
    model = _sparse_model()
    opt = optimizer.build_adagrad(model, 1.0, rowWise=True, counter_halflife=5)
    aux = opt.get_auxiliary_parameters()
    assert [str(b) for b in aux.shared] == ["optimizer_iteration"]
    assert {str(b) for b in aux.local} == {"w_avg_squared_sum", "w_update_counter",
                                           "w_prev_update_iter"}
    (counter,) = [op for op in model.net.Proto().op if op.type == "RowWiseCounter"]
    grad = model.param_to_grad["w"]
    assert list(counter.input) == ["w_prev_update_iter", "w_update_counter",
                                   str(grad.indices), "optimizer_iteration"]
    assert _op_args(counter)["counter_halflife"] == 5
    fills = {op.output[0]: _op_args(op) for op in model.param_init_net.Proto().op}
    assert fills["w_update_counter"]["shape"] == [5]
    w = _train_sparse(model, 2000)
    np.testing.assert_allclose(w, PERFECT, atol=1e-2)
    iterations = int(np.asarray(workspace.FetchBlob("optimizer_iteration")).item())
    assert 1800 < iterations <= 2000  # steps with no picked index are skipped
    assert np.asarray(workspace.FetchBlob("w_update_counter")).dtype == np.float64


def test_adam_final_options_graph():
    model = _sparse_model()
    optimizer.build_adam(model, 0.1, enableRAdam=True)
    (op,) = [op for op in model.net.Proto().op if op.type == "SparseAdam"]
    assert _op_args(op)["enableRAdam"] == 1
    assert not any(a.name == "enableRAdam" for o in model.net.Proto().op
                   if o.type == "LearningRate" for a in o.arg)
    model = _dense_model()
    optimizer.build_adam(model, 0.1, use_lr_adaption=True, lr_alpha=0.02)
    adam = [op for op in model.net.Proto().op if op.type == "Adam"]
    assert adam[0].output[3] == "fc_w_effective_grad"
    adaption = [op for op in model.net.Proto().op if op.type == "LearningRateAdaption"]
    assert len(adaption) == 2 and list(adaption[0].input)[1:] == ["fc_w_grad",
                                                                  "fc_w_effective_grad"]
    with pytest.raises(Exception, match="RAdam"):
        optimizer.build_adam(_sparse_model(), 0.1, rowWise=True, enableRAdam=True)


def test_adagrad_dedicated_lr_iteration_counter() -> None:
    from dpgraph import utils

    model = _dense_model()
    opt = optimizer.build_adagrad(model, base_learning_rate=1.0,
                                  use_dedicated_lr_iteration_counter=True)
    assert opt.use_dedicated_lr_iteration_counter
    init_outputs = [o for op in model.param_init_net.Proto().op for o in op.output]
    assert {utils.OPTIMIZER_ITERATION_LR_NAME, utils.ITERATION_MUTEX_LR_NAME,
            utils.OPTIMIZER_ITERATION_NAME, utils.ITERATION_MUTEX_NAME} <= set(init_outputs)
    lr_ops = [op for op in model.net.Proto().op if op.type == "LearningRate"]
    assert [op.input[0] for op in lr_ops] == ["optimizer_iteration_lr", "optimizer_iteration"]
    assert lr_ops[1].output[0].endswith("iter_placement_hint_cpu")
    workspace.FeedBlob("data", np.ones(5, np.float32))
    workspace.FeedBlob("label", np.zeros(1, np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net, 3)
    assert workspace.FetchBlob("optimizer_iteration_lr") == workspace.FetchBlob(
        "optimizer_iteration") == 3
    with pytest.raises(ModelConfigError, match="dedicated learning-rate iteration counter"):
        optimizer.SgdOptimizer().build_non_lr_iter(model.net, model.param_init_net)
