"""predictor_exporter / predictor_py_utils / serde: Caffe2's predictor_exporter_test cases
(caffe2-jobs-facts §1.3-1.8) plus the DB layout save_to_db writes."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.cnn import CNNModelHelper
from dpgraph.predictor import predictor_exporter as pe
from dpgraph.predictor import predictor_py_utils as pred_utils
from dpgraph.predictor import serde
from dpgraph.predictor_constants import predictor_constants as pc
from dpgraph.proto import caffe2_pb2, metanet_pb2


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


@pytest.fixture
def exported():
    m = CNNModelHelper()
    m.FC("data", "y", dim_in=5, dim_out=10, weight_init=m.XavierInit, bias_init=m.XavierInit)
    meta = pe.PredictorExportMeta(predict_net=m.net.Proto(), parameters=[str(b) for b in m.params],
                                  inputs=["data"], outputs=["y"],
                                  shapes={"y": (1, 10), "data": (1, 5)})
    workspace.RunNetOnce(m.param_init_net)
    params = {p: workspace.FetchBlob(p) for p in meta.parameters}
    workspace.ResetWorkspace()
    return m, meta, params


def test_constants_have_caffe2_values():
    assert pc.META_NET_DEF == "!!META_NET_DEF"
    assert pc.PREDICTOR_DBREADER == "!!PREDICTOR_DBREADER"
    assert pc.PREDICT_NET_TYPE == "PREDICT_NET_TYPE"
    assert pc.DEFERRED_BLOB_READER == "__DEFERRED_BLOB_READER__"
    assert pc.SHAPE_INFO_BLOB == "SHAPE_INFO_BLOB"


def test_meta_net_def_maps():
    meta_net_def = metanet_pb2.MetaNetDef()
    meta_net_def.nets.add(key="test_key", value=caffe2_pb2.NetDef(name="n"))
    assert metanet_pb2.NetsMap(key="k", value=caffe2_pb2.NetDef()).key == "k"
    pred_utils.AddBlobs(meta_net_def, "blob", ["AA"])
    pred_utils.AddBlobs(meta_net_def, "blob", ["BB"])
    assert list(pred_utils.GetBlobs(meta_net_def, "blob")) == ["AA", "BB"]
    pred_utils.ReplaceBlobs(meta_net_def, "blob", ["CC"])
    assert list(pred_utils.GetBlobs(meta_net_def, "blob")) == ["CC"]
    with pytest.raises(AssertionError, match="does not exist"):
        pred_utils.ReplaceBlobs(meta_net_def, "missing", ["x"])
    assert pred_utils.GetBlobs(meta_net_def, "missing") == []
    pred_utils.AddNet(meta_net_def, "test_key", caffe2_pb2.NetDef(name="second"))
    assert pred_utils.GetNet(meta_net_def, "test_key").name == "n"  # first match wins
    assert pred_utils.get_comp_name("TYPE", "") == "TYPE"
    assert pred_utils.get_comp_name("TYPE", "x") == "TYPE_x"
    blob = serde.serialize_protobuf_struct(meta_net_def)
    assert serde.deserialize_protobuf_struct(blob, metanet_pb2.MetaNetDef) == meta_net_def


def test_meta_constructor_and_names(exported):
    m, _, _ = exported
    meta = pe.PredictorExportMeta(predict_net=m.net, parameters=m.params, inputs=["data"],
                                  outputs=["y"], shapes={"y": (1, 10), "data": (1, 5)},
                                  name="sub", trainer_prefix="tr")
    assert isinstance(meta.predict_net, caffe2_pb2.NetDef)
    assert meta.parameters == ["y_w", "y_b"] and meta._fields[-1] == "trainer_prefix"
    assert meta.predict_net_name() == "PREDICT_NET_TYPE_sub"
    assert meta.train_plan_name() == "tr_TRAIN_PLAN_TYPE_sub"
    assert pe.PredictorExportMeta(m.net, [], [], []).shapes == {}


def test_param_intersection(exported):
    m, _, _ = exported
    with pytest.raises(AssertionError, match="inputs are required to be disjoint"):
        pe.PredictorExportMeta(m.net, m.params, inputs=["data", "y_w"], outputs=["y"])
    with pytest.raises(AssertionError, match="outputs are required to be disjoint"):
        pe.PredictorExportMeta(m.net, m.params, inputs=["data"], outputs=["y", "y_b"])
    with pytest.raises(AssertionError, match="unique"):
        pe.PredictorExportMeta(m.net, m.params, inputs=["data", "data"], outputs=["y"])


def _save(meta, params, tmp_path, **kwargs):
    for name, value in params.items():
        workspace.FeedBlob(name, value)
    path = str(tmp_path / "model.minidb")
    pe.save_to_db("minidb", path, meta, **kwargs)
    return path


def test_meta_net_def_net_runs(exported, tmp_path):
    _, meta, params = exported
    extra_init_net = core.Net("extra_init")
    extra_init_net.ConstantFill("data", "data", value=1.0)
    global_init_net = core.Net("global_init")
    global_init_net.ConstantFill([], "global_init_blob", value=1.0, shape=[1, 5],
                                 dtype=core.DataType.FLOAT)
    meta = meta._replace(extra_init_net=extra_init_net, global_init_net=global_init_net,
                         net_type="dag")
    path = _save(meta, params, tmp_path)
    workspace.ResetWorkspace()
    meta_net_def = pe.load_from_db(path, "minidb")
    assert not workspace.HasBlob("data") and not workspace.HasBlob("y")
    workspace.RunNetOnce(pred_utils.GetNet(meta_net_def, pc.PREDICT_INIT_NET_TYPE))
    np.testing.assert_array_equal(workspace.FetchBlob("data"), np.ones((1, 5)))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), np.zeros((1, 10)))
    assert not workspace.HasBlob("global_init_blob")
    workspace.RunNetOnce(pred_utils.GetNet(meta_net_def, pc.GLOBAL_INIT_NET_TYPE))
    np.testing.assert_array_equal(workspace.FetchBlob("global_init_blob"), np.ones((1, 5)))
    for name, value in params.items():
        np.testing.assert_array_equal(workspace.FetchBlob(name), value)
    data = np.random.RandomState(0).randn(2, 5).astype(np.float32)
    workspace.FeedBlob("data", data)
    predict = pred_utils.GetNet(meta_net_def, pc.PREDICT_NET_TYPE)
    assert predict.type == "dag"
    assert list(predict.external_input) == ["data", "y_w", "y_b"]
    workspace.RunNetOnce(predict)
    np.testing.assert_allclose(workspace.FetchBlob("y"),
                               data.dot(params["y_w"].T) + params["y_b"], rtol=1e-5)


def test_meta_net_def_order_and_global_init(exported, tmp_path):
    _, meta, params = exported
    meta_net_def = pe.get_meta_net_def(meta)
    assert [kv.key for kv in meta_net_def.nets] == [
        "PREDICT_INIT_NET_TYPE", "GLOBAL_INIT_NET_TYPE", "PREDICT_NET_TYPE"]
    assert [kv.key for kv in meta_net_def.blobs] == [
        "PARAMETERS_BLOB_TYPE", "INPUTS_BLOB_TYPE", "OUTPUTS_BLOB_TYPE"]
    (load,) = pred_utils.GetNet(meta_net_def, pc.GLOBAL_INIT_NET_TYPE).op
    assert (load.type, list(load.input), list(load.output), len(load.arg)) == (
        "Load", ["!!PREDICTOR_DBREADER"], ["y_w", "y_b"], 0)
    fills = pred_utils.GetNet(meta_net_def, pc.PREDICT_INIT_NET_TYPE).op
    assert [(op.type, op.output[0], op.HasField("device_option")) for op in fills] == [
        ("ConstantFill", "data", False), ("ConstantFill", "y", False)]
    assert not pe.get_meta_net_def(meta, db_type="manifold_db").nets[1].value.op


def test_prepare_prediction_net_and_db_layout(exported, tmp_path):
    _, meta, params = exported
    path = _save(meta, params, tmp_path)
    from dpgraph import db as dbmod

    db = dbmod.create_db("minidb", path, dbmod.Mode.read)
    cursor = db.new_cursor()
    keys = []
    while cursor.valid():
        keys.append(cursor.key())
        cursor.next()
    assert keys == [b"!!META_NET_DEF", b"y_w#%0", b"y_b#%0"]
    workspace.ResetWorkspace()
    net = pe.prepare_prediction_net(path, "minidb")
    data = np.random.RandomState(1).randn(1, 5).astype(np.float32)
    workspace.FeedBlob("data", data)
    workspace.RunNet(net.Proto().name)
    np.testing.assert_allclose(workspace.FetchBlob("y"),
                               data.dot(params["y_w"].T) + params["y_b"], rtol=1e-5)


def test_load_device_scope(exported, tmp_path):
    _, meta, params = exported
    path = _save(meta, params, tmp_path)
    workspace.ResetWorkspace()
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 1)):
        meta_net_def = pe.load_from_db(path, "minidb")
    for key in (pc.GLOBAL_INIT_NET_TYPE, pc.PREDICT_INIT_NET_TYPE):
        for op in pred_utils.GetNet(meta_net_def, key).op:
            assert (op.device_option.device_type, op.device_option.device_id) == (
                caffe2_pb2.CPU, 1)


def test_db_fails_without_params(exported, tmp_path):
    _, meta, _ = exported
    with pytest.raises(Exception, match="y_w"):  # noqa: B017  (Caffe2's test expects any)
        pe.save_to_db("minidb", str(tmp_path / "x.minidb"), meta)


def test_model_id_arg_reaches_every_net(exported):
    _, meta, _ = exported
    predict = caffe2_pb2.NetDef()
    predict.CopyFrom(meta.predict_net)
    predict.arg.add(name="model_id", i=42)
    meta = meta._replace(predict_net=predict)
    meta_net_def = pe.get_meta_net_def(meta)
    for kv in meta_net_def.nets:
        assert [a.i for a in kv.value.arg if a.name == "model_id"] == [42]
