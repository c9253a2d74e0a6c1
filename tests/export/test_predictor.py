"""save_predictor / load_predictor: the predict_net.pb + init_net.pb pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _export_models import MODELS

from dpgraph import workspace
from dpgraph.errors import ExportError, ProtoError
from dpgraph.export import load_predictor, make_init_net, save_predictor
from dpgraph.export.predictor import INIT_NET_FILE, PREDICT_NET_FILE, fill_op
from dpgraph.ir.proto_io import read_proto
from dpgraph.proto import caffe2_pb2


def _reference(predict_net: object, input_name: str, x: np.ndarray) -> list[np.ndarray]:
    workspace.FeedBlob(input_name, x)
    workspace.RunNetOnce(predict_net)
    return [workspace.FetchBlob(b) for b in predict_net.Proto().external_output]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_saved_predictor_reloads_with_same_outputs(name: str, tmp_path: Path) -> None:
    predict_net, params, input_name, shape = MODELS[name]()
    save_predictor(tmp_path, predict_net, params)
    rng = np.random.default_rng(5)
    current, blobs = workspace.CurrentWorkspace(), set(workspace.Blobs())
    predictor = load_predictor(tmp_path)
    first = rng.standard_normal((3, *shape)).astype(np.float32)
    predictor.run({input_name: first})
    # the predictor runs in its own workspace: the caller's is untouched
    assert workspace.CurrentWorkspace() == current and set(workspace.Blobs()) == blobs
    assert predictor.inputs == [input_name]
    for batch in (1, 7):
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        got = predictor.run({input_name: x})
        want = _reference(predict_net, input_name, x)
        assert len(got) == len(want) == 1
        for g, w in zip(got, want):
            assert g.shape == w.shape == (batch, g.shape[1])
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_files_are_plain_netdefs_with_given_tensor_fills(tmp_path: Path) -> None:
    predict_net, params, _, _ = MODELS["mlp"]()
    predict_file, init_file = save_predictor(tmp_path, predict_net, params)
    assert (predict_file.name, init_file.name) == (PREDICT_NET_FILE, INIT_NET_FILE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [INIT_NET_FILE, PREDICT_NET_FILE]
    init = caffe2_pb2.NetDef.FromString(init_file.read_bytes())
    assert {op.type for op in init.op} == {"GivenTensorFill"}
    assert sorted(init.external_output) == sorted(params)
    for op in init.op:
        args = {a.name: a for a in op.arg}
        value = workspace.FetchBlob(op.output[0])
        assert list(args["shape"].ints) == list(value.shape)
        np.testing.assert_array_equal(np.asarray(args["values"].floats, np.float32),
                                      value.ravel())
    assert read_proto(caffe2_pb2.NetDef, predict_file) == predict_net.Proto()


def test_unpacks_as_workspace_and_net(tmp_path: Path) -> None:
    predict_net, params, _, _ = MODELS["mlp"]()
    save_predictor(tmp_path, predict_net, params)
    ws, net = load_predictor(tmp_path)
    assert net == predict_net.Proto()
    assert set(params) <= set(ws.blobs())
    assert ws is not None and workspace.CurrentWorkspace() != ws.name


@pytest.mark.parametrize("value, fill", [
    (np.arange(6, dtype=np.int32).reshape(2, 3), "GivenTensorIntFill"),
    (np.arange(4, dtype=np.int64), "GivenTensorInt64Fill"),
    (np.array([True, False, True]), "GivenTensorBoolFill"),
    (np.array([b"a", b"bc"], dtype=object), "GivenTensorStringFill"),
    (np.linspace(0, 1, 5), "GivenTensorDoubleFill"),
])
def test_typed_fills_round_trip(value: np.ndarray, fill: str, tmp_path: Path) -> None:
    assert fill_op("p", value).type == fill
    net = caffe2_pb2.NetDef(name="ident")
    op = net.op.add(type="Copy", input=["p"], output=["q"])
    del op  # Copy keeps the dtype
    net.external_input.append("p")
    net.external_output.append("q")
    save_predictor(tmp_path, net, {"p": value})
    predictor = load_predictor(tmp_path)
    assert predictor.inputs == []
    (got,) = predictor.run({})
    assert got.dtype == value.dtype
    np.testing.assert_array_equal(got, value)


def test_missing_params_are_all_named(tmp_path: Path) -> None:
    predict_net, params, _, _ = MODELS["mlp"]()
    with pytest.raises(ExportError, match="2 parameter.*nope_a, nope_b"):
        save_predictor(tmp_path, predict_net, [*params, "nope_a", "nope_b"])
    assert not (tmp_path / PREDICT_NET_FILE).exists()


def test_unsupported_dtype_and_file_path(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="complex64"):
        make_init_net({"c": np.zeros(2, np.complex64)})
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ExportError, match="not a directory"):
        save_predictor(afile, caffe2_pb2.NetDef(), {})


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ProtoError, match="does not exist"):
        load_predictor(tmp_path / "missing")
    with pytest.raises(ProtoError, match="cannot read"):
        load_predictor(tmp_path)
    predict_net, params, _, _ = MODELS["mlp"]()
    save_predictor(tmp_path, predict_net, params)
    (tmp_path / INIT_NET_FILE).write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(ProtoError, match="not a valid serialized NetDef"):
        load_predictor(tmp_path)


def test_run_rejects_unknown_inputs(tmp_path: Path) -> None:
    predict_net, params, _, _ = MODELS["mlp"]()
    save_predictor(tmp_path, predict_net, params)
    predictor = load_predictor(tmp_path)
    with pytest.raises(ExportError, match="unknown predictor input"):
        predictor.run({"datum": np.zeros((1, 10), np.float32)})
    with pytest.raises(ExportError, match="takes 1 input"):
        predictor.run([])
    (out,) = predictor.run([np.zeros((2, 10), np.float32)])
    assert out.shape == (2, 5)
