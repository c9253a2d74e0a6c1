"""ExtractPredictorNet keeps the inference ops and their parameters only."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import brew, core, optimizer, workspace
from dpgraph.errors import ExportError
from dpgraph.model_helper import ExtractPredictorNet, ModelHelper


def _train_model() -> tuple[ModelHelper, core.BlobReference]:
    model = ModelHelper(name="predictor_src")
    data = model.net.StopGradient("raw", "data")
    hidden = brew.fc(model, data, "fc1", dim_in=4, dim_out=6)
    hidden = brew.relu(model, hidden, "relu1")
    pred = brew.fc(model, hidden, "fc2", dim_in=6, dim_out=3)
    softmax = brew.softmax(model, pred, "softmax")
    xent = model.net.LabelCrossEntropy([softmax, "label"], "xent")
    loss = model.net.AveragedLoss(xent, "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, 0.1)
    return model, softmax


def test_keeps_forward_ops_and_params() -> None:
    model, softmax = _train_model()
    predict_net, params = ExtractPredictorNet(model.net.Proto(), ["data"], [softmax])
    proto = predict_net.Proto()
    assert proto.name.startswith(model.net.Name() + "_predict")
    assert [op.type for op in proto.op] == ["FC", "Relu", "FC", "Softmax"]
    assert sorted(params) == ["fc1_b", "fc1_w", "fc2_b", "fc2_w"]
    assert sorted(proto.external_input) == ["data", "fc1_b", "fc1_w", "fc2_b", "fc2_w"]
    assert list(proto.external_output) == ["softmax"]


def test_renames_device_and_disabled_inputs() -> None:
    model, softmax = _train_model()
    device = core.DeviceOption(1, 2)
    predict_net, params = ExtractPredictorNet(
        model.net.Proto(), ["data"], ["softmax"], device=device,
        renames={"data": "input", "softmax": "probs"})
    proto = predict_net.Proto()
    assert proto.op[0].input[0] == "input" and proto.op[-1].output[0] == "probs"
    assert list(proto.external_output) == ["probs"]
    assert "input" in proto.external_input and "input" not in params
    assert all(op.device_option.device_id == 2 for op in proto.op)
    predict_net, _ = ExtractPredictorNet(model.net.Proto(), ["data"], ["softmax"],
                                         disabled_inputs=["fc2_w"])
    assert [op.type for op in predict_net.Proto().op] == ["FC", "Relu"]


def test_predictor_runs_like_the_model() -> None:
    workspace.ResetWorkspace()
    model, softmax = _train_model()
    predict_net, _ = ExtractPredictorNet(model.net.Proto(), ["data"], [softmax])
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("data", x)
    workspace.RunNetOnce(predict_net)
    probs = workspace.FetchBlob("softmax")
    w1, b1, w2, b2 = (workspace.FetchBlob(n) for n in ("fc1_w", "fc1_b", "fc2_w", "fc2_b"))
    logits = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(probs, expected / expected.sum(1, keepdims=True), rtol=1e-5)


def test_refuses_training_mode_op() -> None:
    model = ModelHelper(name="bn_train")
    conv = brew.conv(model, "data", "conv", 3, 4, 3)
    bn = brew.spatial_bn(model, conv, "bn", 4, is_test=False)
    with pytest.raises(ExportError, match="is_test=0"):
        ExtractPredictorNet(model.net.Proto(), ["data"], [bn])
    test_model = ModelHelper(name="bn_test")
    conv = brew.conv(test_model, "data", "conv", 3, 4, 3)
    bn = brew.spatial_bn(test_model, conv, "bn", 4, is_test=True)
    predict_net, params = ExtractPredictorNet(test_model.net.Proto(), ["data"], [bn])
    assert [op.type for op in predict_net.Proto().op] == ["Conv", "SpatialBN"]
    assert sorted(params) == ["bn_b", "bn_riv", "bn_rm", "bn_s", "conv_b", "conv_w"]


def test_missing_inputs_or_outputs() -> None:
    model, _ = _train_model()
    with pytest.raises(Exception, match="No ops with input"):
        ExtractPredictorNet(model.net.Proto(), ["nothing"], ["softmax"])
    with pytest.raises(Exception, match="No ops with output"):
        ExtractPredictorNet(model.net.Proto(), ["data"], ["nothing"])
