"""mobile_exporter.Export: Caffe2's mobile_exporter_test (LeNet; int32 and string params)
and the fill op per dtype (caffe2-jobs-facts §1.6)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import brew, workspace
from dpgraph.export.predictor import WorkspacePredictor
from dpgraph.model_helper import ModelHelper
from dpgraph.predictor import mobile_exporter
from dpgraph.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def _lenet() -> ModelHelper:
    model = ModelHelper(name="mobile_exporter_test_model")
    conv1 = brew.conv(model, "data", "conv1", dim_in=1, dim_out=20, kernel=5)
    pool1 = brew.max_pool(model, conv1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(model, pool1, "conv2", dim_in=20, dim_out=50, kernel=5)
    pool2 = brew.max_pool(model, conv2, "pool2", kernel=2, stride=2)
    fc3 = brew.fc(model, pool2, "fc3", dim_in=50 * 4 * 4, dim_out=500)
    fc3 = brew.relu(model, fc3, fc3)
    pred = brew.fc(model, fc3, "pred", 500, 10)
    brew.softmax(model, pred, "out")
    return model


def test_mobile_exporter_lenet():
    model = _lenet()
    workspace.RunNetOnce(model.param_init_net)
    init_net, predict_net = mobile_exporter.Export(workspace, model.net, model.params)
    assert [op.type for op in init_net.op] == ["GivenTensorFill"] * 8 + ["GivenTensorFill"]
    assert [op.output[0] for op in init_net.op] == [str(p) for p in model.params] + ["data"]
    assert list(predict_net.external_input)[0] == "data"
    assert list(predict_net.external_output) == ["out"]
    shape = [a.ints for a in init_net.op[0].arg if a.name == "shape"][0]
    assert list(shape) == [20, 1, 5, 5]
    np_data = np.random.RandomState(0).rand(1, 1, 28, 28).astype(np.float32)
    workspace.FeedBlob("data", np_data)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    ref_out = workspace.FetchBlob("out")
    workspace.ResetWorkspace()
    workspace.RunNetOnce(init_net)
    workspace.FeedBlob("data", np_data)
    workspace.CreateNet(predict_net, True)
    workspace.RunNet(predict_net.name)
    np.testing.assert_allclose(ref_out, workspace.FetchBlob("out"), atol=1e-10, rtol=1e-10)
    workspace.ResetWorkspace()
    predictor = WorkspacePredictor(init_net.SerializeToString(),
                                   predict_net.SerializeToString())
    (out,) = predictor.run([np_data])
    np.testing.assert_allclose(ref_out, out, atol=1e-10, rtol=1e-10)


def test_mobile_exporter_datatypes():
    model = ModelHelper(name="mobile_exporter_test_model")
    model.Copy("data_int", "out")
    model.params.append("data_int")
    model.Copy("data_obj", "out_obj")
    model.params.append("data_obj")
    np_data_int = np.random.RandomState(1).randint(100, size=(1, 1, 28, 28), dtype=np.int32)
    workspace.FeedBlob("data_int", np_data_int)
    np_data_obj = np.array(["aa", "bb"]).astype(np.dtype("O"))
    workspace.FeedBlob("data_obj", np_data_obj)
    fetched = workspace.FetchBlob("data_obj")
    assert fetched.dtype == object and list(fetched) == [b"aa", b"bb"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    ref_out, ref_out_obj = workspace.FetchBlob("out"), workspace.FetchBlob("out_obj")
    init_net, predict_net = mobile_exporter.Export(workspace, model.net, model.params)
    assert [op.type for op in init_net.op] == ["GivenTensorIntFill", "GivenTensorStringFill"]
    workspace.ResetWorkspace()
    workspace.RunNetOnce(init_net)
    workspace.CreateNet(predict_net, True)
    workspace.RunNet(predict_net.name)
    np.testing.assert_array_equal(ref_out, workspace.FetchBlob("out"))
    np.testing.assert_array_equal(ref_out_obj, workspace.FetchBlob("out_obj"))
    workspace.ResetWorkspace()
    outputs = WorkspacePredictor(init_net, predict_net).run([])
    assert len(outputs) == 2
    np.testing.assert_array_equal(outputs[0], ref_out)
    np.testing.assert_array_equal(outputs[1], ref_out_obj)


@pytest.mark.parametrize("dtype,op_type", [
    (np.float32, "GivenTensorFill"), (np.int32, "GivenTensorIntFill"),
    (np.int64, "GivenTensorInt64Fill"), (np.uint8, "GivenTensorByteStringToUInt8Fill")])
def test_add_tensor_per_dtype(dtype, op_type):
    net = caffe2_pb2.NetDef()
    value = np.arange(6).reshape(2, 3).astype(dtype)
    mobile_exporter.add_tensor(net, "b", value)
    (op,) = net.op
    args = {a.name: a for a in op.arg}
    assert (op.type, list(op.output), list(args["shape"].ints)) == (op_type, ["b"], [2, 3])
    if dtype == np.uint8:
        assert list(args["values"].strings) == [value.tobytes()]


def test_add_tensor_rejects_other_dtypes():
    with pytest.raises(KeyError):
        mobile_exporter.add_tensor(caffe2_pb2.NetDef(), "b", np.zeros(2, np.float64))


def test_uint8_and_int64_params_round_trip_through_init_net():
    values = {"u8": np.arange(12, dtype=np.uint8).reshape(3, 4),
              "i64": np.array([[1, -2], [3, 2 ** 40]], dtype=np.int64)}
    net = caffe2_pb2.NetDef()
    for name, value in values.items():
        mobile_exporter.add_tensor(net, name, value)
    workspace.RunNetOnce(net)
    for name, value in values.items():
        got = workspace.FetchBlob(name)
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)
