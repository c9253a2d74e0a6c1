"""Spec api §5 and behaviour §5: ModelHelper, parameters, ExtractPredictorNet, CNNModelHelper."""

from __future__ import annotations

import inspect
import itertools
import logging

import numpy as np
import pytest

from dpgraph import brew, cnn, core, model_helper, scope, workspace
from dpgraph.modeling.initializers import (
    ExternalInitializer,
    Initializer,
    PseudoFP16Initializer,
    ReversePseudoFP16Initializer,
    update_initializer,
)
from dpgraph.modeling.parameter_info import ParameterInfo, ParameterTags
from dpgraph.proto import caffe2_pb2

_ids = itertools.count()


def _model(**kwargs: object) -> model_helper.ModelHelper:
    return model_helper.ModelHelper(name=f"conf_mh_{next(_ids)}", **kwargs)


# --- construction ---------------------------------------------------------------------------
def test_signature_and_defaults() -> None:
    sig = inspect.signature(model_helper.ModelHelper.__init__)
    assert [(p.name, p.default) for p in list(sig.parameters.values())[1:]] == [
        ("name", None), ("init_params", True), ("allow_not_known_ops", True),
        ("skip_sparse_optim", False), ("param_model", None), ("arg_scope", None)]


def test_attributes() -> None:
    model = model_helper.ModelHelper()
    assert model.name == "model" and model.get_name() == "model"
    assert model.net.Name().startswith("model")
    assert model.param_init_net.Name().startswith("model_init")
    assert isinstance(model.net, core.Net) and isinstance(model.param_init_net, core.Net)
    assert model.param_to_grad == {} and model.params == []
    assert model._parameters_info == {} and model._computed_params == []
    assert model._param_info_deprecated == [] and model._devices == []
    assert model.gradient_ops_added is False
    assert model.init_params is True and model.allow_not_known_ops is True
    assert model.skip_sparse_optim is False
    assert model.weights == [] and model.biases == []
    assert model.arg_scope == {"order": "NCHW", "use_cudnn": True,
                               "cudnn_exhaustive_search": False}
    with pytest.raises(AttributeError):
        model.arg_scope = {}  # read-only property
    assert not hasattr(model, "computed_params")
    named = _model(arg_scope={"order": "NHWC", "extra": 1})
    assert named.arg_scope["order"] == "NHWC" and named.arg_scope["extra"] == 1
    assert named.arg_scope["use_cudnn"] is True


def test_net_names_uniquified() -> None:
    name = f"conf_dup_{next(_ids)}"
    a = model_helper.ModelHelper(name=name)
    b = model_helper.ModelHelper(name=name)
    assert a.net.Name() == name and a.param_init_net.Name() == name + "_init"
    assert b.net.Name() == name + "_1" and b.param_init_net.Name() == name + "_init_1"


def test_param_model_shares_objects() -> None:
    model = _model()
    step = model_helper.ModelHelper(name="step", param_model=model)
    assert step.param_init_net is model.param_init_net
    assert step.param_to_grad is model.param_to_grad
    assert step.params is model.params
    assert step._parameters_info is model._parameters_info
    assert step._computed_params is model._computed_params
    assert step.net is not model.net
    assert step.weights is not model.weights


# --- parameters -----------------------------------------------------------------------------
def test_create_param() -> None:
    model = _model()
    with scope.NameScope("s"):
        w = model.create_param("w", [2, 3], Initializer("XavierFill"),
                               tags=ParameterTags.WEIGHT)
        verbatim = model.create_param(core.BlobReference("raw"), [1], Initializer("ConstantFill",
                                                                                  value=2.0))
    assert str(w) == "s/w" and isinstance(w, core.BlobReference)
    assert str(verbatim) == "raw"
    op = model.param_init_net.Proto().op[0]
    assert (op.type, list(op.input), list(op.output)) == ("XavierFill", [], ["s/w"])
    assert {a.name: list(a.ints) for a in op.arg} == {"shape": [2, 3]}
    assert model.params == ["s/w", "raw"] and model.weights == ["s/w"]
    info = model.get_param_info(w)
    assert isinstance(info, ParameterInfo) and info.shape == [2, 3] and info.name == "s/w"
    with scope.NameScope("s"):
        again = model.create_param("w", [2, 3], Initializer("XavierFill"))
    assert again == w and len(model.param_init_net.Proto().op) == 2
    with pytest.raises(AssertionError):
        with scope.NameScope("s"):
            model.create_param("w", [4], Initializer("XavierFill"))
    with pytest.raises(AssertionError):
        model.get_param_info("s/w")
    with pytest.raises(AssertionError, match="Initializer"):
        model.create_param("v", [1], ("XavierFill", {}))
    with pytest.raises(AssertionError):
        model.create_param(3, [1], Initializer("XavierFill"))
    assert "v" not in model._parameters_info


def test_add_parameter_tags() -> None:
    model = _model()
    a, b, c = (core.BlobReference(n) for n in "abc")
    model.AddParameter(a, ParameterTags.WEIGHT)
    model.AddParameter(b, [ParameterTags.BIAS])
    model.AddParameter(c, tags=ParameterTags.COMPUTED_PARAM)
    assert model.params == [a, b] and model._computed_params == [c]
    assert model.weights == [a] and model.biases == [b]
    assert ParameterTags.BIAS == "BIAS" and ParameterTags.WEIGHT == "WEIGHT"
    assert ParameterTags.COMPUTED_PARAM == "COMPUTED_PARAM"
    with pytest.raises(AssertionError):
        model.AddParameter("not_a_ref")


def test_get_params_semantics() -> None:
    model = _model()
    a, b = core.BlobReference("a"), core.BlobReference("b")
    model.AddParameter(a)
    model.AddParameter(b, tags=ParameterTags.COMPUTED_PARAM)
    with scope.NameScope("c"):
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
    assert model.GetParams("c", top_scope=True) == model.GetParams("c")
    params = model.GetParams("")
    params.append("x")
    assert len(model.params) == 2  # a copy


def test_validate_duplicates() -> None:
    model = _model()
    model.AddParameter(core.BlobReference("aaa"))
    model.AddParameter(core.BlobReference("bbb"))
    model.AddParameter(core.BlobReference("bbb"))
    assert model._Validate() == ["bbb"]
    with pytest.raises(AssertionError):
        model.Validate()


# --- gradients ------------------------------------------------------------------------------
def _fc_model() -> model_helper.ModelHelper:
    model = _model()
    fc = brew.fc(model, "data", "fc", dim_in=3, dim_out=2)
    model.net.AveragedLoss(fc, "loss")
    return model


def test_add_gradient_operators() -> None:
    model = _fc_model()
    with pytest.raises(AssertionError):
        model.get_param_to_grad(model.params)
    grad_map = model.AddGradientOperators(["loss"])
    assert model.grad_map is grad_map and model.gradient_ops_added
    assert set(map(str, model.param_to_grad)) == {"fc_w", "fc_b"}
    assert all(isinstance(k, core.BlobReference) for k in model.param_to_grad)
    assert model.param_to_grad["fc_w"] == "fc_w_grad"
    assert model.get_param_info(model.params[0]).grad == "fc_w_grad"
    infos = model.GetOptimizationParamInfo()
    assert [i.name for i in infos] == ["fc_w", "fc_b"]
    assert [i.grad_type() for i in infos] == ["dense", "dense"]
    with pytest.raises(RuntimeError):
        model.AddGradientOperators(["loss"])


def test_optimization_param_info_needs_gradients_and_skips_sparse() -> None:
    model = _model()
    with pytest.raises(AssertionError):
        model.GetOptimizationParamInfo()
    emb = core.BlobReference("emb")
    model.param_init_net.XavierFill([], emb, shape=[4, 2])
    model.AddParameter(emb)
    model.net.Gather([emb, "idx"], "g")
    model.net.AveragedLoss("g", "loss")
    model.skip_sparse_optim = True
    model.AddGradientOperators(["loss"])
    assert isinstance(model.param_to_grad["emb"], core.GradientSlice)
    assert model.GetOptimizationParamInfo() == []


def test_get_devices_and_misc() -> None:
    model = _model()
    with pytest.raises(AssertionError, match="data_parallel_model"):
        model.GetDevices()
    model._devices = [0, 1]
    assert model.GetDevices() == [0, 1]
    assert model.Proto() is model.net.Proto()
    assert model.InitProto() is model.param_init_net.Proto()
    model.RunAllOnGPU(gpu_id=1)
    assert model.net.Proto().device_option.device_id == 1
    assert model.param_init_net.Proto().device_option.device_type == caffe2_pb2.CUDA
    with pytest.raises(AssertionError):
        model.TensorProtosDBInput(["reader"], "data", 4, "db", "leveldb")


# --- op access ------------------------------------------------------------------------------
def test_getattr_known_and_unknown_ops(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    out = model.Relu("x", "y")  # not in the known list: warning only
    assert str(out) == "y" and model.net.Proto().op[-1].type == "Relu"
    model.Sigmoid("y", "z")
    assert model.net.Proto().op[-1].type == "Sigmoid"
    with pytest.raises(AttributeError):
        model.NotARegisteredOpXyz  # noqa: B018
    with pytest.raises(AttributeError):
        model.__array_interface__  # noqa: B018
    strict = _model(allow_not_known_ops=False)
    strict.Sigmoid("a", "b")
    with pytest.raises(AttributeError):
        strict.Relu("a", "b")
    for op_type in ("Accuracy", "AveragedLoss", "ConstantFill", "Copy", "LabelCrossEntropy",
                    "Softmax", "StopGradient", "Summarize", "WeightedSum", "YellowFin"):
        assert op_type in model_helper._known_working_ops


# --- complete net round trip (model_helper_test) --------------------------------------------
def test_complete_net_round_trip() -> None:
    model = _fc_model()
    model.net.Proto().type = "async_scheduling"
    complete = model.GetCompleteNet()
    assert complete.Proto().type == "async_scheduling"
    init_ops = [op for op in complete.Proto().op if op.debug_info.endswith("/param_init_net")]
    assert len(init_ops) == len(model.param_init_net.Proto().op)
    fresh = _model()
    fresh.ConstructInitTrainNetfromNet(complete)
    assert [op.type for op in fresh.net.Proto().op] == [op.type for op in model.net.Proto().op]
    assert [op.output for op in fresh.param_init_net.Proto().op] == [
        op.output for op in model.param_init_net.Proto().op]
    assert sorted(fresh.net.Proto().external_input) == sorted(
        model.net.Proto().external_input)


# --- ParameterInfo and initializers ---------------------------------------------------------
def test_parameter_info() -> None:
    blob = core.BlobReference("p")
    info = ParameterInfo(param_id=0, param=blob, shape=[2, 3])
    assert (info.param_id, info.name, info.blob, info.key) == (0, "p", blob, None)
    assert info.size == 6 and info.length == 1 and info.parameter is blob
    assert ParameterInfo(1, blob).size is None
    assert ParameterInfo(1, blob, length=0).length == 1
    assert ParameterInfo(1, blob, length=5).length == 5
    assert info.grad_type() is None
    info.grad = core.BlobReference("g")
    assert info.grad_type() == "dense"
    info.grad = core.GradientSlice("i", "v")
    assert info.grad_type() == "sparse"
    info.optimizer = "opt"
    with pytest.raises(AssertionError):
        info.optimizer = "other"
    assert info.blob_copy is None


def test_initializers() -> None:
    net = core.Net(f"conf_init_{next(_ids)}")
    info = Initializer("GaussianFill", std=0.5).create_param(
        param_name=core.BlobReference("g"), init_net=net, shape=[2])
    op = net.Proto().op[-1]
    assert op.type == "GaussianFill" and list(op.output) == ["g"]
    assert {a.name for a in op.arg} == {"shape", "std"}
    assert info.shape == [2]
    before = len(net.Proto().op)
    with scope.NameScope("s"):
        ext = ExternalInitializer().create_param("e", init_net=net, shape=[1])
    assert len(net.Proto().op) == before and str(ext.blob) == "s/e"
    fp16 = PseudoFP16Initializer("XavierFill").create_param(
        core.BlobReference("h"), init_net=net, shape=[2])
    assert [list(op.output) for op in net.Proto().op[-2:]] == [["h_fp32"], ["h"]]
    assert net.Proto().op[-1].type == "FloatToHalf"
    assert str(fp16.blob) == "h" and str(fp16.blob_copy[caffe2_pb2.TensorProto.FLOAT]) == "h_fp32"
    rev = ReversePseudoFP16Initializer("XavierFill").create_param(
        core.BlobReference("r"), init_net=net, shape=[2])
    assert str(rev.blob) == "r"
    assert str(rev.blob_copy[caffe2_pb2.TensorProto.FLOAT16]) == "r_fp16"
    init = update_initializer(None, None, ("ConstantFill", {"value": 1.0}))
    assert isinstance(init, Initializer) and init.operator_name == "ConstantFill"
    init = update_initializer(None, ("XavierFill", {}), ("ConstantFill", {}))
    assert init.operator_name == "XavierFill"


# --- ExtractPredictorNet --------------------------------------------------------------------
def _train_model() -> model_helper.ModelHelper:
    model = _model()
    model.net.ConstantFill([], "data_src", shape=[1, 3], value=1.0)
    model.net.Copy("data_src", "data")
    fc = brew.fc(model, "data", "fc", dim_in=3, dim_out=2)
    pred = model.net.Softmax(fc, "pred")
    model.net.AveragedLoss(pred, "loss")
    model.AddGradientOperators(["loss"])
    return model


def test_extract_predictor_net() -> None:
    model = _train_model()
    predict_net, params = model_helper.ExtractPredictorNet(
        model.net.Proto(), ["data"], ["pred"])
    assert isinstance(predict_net, core.Net)
    assert predict_net.Name().startswith(model.net.Name() + "_predict")
    assert [op.type for op in predict_net.Proto().op] == ["FC", "Softmax"]
    assert sorted(params) == ["fc_b", "fc_w"]
    assert set(predict_net.Proto().external_input) == {"data", "fc_w", "fc_b"}
    assert set(predict_net.Proto().external_output) == {"pred"}


def test_extract_predictor_renames_device_and_errors() -> None:
    model = _train_model()
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 1)
    predict_net, params = model_helper.ExtractPredictorNet(
        model.net.Proto(), ["data"], ["pred"], device=gpu, renames={"data": "input"})
    assert list(predict_net.Proto().op[0].input)[0] == "input"
    assert "input" in predict_net.Proto().external_input
    assert all(op.device_option.device_id == 1 for op in predict_net.Proto().op)
    # as in Caffe2, the kept ops of the caller's proto were moved in place
    fc_op = next(op for op in model.net.Proto().op if op.type == "FC")
    assert fc_op.device_option.device_type == caffe2_pb2.CUDA
    assert fc_op.device_option.device_id == 1
    assert sorted(params) == ["fc_b", "fc_w"]
    with pytest.raises(Exception, match="No ops with input"):
        model_helper.ExtractPredictorNet(model.net.Proto(), ["nothing"], ["pred"])
    with pytest.raises(Exception, match="No ops with output"):
        model_helper.ExtractPredictorNet(model.net.Proto(), ["data"], ["nothing"])
    train = _model()
    train.net.Dropout("data", ["d", "mask"], is_test=0)
    with pytest.raises(Exception, match="is_test"):
        model_helper.ExtractPredictorNet(train.net.Proto(), ["data"], ["d"])


# --- CNNModelHelper -------------------------------------------------------------------------
def test_cnn_model_helper(caplog: pytest.LogCaptureFixture) -> None:
    sig = inspect.signature(cnn.CNNModelHelper.__init__)
    assert [(p.name, p.default) for p in list(sig.parameters.values())[1:]] == [
        ("order", "NCHW"), ("name", None), ("use_cudnn", True),
        ("cudnn_exhaustive_search", False), ("ws_nbytes_limit", None), ("init_params", True),
        ("skip_sparse_optim", False), ("param_model", None)]
    with caplog.at_level(logging.WARNING):
        model = cnn.CNNModelHelper()
    assert "DEPRECATE" in caplog.text.upper()
    assert model.name == "CNN" and model.order == "NCHW" and model.use_cudnn is True
    assert model.cudnn_exhaustive_search is False and model.ws_nbytes_limit is None
    assert model.arg_scope == {"order": "NCHW", "use_cudnn": True,
                               "cudnn_exhaustive_search": False}
    nhwc = cnn.CNNModelHelper(order="NHWC", ws_nbytes_limit=64)
    assert nhwc.arg_scope["order"] == "NHWC" and nhwc.arg_scope["ws_nbytes_limit"] == 64
    assert isinstance(nhwc, model_helper.ModelHelper)
    with pytest.raises(ValueError):
        cnn.CNNModelHelper(order="CHWN")
    assert model.XavierInit == ("XavierFill", {})
    assert model.ConstantInit(0.5) == ("ConstantFill", {"value": 0.5})
    assert model.ZeroInit == ("ConstantFill", {})
    assert model.MSRAInit[0] == "MSRAFill"
    assert model.CPU.device_type == caffe2_pb2.CPU
    assert model.GPU.device_type == caffe2_pb2.CUDA
    for wrapper in ("Conv", "ConvNd", "ConvTranspose", "GroupConv", "FC", "PackedFC",
                    "Dropout", "LRN", "Softmax", "SpatialBN", "Relu", "PRelu", "Concat",
                    "DepthConcat", "Sum", "Transpose", "Iter", "Accuracy", "MaxPool",
                    "AveragePool", "ImageInput", "PadImage", "AddWeightDecay"):
        assert callable(getattr(model, wrapper)), wrapper


def test_cnn_fc_runs() -> None:
    model = cnn.CNNModelHelper(name=f"conf_cnn_{next(_ids)}")
    model.FC("data", "fc", 3, 2)
    workspace.ResetWorkspace()
    workspace.FeedBlob("data", np.ones((4, 3), dtype=np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("fc").shape == (4, 2)
    workspace.ResetWorkspace()


def test_complete_net_ops_compare_equal() -> None:
    model = _model()
    conv = brew.conv(model, "input", "conv", dim_in=3, dim_out=16,
                     weight_init=("MSRAFill", {}), kernel=3, stride=1, pad=0)
    conv = brew.max_pool(model, conv, "conv_pool", kernel=2, stride=2)
    brew.relu(model, conv, "conv_relu")
    model.net.Proto().type = "async_scheduling"
    complete = model.GetCompleteNet()
    model2 = _model()
    model2.ConstructInitTrainNetfromNet(complete)
    assert model2.net.Proto().type == "async_scheduling"
    init1, init2 = model.param_init_net.Proto().op, model2.param_init_net.Proto().op
    assert len(init1) == len(init2) == 2
    for op1, op2 in zip(init1, init2):
        expected = caffe2_pb2.OperatorDef()
        expected.CopyFrom(op1)
        expected.debug_info = op1.debug_info + "/param_init_net"
        assert expected == op2
    assert list(model.net.Proto().op) == list(model2.net.Proto().op)
    assert sorted(map(str, model.net.external_inputs)) == sorted(
        map(str, model2.net.external_inputs))
