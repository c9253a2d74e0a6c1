"""Done-when of the jobs issue: models.resnet.create_resnet_32x32 Parallelized on 2 virtual
GPUs, trained 5 iterations, exported with predictor_exporter.save_to_db("minidb", ...),
loaded in a fresh process with load_from_db + GetNet and predicting bitwise the training
workspace's (test-model) outputs; the same model through mobile_exporter.Export and ONNX."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from dpgraph import core, data_parallel_model, optimizer, workspace
from dpgraph.export.predictor import WorkspacePredictor, load_predictor
from dpgraph.export.predictor_exporter import (
    parallel_model_export_meta,
    save_parallel_model,
)
from dpgraph.model_helper import ModelHelper
from dpgraph.models import resnet
from dpgraph.predictor import mobile_exporter
from dpgraph.proto import caffe2_pb2

DEVICES = [0, 1]
BATCH = 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(2)
    rng = np.random.RandomState(7)

    def forward(model, loss_scale):
        softmax = resnet.create_resnet_32x32(model, "data", num_input_channels=3,
                                             num_groups=1, num_labels=10)
        xent = model.LabelCrossEntropy([softmax, "label"], "xent")
        return [model.AveragedLoss(xent, "loss")]

    train = ModelHelper(name="r32_train")
    data_parallel_model.Parallelize(
        train, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.05, momentum=0.9),
        devices=DEVICES)
    for d in DEVICES:
        with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, d)):
            workspace.FeedBlob(f"gpu_{d}/data", rng.rand(BATCH, 3, 32, 32).astype(np.float32))
            workspace.FeedBlob(f"gpu_{d}/label", rng.randint(10, size=BATCH).astype(np.int32))
    workspace.RunNetOnce(train.param_init_net)
    workspace.CreateNet(train.net)
    for _ in range(5):
        workspace.RunNet(train.net.Proto().name)
    assert int(np.asarray(workspace.FetchBlob("optimizer_iteration")).item()) == 5

    test = ModelHelper(name="r32_test", init_params=False)
    data_parallel_model.Parallelize(
        test, input_builder_fun=lambda m: None,
        forward_pass_builder_fun=lambda m, loss_scale: resnet.create_resnet_32x32(
            m, "data", 3, 1, 10, is_test=True) and [],
        param_update_builder_fun=None, devices=DEVICES)
    workspace.RunNetOnce(test.param_init_net)
    workspace.CreateNet(test.net)
    x = rng.rand(BATCH, 3, 32, 32).astype(np.float32)
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        workspace.FeedBlob("gpu_0/data", x)
    workspace.RunNet(test.net.Proto().name)
    reference = np.asarray(workspace.FetchBlob("gpu_0/softmax"))
    yield types.SimpleNamespace(train=train, test=test, x=x, reference=reference,
                                tmp=tmp_path_factory.mktemp("e2e"))
    workspace.ResetWorkspace()


def test_trained_model_exports_without_device_prefixes(trained):
    meta, sources = parallel_model_export_meta(trained.test, ["data"], ["softmax"])
    blobs = {b for op in meta.predict_net.op for b in list(op.input) + list(op.output)}
    assert not any(b.startswith(("gpu_", "cpu_")) for b in blobs)
    assert "conv1_w" in meta.parameters and sources["conv1_w"] == "gpu_0/conv1_w"
    assert all(op.device_option.device_type == caffe2_pb2.CPU for op in meta.predict_net.op)
    assert trained.test.net.Proto().op[0].device_option.device_type == caffe2_pb2.CUDA


def test_minidb_predictor_in_a_fresh_process_is_bitwise_equal(trained):
    path = str(trained.tmp / "resnet32.minidb")
    blobs_before = set(workspace.Blobs())
    meta = save_parallel_model("minidb", path, trained.test, ["data"], ["softmax"])
    assert set(workspace.Blobs()) == blobs_before  # the training workspace is untouched
    assert meta.shapes["data"] == (BATCH, 3, 32, 32)
    np.save(trained.tmp / "x.npy", trained.x)
    script = textwrap.dedent(f"""
        import numpy as np
        from dpgraph.compat import caffe2 as alias
        alias.install()
        from caffe2.python import workspace
        from caffe2.python.predictor import predictor_exporter as pred_exp
        from caffe2.python.predictor import predictor_py_utils as pred_utils
        from caffe2.python.predictor_constants import predictor_constants as pc
        m = pred_exp.load_from_db({path!r}, "minidb")
        assert workspace.RunNetOnce(pred_utils.GetNet(m, pc.GLOBAL_INIT_NET_TYPE))
        assert workspace.RunNetOnce(pred_utils.GetNet(m, pc.PREDICT_INIT_NET_TYPE))
        workspace.FeedBlob("data", np.load({str(trained.tmp / 'x.npy')!r}))
        workspace.RunNetOnce(pred_utils.GetNet(m, pc.PREDICT_NET_TYPE))
        np.save({str(trained.tmp / 'out.npy')!r}, workspace.FetchBlob("softmax"))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    out = np.load(trained.tmp / "out.npy")
    assert out.dtype == trained.reference.dtype
    np.testing.assert_array_equal(out, trained.reference)
    # dpgraph's own loader reads the same DB through the same MetaNetDef reader
    predictor = load_predictor(path)
    assert predictor.inputs == ["data"]
    (own,) = predictor.run({"data": trained.x})
    np.testing.assert_array_equal(own, trained.reference)


def _params(sources):
    return {name: np.asarray(workspace.FetchBlob(blob)) for name, blob in sources.items()}


def test_mobile_exporter_and_onnx_match(trained):
    meta, sources = parallel_model_export_meta(trained.test, ["data"], ["softmax"])
    values = _params(sources)
    init_net, predict_net = mobile_exporter.Export(
        types.SimpleNamespace(FetchBlob=values.__getitem__), meta.predict_net,
        meta.parameters)
    assert len(init_net.op) == len(meta.parameters) + 1  # + the data placeholder
    assert list(predict_net.external_input)[0] == "data"
    assert list(predict_net.external_output) == ["softmax"]
    (out,) = WorkspacePredictor(init_net, predict_net).run([trained.x])
    np.testing.assert_array_equal(out, trained.reference)

    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from dpgraph.export import to_onnx

    model = to_onnx(predict_net, values, {"data": trained.x.shape})
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"data": trained.x})
    np.testing.assert_allclose(onnx_out, trained.reference, rtol=1e-4, atol=1e-6)
