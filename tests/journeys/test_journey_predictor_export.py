"""Journey 2: train with Parallelize, extract the predictor, save and load it, export it to
ONNX and run it with onnxruntime at several batch sizes, and use the ``dpgraph`` command on
the files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _journey_models import forward, parallelize, train

from dpgraph import cli, data_parallel_model, model_helper, workspace
from dpgraph.export import load_predictor, save_predictor, to_onnx
from dpgraph.export.commands import read_net
from dpgraph.ir import format_net, parse_net, verify_problems
from dpgraph.proto import caffe2_pb2

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

SHAPES = {"mlp": (8,), "cnn": (3, 4, 4), "bn": (3, 4, 4)}


def _trained_predictor(kind: str) -> tuple[Any, list[Any]]:
    """Train on 2 CPU devices, then extract cpu_0's predictor (BN: from a test model)."""
    bn = kind != "mlp"
    model = parallelize([0, 1], cpu=True, bn=bn, name=f"{kind}_train",
                        spatial_bn=kind == "bn")
    train(model, 3, bn=bn)
    source = model
    if kind == "bn":        # is_test=0 SpatialBN cannot be extracted: build the test model
        source = model_helper.ModelHelper(name="bn_test", init_params=False)
        data_parallel_model.Parallelize(source, lambda m: None, forward(True, is_test=True),
                                        devices=[0, 1], cpu_device=True)
    return data_parallel_model.ExtractPredictorNet(
        source, ["data"], ["softmax"], caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU))


def _dpgraph(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpgraph", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("kind", ["mlp", "cnn", "bn"])
def test_train_extract_save_load_onnx(kind: str, tmp_path: Path) -> None:
    predict_net, params = _trained_predictor(kind)
    proto = predict_net.Proto()
    assert list(proto.external_output) == ["softmax"]
    assert verify_problems(proto) == [] and parse_net(format_net(proto)) == proto
    expected_params = {str(p): workspace.FetchBlob(str(p)) for p in params}

    out = tmp_path / "out"
    save_predictor(out, predict_net, params)
    assert {p.name for p in out.iterdir()} == {"predict_net.pb", "init_net.pb"}
    predictor = load_predictor(out)
    assert predictor.inputs == ["data"]
    loaded_workspace, loaded_net = predictor                 # tuple-style unpacking
    assert loaded_workspace is predictor.workspace
    for name, value in expected_params.items():
        assert np.array_equal(predictor.workspace.fetch_blob(name), value)

    init = read_net(out / "init_net.pb")
    predict = read_net(out / "predict_net.pb")
    model = to_onnx(predict, init, inputs={"data": (("N", *SHAPES[kind]), "float32")})
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(7)
    for batch in (1, 3, 8):
        x = rng.normal(size=(batch, *SHAPES[kind])).astype(np.float32)
        (probabilities,) = predictor.run({"data": x})
        assert probabilities.shape == (batch, 3) and probabilities.dtype == np.float32
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
        (again,) = predictor.run([x])
        assert np.array_equal(again, probabilities)
        (onnx_probabilities,) = session.run(None, {"data": x})
        np.testing.assert_allclose(onnx_probabilities, probabilities, rtol=1e-5, atol=1e-6)
    # the caller's workspace is untouched by the predictor
    assert not workspace.HasBlob("softmax")


def test_cnn_predictor_onnx_at_several_batch_sizes() -> None:
    model = parallelize([0, 1, 2, 3], cpu=True, bn=True, name="cnn_train")
    train(model, 2, bn=True)
    test_model = model_helper.ModelHelper(name="cnn_test", init_params=False)
    data_parallel_model.Parallelize(test_model, lambda m: None, forward(True, is_test=True),
                                    devices=[0, 1, 2, 3], cpu_device=True)
    predict_net, params = data_parallel_model.ExtractPredictorNet(
        test_model, ["data"], ["softmax"], caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU))
    values = {str(p): workspace.FetchBlob(str(p)) for p in params}
    model_onnx = to_onnx(predict_net, values, inputs={"data": ("N", 3, 4, 4)})
    session = ort.InferenceSession(model_onnx.SerializeToString())
    for batch in (2, 5):
        x = np.random.default_rng(batch).normal(size=(batch, 3, 4, 4)).astype(np.float32)
        workspace.FeedBlob("data", x)
        workspace.RunNetOnce(predict_net)
        np.testing.assert_allclose(session.run(None, {"data": x})[0],
                                   workspace.FetchBlob("softmax"), rtol=1e-5, atol=1e-6)


def test_cli_on_saved_predictor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    predict_net, params = _trained_predictor("bn")
    out = tmp_path / "out"
    save_predictor(out, predict_net, params)
    predict, init = str(out / "predict_net.pb"), str(out / "init_net.pb")

    assert cli.main(["inspect", predict, "--init", init]) == 0
    text = capsys.readouterr().out
    assert "SpatialBN  1" in text and "cpu_0/conv_w  float32  4x3x3x3  108" in text
    assert text.rstrip().endswith("verify: ok")
    assert cli.main(["inspect", init]) == 0
    assert "GivenTensorFill  8" in capsys.readouterr().out
    assert cli.main(["verify", predict, "--init", init]) == 0
    assert capsys.readouterr().out == f"{predict}: ok (6 ops)\n"

    dot = tmp_path / "net.dot"
    assert cli.main(["draw", predict, "-o", str(dot), "--rankdir", "LR"]) == 0
    assert dot.read_text().startswith("digraph") and "rankdir=LR" in dot.read_text()
    assert capsys.readouterr().out == f"wrote {dot}\n"

    onnx_path = tmp_path / "model.onnx"
    assert cli.main(["export-onnx", predict, init, "-o", str(onnx_path),
                     "--input", "data:Nx3x4x4"]) == 0
    assert capsys.readouterr().out == (
        f"wrote {onnx_path} (opset 17, 7 nodes, 8 initializers)\n")
    exported = onnx.load(str(onnx_path))
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"

    assert cli.main(["export-onnx", predict, init, "-o", str(onnx_path)]) == 2
    assert capsys.readouterr().err == (
        "dpgraph export-onnx: error: give the shape of data input(s) data with --input "
        "NAME:SHAPE[:DTYPE], e.g. --input data:1x3x8x8\n")

    # text-format copies of the predict net work the same way
    text_net = tmp_path / "predict.txt"
    text_net.write_text(format_net(read_net(predict)))
    assert cli.main(["verify", str(text_net), "--init", init]) == 0
    assert read_net(text_net) == read_net(predict)


def test_cli_help_and_module_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("inspect", "draw", "verify", "export-onnx", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: dpgraph {command}")
    result = _dpgraph("verify", "missing.pb")
    assert result.returncode == 2
    assert result.stderr.startswith("dpgraph verify: error: ")


def test_cli_output_piped_into_a_closed_reader_is_quiet(tmp_path: Path) -> None:
    # ``dpgraph inspect net.pb | head`` must not end in a BrokenPipeError traceback.
    net = caffe2_pb2.NetDef(name="n", external_input=["x"])
    net.op.add(type="Relu", input=["x"], output=["y"])
    (tmp_path / "net.pb").write_bytes(net.SerializeToString())
    result = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m dpgraph inspect net.pb | true"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.stderr == ""


def test_cli_on_parallelized_training_nets(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    model = parallelize([0, 1], cpu=False, bn=True, use_nccl=True)
    train_pb, init_pb = tmp_path / "train.pb", tmp_path / "init.pb"
    train_pb.write_bytes(model.net.Proto().SerializeToString())
    init_pb.write_bytes(model.param_init_net.Proto().SerializeToString())
    (tmp_path / "train.txt").write_text(format_net(model.net))

    assert cli.main(["inspect", str(train_pb), "--init", str(init_pb)]) == 0
    report = capsys.readouterr().out
    assert "NCCLAllreduce" in report and report.rstrip().endswith("verify: ok")
    # the optimizer fills its ONE_1_<id> blob once per parameter: listed once each
    rows = [line.split()[0] for line in report.split("parameters (")[1].splitlines()[1:-1]]
    assert len(rows) == len(set(rows)) and {"ONE_1_0", "ONE_1_1"} <= set(rows)
    assert f"parameters ({len(rows)}," in report
    for path in (train_pb, tmp_path / "train.txt", init_pb):
        assert cli.main(["verify", str(path)]) == 0
    assert cli.main(["export-onnx", str(train_pb), str(init_pb), "-o",
                     str(tmp_path / "m.onnx")]) == 1    # before asking for --input shapes
    assert "unsupported op(s)" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("device_id", [0, 1])
def test_predictor_from_virtual_gpus_for_any_device(device_id: int, tmp_path: Path) -> None:
    model = parallelize([0, 1], cpu=False)
    train(model, 2)
    device = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA, device_id=device_id)
    predict_net, params = data_parallel_model.ExtractPredictorNet(
        model, ["data"], ["softmax"], device)
    proto = predict_net.Proto()
    assert {op.device_option.device_id for op in proto.op} == {device_id}
    assert all(str(p).startswith("gpu_0/") for p in params)   # Caffe2 keeps gpu_0 names
    # All blobs live on the predictor's device, whatever their names say: no complaint.
    assert verify_problems(proto) == []
    save_predictor(tmp_path, predict_net, params)
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    (probabilities,) = load_predictor(tmp_path).run([x])
    values = {str(p): workspace.FetchBlob(str(p)) for p in params}
    session = ort.InferenceSession(
        to_onnx(predict_net, values, {"data": ("N", 8)}).SerializeToString())
    np.testing.assert_allclose(session.run(None, {"data": x})[0], probabilities,
                               rtol=1e-5, atol=1e-6)
