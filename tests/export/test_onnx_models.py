"""ONNX export of whole predictors (MLP, CNN with BN/pooling, a Parallelize-trained CNN)
and the exporter's errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _export_helpers import assert_outputs_close, check_model, make_net, op, run_onnx
from _export_models import MODELS

from dpgraph.errors import ExportError
from dpgraph.export import load_predictor, save_predictor, to_onnx

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_matches_saved_predictor(name: str, tmp_path: Path) -> None:
    predict_net, params, input_name, shape = MODELS[name]()
    save_predictor(tmp_path, predict_net, params)
    predictor = load_predictor(tmp_path)
    model = to_onnx(predictor.predict_net, predictor.init_net,
                    inputs={input_name: (("batch", *shape), "float32")})
    check_model(model)
    assert [o.name for o in model.graph.output] == list(predict_net.Proto().external_output)
    assert [i.name for i in model.graph.input] == [input_name]
    rng = np.random.default_rng(11)
    for batch in (1, 7):
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        assert_outputs_close(run_onnx(model, {input_name: x}), predictor.run({input_name: x}))


def test_fixed_batch_and_params_dict() -> None:
    predict_net, params, input_name, shape = MODELS["cnn"]()
    from dpgraph import workspace

    values = {p: workspace.FetchBlob(p) for p in params}
    model = to_onnx(predict_net, values, inputs={input_name: (7, *shape)}, opset=13)
    check_model(model)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [7, *shape]
    assert {i.name for i in model.graph.initializer} >= set(params)
    x = np.random.default_rng(3).standard_normal((7, *shape)).astype(np.float32)
    workspace.FeedBlob(input_name, x)
    workspace.RunNetOnce(predict_net)
    assert_outputs_close(run_onnx(model, {input_name: x}), [workspace.FetchBlob("softmax")])


def test_every_unsupported_op_is_listed() -> None:
    net = make_net([op("Relu", ["x"], ["a"]), op("LRN", ["a"], ["b"], size=3),
                    op("SpatialBN", ["b", "s", "o", "m", "v"], ["c", "m", "v", "sm", "sv"]),
                    op("RoIAlign", ["c", "r"], ["d"]), op("LRN", ["d"], ["e"], size=3)],
                   ["x", "s", "o", "m", "v", "r"], ["e"], name="bad")
    with pytest.raises(ExportError) as caught:
        to_onnx(net, {}, inputs={"x": (1, 2, 3, 3)})
    message = str(caught.value)
    for fragment in ("4 unsupported op(s)", "LRN, RoIAlign, SpatialBN", "op 1 (LRN)",
                     "op 2 (SpatialBN)", "is_test=0", "op 3 (RoIAlign)", "op 4 (LRN)"):
        assert fragment in message
    assert "op 0" not in message
    assert [(i, t) for i, t, _ in caught.value.unsupported] == [
        (1, "LRN"), (2, "SpatialBN"), (3, "RoIAlign"), (4, "LRN")]


def test_input_and_opset_errors() -> None:
    net = make_net([op("Relu", ["x"], ["y"])], ["x"], ["y"])
    with pytest.raises(ExportError, match=r"needs input\(s\) \['x'\]"):
        to_onnx(net, {}, inputs={})
    with pytest.raises(ExportError, match="opset 9 is not supported"):
        to_onnx(net, {}, inputs={"x": (1, 2)}, opset=9)
    with pytest.raises(ExportError, match="no external outputs"):
        to_onnx(make_net([op("Relu", ["x"], ["y"])], ["x"], []), {}, inputs={"x": (1, 2)})
    with pytest.raises(ExportError, match="failed while inferring shapes"):
        to_onnx(make_net([op("FC", ["x", "w", "b"], ["y"])], ["x", "w", "b"], ["y"]),
                {"w": np.zeros((3, 4), np.float32), "b": np.zeros(3, np.float32)},
                inputs={"x": (1, 5)})


def test_outputs_argument_and_in_place_names() -> None:
    net = make_net([op("Relu", ["x"], ["h"]), op("Scale", ["h"], ["h"], scale=2.0),
                    op("Sigmoid", ["h"], ["y"])], ["x"], ["y"])
    model = to_onnx(net, {}, inputs={"x": ((None, 3), np.float32)}, outputs=["h", "y"])
    check_model(model)
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    h, y = run_onnx(model, {"x": x})
    np.testing.assert_allclose(h, np.maximum(x, 0) * 2)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-h)), rtol=1e-6)


def test_last_write_keeps_the_blob_name() -> None:
    net = make_net([op("FC", ["x", "w", "b"], ["h"]), op("Relu", ["h"], ["h"])],
                   ["x", "w", "b"], ["h"])
    params = {"w": np.ones((2, 3), np.float32), "b": np.zeros(2, np.float32)}
    model = to_onnx(net, params, inputs={"x": (1, 3)})
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu"]
    assert model.graph.node[-1].output[0] == "h" and model.graph.node[0].output[0] != "h"


def test_init_net_with_other_fill_ops() -> None:
    init = make_net([op("ConstantFill", [], ["w"], shape=[2, 3], value=0.5),
                     op("GivenTensorFill", [], ["b"], shape=[2], values=[1.0, -1.0])],
                    [], ["w", "b"])
    net = make_net([op("FC", ["x", "w", "b"], ["y"])], ["x", "w", "b"], ["y"])
    model = to_onnx(net, init, inputs={"x": ((None, 3), "float32")})
    check_model(model)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run_onnx(model, {"x": x})
    np.testing.assert_allclose(y, x @ np.full((3, 2), 0.5, np.float32) + [1.0, -1.0])
