"""The spec facts once more, through the Caffe2 import alias (``from caffe2.python import``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import numpy as np
import pytest

from dpgraph.compat import caffe2 as alias


@pytest.fixture
def c2() -> Iterator[None]:
    was_installed = alias.is_installed()
    alias.install()
    yield
    if not was_installed:
        alias.uninstall()


def test_alias_core_scope_utils(c2: None) -> None:
    from caffe2.proto import caffe2_pb2
    from caffe2.python import core, scope, utils

    assert caffe2_pb2.CPU == 0 and caffe2_pb2.CUDA == 1 and caffe2_pb2.IDEEP == 5
    assert core.DataType.FLOAT == 1
    option = core.DeviceOption(caffe2_pb2.CUDA, 2)
    assert (option.device_type, option.device_id) == (1, 2)
    with core.NameScope("gpu_0"), core.DeviceScope(option):
        assert scope.CurrentNameScope() == "gpu_0/"
        op = core.CreateOperator("Relu", "x", "y", engine="CUDNN")
    assert list(op.input) == ["gpu_0/x"] and op.device_option == option
    ref = core.BlobReference("gpu_0/w")
    assert str(ref + "_grad") == "gpu_0/w_grad" and ref.GetNameScope() == "gpu_0/"
    assert utils.MakeArgument("k", [1, 2]).ints == [1, 2]
    with pytest.raises(TypeError):
        core._RectifyInputOutput(3)


def test_alias_net_and_gradients(c2: None) -> None:
    from caffe2.python import core

    net = core.Net("conf_alias_net")
    fc = net.FC(["in", "w", "b"], "fc")
    net.AveragedLoss(fc, "loss")
    grad_map = net.AddGradientOperators(["loss"])
    assert [op.type for op in net.Proto().op[2:]] == [
        "ConstantFill", "AveragedLossGradient", "FCGradient"]
    assert grad_map["w"] == "w_grad" and str(grad_map["loss"]) == "loss_autogen_grad"
    with pytest.raises(AttributeError):
        net.NotAnOperatorXyz  # noqa: B018


def test_alias_workspace(c2: None) -> None:
    from caffe2.python import core, workspace

    workspace.ResetWorkspace()
    try:
        workspace.FeedBlob("x", np.array([-1.0, 2.0], dtype=np.float32))
        net = core.Net("conf_alias_ws")
        net.Relu("x", "y")
        assert workspace.CreateNet(net) is True
        assert workspace.RunNet(net) is True
        np.testing.assert_array_equal(workspace.FetchBlob("y"), [0.0, 2.0])
        with pytest.raises(RuntimeError, match="respectfully refuse"):
            workspace.CreateNet(net)
        with pytest.raises(RuntimeError, match="Can't find blob"):
            workspace.FetchBlob("missing")
        with pytest.raises(RuntimeError, match="Can't find net"):
            workspace.RunNet("missing_net")
    finally:
        workspace.ResetWorkspace()


def test_alias_model_helper_and_cnn(c2: None) -> None:
    from caffe2.python import brew, cnn, core, model_helper
    from caffe2.python.modeling.parameter_info import ParameterTags

    model = model_helper.ModelHelper(name="conf_alias_model")
    brew.fc(model, "data", "fc", dim_in=2, dim_out=2)
    assert [str(p) for p in model.params] == ["fc_w", "fc_b"]
    assert model.weights == ["fc_w"] and model.biases == ["fc_b"]
    assert ParameterTags.COMPUTED_PARAM == "COMPUTED_PARAM"
    model.AddParameter(core.BlobReference("c"), ParameterTags.COMPUTED_PARAM)
    assert model.GetComputedParams() == ["c"]
    assert cnn.CNNModelHelper(order="NHWC").arg_scope["order"] == "NHWC"
    assert importlib.import_module("caffe2.python.model_helper") is model_helper
