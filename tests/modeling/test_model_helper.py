"""ModelHelper structure: params and name scopes, gradients, validation, op access."""

from __future__ import annotations

import pytest

from dpgraph import brew, core
from dpgraph.cnn import CNNModelHelper
from dpgraph.errors import (
    ModelConfigError,
    ModelError,
    ModelStateError,
    UnknownOperatorError,
)
from dpgraph.model_helper import ModelHelper
from dpgraph.modeling import (
    ExternalInitializer,
    Initializer,
    ParameterInfo,
    ParameterTags,
    PseudoFP16Initializer,
    ReversePseudoFP16Initializer,
    update_initializer,
)
from dpgraph.proto import caffe2_pb2


def test_constructor_defaults_and_arg_scope() -> None:
    model = ModelHelper()
    assert model.name == "model" and model.get_name() == "model"
    assert model.arg_scope == {"order": "NCHW", "use_cudnn": True,
                               "cudnn_exhaustive_search": False}
    assert model.param_init_net.Name().startswith("model_init")
    assert model.params == [] and model._computed_params == [] and model.weights == []
    assert model.init_params and model.allow_not_known_ops and not model.skip_sparse_optim
    assert not model.gradient_ops_added
    custom = ModelHelper(name="m", arg_scope={"order": "NHWC"})
    assert custom.arg_scope["order"] == "NHWC" and custom.arg_scope["use_cudnn"] is True


def test_get_params_namescope_semantics() -> None:
    model = ModelHelper(name="test_get_params")
    a, b = core.BlobReference("a"), core.BlobReference("b")
    model.AddParameter(a)
    model.AddParameter(b, tags=ParameterTags.COMPUTED_PARAM)
    with core.NameScope("c"):
        ca, cd = core.ScopedBlobReference("a"), core.ScopedBlobReference("d")
        model.AddParameter(ca)
        model.AddParameter(cd, tags=ParameterTags.COMPUTED_PARAM)
        assert model.GetParams() == [ca]
        assert model.GetComputedParams() == [cd]
        assert model.GetAllParams() == [ca, cd]
        assert model.GetAllParams("") == [a, ca, b, cd]
    assert model.GetParams() == [a, ca]
    assert model.GetComputedParams() == [b, cd]
    assert model.GetAllParams("c") == [ca, cd]
    assert model.GetAllParams("c/") == [ca, cd]
    assert model.GetParams("c", top_scope=True) == [ca]
    params = model.GetParams("")
    params.append("x")
    assert len(model.params) == 2, "GetParams('') must return a copy"


def test_add_parameter_tags() -> None:
    model = ModelHelper()
    w, bias = core.BlobReference("w"), core.BlobReference("b")
    model.AddParameter(w, ParameterTags.WEIGHT)
    model.AddParameter(bias, [ParameterTags.BIAS, ParameterTags.COMPUTED_PARAM])
    assert model.weights == [w] and model.biases == [bias]
    assert model.params == [w] and model._computed_params == [bias]
    with pytest.raises(ModelError):
        model.AddParameter("not_a_ref")


def test_validate_reports_duplicates() -> None:
    model = ModelHelper()
    for name in ("aaa", "bbb", "bbb", "ccc", "bbb"):
        model.AddParameter(core.BlobReference(name))
    assert model._Validate() == ["bbb"]
    with pytest.raises(AssertionError, match="bbb"):
        model.Validate()


def test_param_model_shares_state() -> None:
    model = ModelHelper(name="train")
    brew.fc(model, "data", "fc", dim_in=3, dim_out=2)
    step_model = ModelHelper(name="step", param_model=model)
    assert step_model._parameters_info is model._parameters_info
    assert step_model.param_init_net is model.param_init_net
    assert step_model.params is model.params
    assert step_model._computed_params is model._computed_params
    assert step_model.param_to_grad is model.param_to_grad
    assert step_model.net is not model.net
    brew.fc(step_model, "data", "fc", dim_in=3, dim_out=2)  # existing param: reused
    assert [str(p) for p in model.params] == ["fc_w", "fc_b"]


def test_create_param_scoping_reuse_and_shape_mismatch() -> None:
    model = ModelHelper()
    with core.NameScope("gpu_0"):
        w = model.create_param("w", [2, 3], Initializer("ConstantFill", value=1.0),
                               tags=ParameterTags.WEIGHT)
    assert str(w) == "gpu_0/w" and model.weights == [w]
    info = model.get_param_info(w)
    assert isinstance(info, ParameterInfo) and info.shape == [2, 3] and info.size == 6
    op = model.param_init_net.Proto().op[0]
    assert (op.type, list(op.output)) == ("ConstantFill", ["gpu_0/w"])
    again = model.create_param(core.BlobReference("gpu_0/w"), [2, 3], Initializer("XavierFill"))
    assert again is w and len(model.param_init_net.Proto().op) == 1
    with pytest.raises(ModelConfigError, match="gpu_0/w"):
        model.create_param(core.BlobReference("gpu_0/w"), [4], Initializer("XavierFill"))


def test_initializers() -> None:
    net = core.Net("init_test")
    info = PseudoFP16Initializer("XavierFill").create_param(core.BlobReference("p"), net, [2])
    assert str(info.blob) == "p" and str(info.blob_copy[caffe2_pb2.TensorProto.FLOAT]) == "p_fp32"
    assert [o.type for o in net.Proto().op] == ["XavierFill", "FloatToHalf"]
    info = ReversePseudoFP16Initializer("XavierFill").create_param(
        core.BlobReference("q"), net, [2])
    assert str(info.blob) == "q"
    assert str(info.blob_copy[caffe2_pb2.TensorProto.FLOAT16]) == "q_fp16"
    with core.NameScope("s"):
        ext = ExternalInitializer().create_param("e", net, [3])
    assert str(ext.blob) == "s/e" and len(net.Proto().op) == 4
    init = update_initializer(None, None, ("ConstantFill", {"value": 2.0}))
    assert (init.operator_name, init.operator_kwargs) == ("ConstantFill", {"value": 2.0})
    init = update_initializer(PseudoFP16Initializer, ("MSRAFill", {}), ("ConstantFill", {}))
    assert isinstance(init, PseudoFP16Initializer) and init.operator_name == "MSRAFill"
    # Caffe2 reads only the first two items (its crf_test passes a third, ignored dict)
    init = update_initializer(None, ("UniformFill", {"min": -1.0}, {"max": 1.0}), None)
    assert (init.operator_name, init.operator_kwargs) == ("UniformFill", {"min": -1.0})
    with pytest.raises(ModelError):
        init.update("XavierFill", {})
    info = ParameterInfo(param_id=0, param=core.BlobReference("x"))
    assert info.grad_type() is None and info.length == 1 and info.size is None
    info.grad = core.GradientSlice("i", "v")
    assert info.grad_type() == "sparse"
    info.optimizer = object()
    with pytest.raises(ModelError):
        info.optimizer = object()


def _mlp(model: ModelHelper) -> core.BlobReference:
    hidden = brew.fc(model, "data", "fc1", dim_in=4, dim_out=3)
    hidden = brew.relu(model, hidden, "relu1")
    pred = brew.fc(model, hidden, "fc2", dim_in=3, dim_out=2)
    softmax = brew.softmax(model, pred, "softmax")
    xent = model.LabelCrossEntropy([softmax, "label"], "xent")
    return model.AveragedLoss(xent, "loss")


def test_add_gradient_operators_once() -> None:
    model = ModelHelper(name="grads")
    loss = _mlp(model)
    with pytest.raises(ModelStateError):
        model.get_param_to_grad(model.params)
    with pytest.raises(RuntimeError):
        model.GetOptimizationParamInfo()
    grad_map = model.AddGradientOperators([loss])
    assert model.grad_map is grad_map
    assert {str(k): str(v) for k, v in model.param_to_grad.items()} == {
        p: p + "_grad" for p in ("fc1_w", "fc1_b", "fc2_w", "fc2_b")}
    infos = model.GetOptimizationParamInfo()
    assert [str(i.grad) for i in infos] == ["fc1_w_grad", "fc1_b_grad", "fc2_w_grad",
                                            "fc2_b_grad"]
    assert [str(i) for i in model.GetOptimizationParamInfo([model.params[0]])] == ["fc1_w"]
    with pytest.raises(RuntimeError, match="twice"):
        model.AddGradientOperators([loss])


def test_op_access_known_and_unknown(caplog: pytest.LogCaptureFixture) -> None:
    model = ModelHelper(name="ops")
    out = model.Relu("x", "y")
    assert str(out) == "y" and model.net.Proto().op[0].type == "Relu"
    assert "Relu" in caplog.text  # not in the known list: a warning
    model.Tanh("y", "z")  # known: no error
    with pytest.raises(AttributeError):
        model.NoSuchOperator("x", "y")
    with pytest.raises(UnknownOperatorError):
        model.NoSuchOperator  # noqa: B018
    strict = ModelHelper(name="strict", allow_not_known_ops=False)
    strict.Tanh("x", "y")
    with pytest.raises(AttributeError, match="not known to be safe"):
        strict.Relu("x", "y")
    with pytest.raises(AttributeError):
        model.__deepcopy_hook__  # noqa: B018
    assert "Softmax" in dir(model)


def test_get_devices_and_data_input() -> None:
    model = ModelHelper()
    with pytest.raises(AssertionError, match="data_parallel_model"):
        model.GetDevices()
    model._devices = [0, 1]
    assert model.GetDevices() == [0, 1]
    data, label = model.TensorProtosDBInput([], ["data", "label"], 32, "/tmp/db", "lmdb")
    assert (str(data), str(label)) == ("data", "label")
    assert [op.type for op in model.param_init_net.Proto().op] == ["CreateDB"]
    assert model.net.Proto().op[0].type == "TensorProtosDBInput"
    with pytest.raises(ModelError):
        model.TensorProtosDBInput(["reader"], ["data"], 32, "/tmp/db", "lmdb")
    reader = model.CreateDB("reader", db="/tmp/db", db_type="lmdb", num_shards=2)
    assert str(reader) == "reader"
    args = {a.name for a in model.param_init_net.Proto().op[-1].arg}
    assert args == {"db", "db_type", "num_shards"}


def test_run_all_on_gpu_sets_both_nets() -> None:
    model = ModelHelper()
    brew.fc(model, "data", "fc", 2, 2)
    model.RunAllOnGPU(gpu_id=1)
    for net in (model.net, model.param_init_net):
        assert net.Proto().device_option.device_type == caffe2_pb2.PROTO_CUDA
        assert net.Proto().device_option.device_id == 1
    assert model.Proto() is model.net.Proto() and model.InitProto() is model.param_init_net.Proto()


def test_complete_net_round_trip() -> None:
    model = ModelHelper(name="test_orig")
    conv = brew.conv(model, "input", "conv", dim_in=3, dim_out=16,
                     weight_init=("MSRAFill", {}), kernel=3, stride=1, pad=0)
    conv = brew.spatial_bn(model, conv, "conv_bn", 16, epsilon=1e-3, is_test=False)
    conv = brew.relu(model, conv, "conv_relu")
    pred = brew.fc(model, conv, "pred", dim_in=16 * 3 * 3, dim_out=10)
    brew.softmax(model, pred, "softmax")
    model.net.Proto().type = "async_scheduling"
    net = model.GetCompleteNet()
    assert net.Proto().type == "async_scheduling"
    model2 = ModelHelper(name="test_new")
    model2.ConstructInitTrainNetfromNet(net)
    assert model2.net.Proto().type == "async_scheduling"
    assert len(model2.param_init_net.Proto().op) == len(model.param_init_net.Proto().op)
    for op1, op2 in zip(model.param_init_net.Proto().op, model2.param_init_net.Proto().op):
        op1.debug_info = op1.debug_info + "/param_init_net"
        assert op1 == op2
    assert list(model.net.Proto().op) == list(model2.net.Proto().op)
    assert sorted(map(str, model.net.external_inputs)) == sorted(
        map(str, model2.net.external_inputs))


def test_cnn_model_helper() -> None:
    model = CNNModelHelper(order="NHWC")
    assert model.arg_scope["order"] == "NHWC" and model.name == "CNN"
    assert model.XavierInit == ("XavierFill", {}) and model.MSRAInit == ("MSRAFill", {})
    assert model.ConstantInit(0.5) == ("ConstantFill", {"value": 0.5})
    assert model.ZeroInit == ("ConstantFill", {})
    assert model.CPU.device_type == caffe2_pb2.PROTO_CPU
    assert model.GPU.device_type == caffe2_pb2.PROTO_CUDA
    with pytest.raises(ValueError, match="order"):
        CNNModelHelper(order="NCWH")
    with pytest.raises(ModelConfigError):
        CNNModelHelper(order="HWCN")
    limited = CNNModelHelper(ws_nbytes_limit=64)
    assert limited.arg_scope["ws_nbytes_limit"] == 64
    nchw = CNNModelHelper(use_cudnn=False)
    out = nchw.Conv("data", "conv1", 3, 8, 5, weight_init=nchw.MSRAInit)
    nchw.Relu(out, out)
    nchw.MaxPool(out, "pool1", kernel=2, stride=2)
    nchw.FC("pool1", "fc1", 8 * 2 * 2, 4)
    nchw.Iter("ITER")
    types = [op.type for op in nchw.net.Proto().op]
    assert types == ["Conv", "Relu", "MaxPool", "FC", "Iter"]
    conv_op = nchw.net.Proto().op[0]
    assert conv_op.engine == "" and [a.name for a in conv_op.arg] == ["kernel", "order"]
    init_types = [op.type for op in nchw.param_init_net.Proto().op]
    assert init_types == ["MSRAFill", "ConstantFill", "XavierFill", "ConstantFill",
                          "ConstantFill"]
    iter_init = nchw.param_init_net.Proto().op[-1]
    assert iter_init.output[0] == "ITER"
    assert iter_init.device_option.device_type == caffe2_pb2.PROTO_CPU
    assert any(a.name == "dtype" and a.i == caffe2_pb2.TensorProto.INT64 for a in iter_init.arg)


def test_parameter_sharing_reuses_params() -> None:
    from dpgraph.modeling import ParameterSharing

    model = ModelHelper(name="sharing")
    with core.NameScope("tower_a"):
        brew.fc(model, "x", "fc", 4, 2)
    with ParameterSharing({"tower_b": "tower_a"}), core.NameScope("tower_b"):
        out = brew.fc(model, "x", "fc", 4, 2)
        with core.NameScope("inner"):
            brew.fc(model, "x", "fc2", 4, 2)
    assert str(out) == "tower_b/fc"
    assert list(model.net.Proto().op[1].input) == ["tower_b/x", "tower_a/fc_w", "tower_a/fc_b"]
    assert [str(p) for p in model.params] == ["tower_a/fc_w", "tower_a/fc_b",
                                              "tower_a/inner/fc2_w", "tower_a/inner/fc2_b"]
    with core.NameScope("tower_b"):
        brew.fc(model, "x", "fc", 4, 2)
    assert "tower_b/fc_w" in [str(p) for p in model.params]
    with pytest.raises(ModelConfigError), ParameterSharing({"a": "a/b"}):
        pass


def test_use_optimizer_attaches_per_tag_optimizers() -> None:
    from dpgraph import optimizer
    from dpgraph.modeling import UseOptimizer

    model = ModelHelper(name="use_optim")
    adam, sgd = optimizer.AdamOptimizer(alpha=0.01), optimizer.SgdOptimizer(0.1)
    with UseOptimizer({"WEIGHT": adam}), UseOptimizer(sgd):
        brew.fc(model, "x", "fc", 4, 2)
    brew.fc(model, "fc", "fc2", 2, 1)
    infos = {name: model.get_param_info(core.BlobReference(name))
             for name in ("fc_w", "fc_b", "fc2_w")}
    assert infos["fc_w"].optimizer is adam and infos["fc_b"].optimizer is sgd
    assert infos["fc2_w"].optimizer is None
    model.AddGradientOperators([model.net.AveragedLoss("fc2", "loss")])
    optimizer.build_sgd(model, 0.5)
    types = [op.type for op in model.net.Proto().op]
    assert types.count("Adam") == 1 and types.count("WeightedSum") == 3
