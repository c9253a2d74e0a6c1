"""Caffe2's blob naming, op arguments and helper behaviour of the RNN builders (the worked
examples of the RNN facts), predictor extraction of an LSTM, BasicRNN and the errors."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, rnn_cell, scope, workspace
from dpgraph.errors import ModelError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.model_helper import ExtractPredictorNet, ModelHelper
from dpgraph.proto import caffe2_pb2
from dpgraph.rnn.rnn_cell_test_util import _prepare_rnn


def _rnn_op(net: core.Net, op_type: str = "RecurrentNetwork") -> caffe2_pb2.OperatorDef:
    return next(op for op in net.Proto().op if op.type == op_type)


def test_char_rnn_names() -> None:
    model = ModelHelper(name="char_rnn")
    refs = model.net.AddExternalInputs("input_blob", "seq_lengths", "hidden_init", "cell_init")
    outputs = rnn_cell.LSTM(model, refs[0], refs[1], (refs[2], refs[3]), 5, 7, scope="LSTM")
    assert [str(o) for o in outputs] == ["LSTM/hidden_state_all", "LSTM/hidden_state_last",
                                         "LSTM/cell_state_all", "LSTM/cell_state_last"]
    assert [str(p) for p in model.params] == ["LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w",
                                              "LSTM/gates_t_b"]
    op = _rnn_op(model.net)
    args = arguments_dict(op.arg)
    assert [a.name for a in op.arg] == [
        "alias_src", "alias_dst", "alias_offset", "recurrent_states",
        "initial_recurrent_state_ids", "link_internal", "link_external", "link_offset",
        "enable_rnn_executor", "step_net", "timestep", "param", "param_grads",
        "backward_link_internal", "backward_link_external", "backward_link_offset",
        "outputs_with_grads", "recompute_blobs_on_backward", "backward_step_net"]
    assert args["recurrent_states"] == ["LSTM/LSTM/hidden_t_prev_states",
                                        "LSTM/LSTM/cell_t_prev_states"]
    assert args["param"] == [3, 4] and args["initial_recurrent_state_ids"] == [1, 2]
    assert args["param_grads"] == ["LSTM/gates_t_w_grad", "LSTM/gates_t_b_grad"]
    assert list(args["step_net"].external_input) == [
        "input_t", "timestep", "LSTM/hidden_t_prev", "LSTM/cell_t_prev", "LSTM/gates_t_w",
        "LSTM/gates_t_b", "seq_lengths"]
    assert args["backward_link_internal"][-1] == "LSTM/gates_t_grad"
    assert op.output[-1] == "LSTM/step_workspaces"
    model.AddGradientOperators([model.net.SumElements(outputs[0], "loss")])
    grad = _rnn_op(model.net, "RecurrentNetworkGradient")
    assert grad.input[0] == "LSTM/hidden_state_all_grad"
    assert list(grad.output) == ["LSTM/i2h_grad", "LSTM/gates_t_w_grad",
                                 "LSTM/gates_t_b_grad", "hidden_init_grad", "cell_init_grad"]


def test_prepare_rnn_input_order_and_multi_layer_state_names() -> None:
    workspace.ResetWorkspace()
    _, net, _ = _prepare_rnn(4, 3, 2, rnn_cell.LSTM, [0], 0.0)
    assert list(_rnn_op(net).input) == [
        "test_name_scope/external/recurrent/i2h", "state_0/layer_0", "state_1/layer_0",
        "test_name_scope/external/recurrent/gates_t_w",
        "test_name_scope/external/recurrent/gates_t_b", "test_name_scope/seq_lengths"]
    model = ModelHelper(name="multi")
    states = model.net.AddExternalInputs("h0", "c0", "h1", "c1")
    outputs = rnn_cell.LSTM(model, "x", "lengths", states, dim_in=2, dim_out=[3, 3],
                            return_last_layer_only=False)
    assert str(outputs[0]) == "layer_0/hidden_state_all"
    args = arguments_dict(_rnn_op(model.net).arg)
    assert args["recurrent_states"][0] == "multi/recurrent/None/layer_0/hidden_t_prev_states"
    assert _rnn_op(model.net).output[-1] == "multi/recurrent/step_workspaces"
    assert "layer_1/i2h_w" in [str(p) for p in model.params]


def test_attention_input_order() -> None:
    model = ModelHelper(name="attention")
    names = ["decoder_inputs", "decoder_input_lengths", "h0", "c0", "awec0",
             "encoder_outputs", "encoder_lengths"]
    refs = model.net.AddExternalInputs(*names)
    out = rnn_cell.LSTMWithAttention(model, refs[0], refs[1], refs[2], refs[3], refs[4], 4,
                                     refs[5], refs[6], 3, 5, scope="S")
    assert [str(o) for o in out][::2] == ["S/hidden_t_external_all",
                                          "S/decoder/cell_state_all",
                                          "S/attention_weighted_encoder_context_all"]
    op = model.net.Proto().op[-2]
    assert op.type == "RecurrentNetwork"
    assert list(op.input) == [
        "S/decoder/i2h", "h0", "c0", "awec0", "S/decoder/gates_t_w", "S/decoder/gates_t_b",
        "decoder_input_lengths", "S/weighted_decoder_hidden_state_w",
        "S/weighted_decoder_hidden_state_b", "S/weighted_encoder_outputs",
        "S/attention_logits_w", "S/attention_logits_b", "encoder_lengths",
        "S/encoder_outputs_transposed"]


def test_lstm_extract_predictor_net() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="lstm_extract_test")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
        output, _, _, _ = rnn_cell.LSTM(model, "input", "seqlengths",
                                        ("hidden_init", "cell_init"), dim_in=4, dim_out=3,
                                        scope="test_lstm", forward_only=False)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("input", np.random.randn(5, 2, 4).astype(np.float32))
    workspace.FeedBlob("seqlengths", np.array([5, 3], np.int32))
    for name in ("hidden_init", "cell_init"):
        workspace.FeedBlob(name, np.random.randn(1, 2, 3).astype(np.float32))
    workspace.RunNetOnce(model.net)
    expected = workspace.FetchBlob(output)
    predict_net, export_blobs = ExtractPredictorNet(
        net_proto=model.net.Proto(), input_blobs=["input"], output_blobs=[output],
        device=core.DeviceOption(caffe2_pb2.CPU, 1))
    proto = predict_net.Proto()
    assert "seqlengths" in proto.external_input
    for name in proto.external_input:
        assert name in ("input", "seqlengths") or name in export_blobs
    rnn = _rnn_op(predict_net)
    backward = [a for a in rnn.arg if a.name == "backward_step_net"][0]
    assert backward.n == caffe2_pb2.NetDef()
    step = [a for a in rnn.arg if a.name == "step_net"][0].n
    assert all((op.device_option.device_type, op.device_option.device_id) == (0, 1)
               for op in step.op)
    workspace.CreateNet(predict_net)
    workspace.RunNet(predict_net.Proto().name)
    np.testing.assert_allclose(workspace.FetchBlob(output), expected, rtol=1e-6)


def test_basic_rnn_matches_numpy() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="basic_rnn")
    t_len, n, d_in, h = 4, 3, 2, 5
    refs = model.net.AddExternalInputs("x", "lengths", "h0")
    hidden_all, hidden_last = rnn_cell.BasicRNN(model, refs[0], refs[1], [refs[2]], d_in, h,
                                                scope="basic_rnn", activation="tanh",
                                                forward_only=True)
    assert str(hidden_all) == "basic_rnn/hidden_t_all"
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
              (("basic_rnn/i2h_w", (h, d_in)), ("basic_rnn/i2h_b", (h,)),
               ("basic_rnn/gates_t_w", (h, h)), ("basic_rnn/gates_t_b", (h,)),
               ("x", (t_len, n, d_in)), ("h0", (n, h)))}
    lengths = np.array([4, 1, 2], np.int32)
    workspace.RunNetOnce(model.param_init_net)
    for name, value in values.items():
        workspace.FeedBlob(name, value)
    workspace.FeedBlob("lengths", lengths)
    workspace.RunNetOnce(model.net)
    state, expected = values["h0"], []
    for t in range(t_len):
        new = np.tanh(values["x"][t] @ values["basic_rnn/i2h_w"].T + values["basic_rnn/i2h_b"]
                      + state @ values["basic_rnn/gates_t_w"].T + values["basic_rnn/gates_t_b"])
        valid = (t < lengths)[:, None]
        state = np.where(valid, new, state)
        expected.append(state)
    np.testing.assert_allclose(workspace.FetchBlob(hidden_all), np.stack(expected), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(hidden_last)[0], expected[-1], rtol=1e-5)


def test_helper_errors() -> None:
    with pytest.raises(RuntimeError, match="unknown activation"):
        rnn_cell.BasicRNNCell(2, 3, 0.0, False, activation="sigmoid")
    with pytest.raises(AssertionError, match="is_test"):
        rnn_cell.DropoutCell(rnn_cell.LSTMCell(2, 3, 0.0, False), dropout_ratio=0.5)
    with pytest.raises(AssertionError, match="Only one input blob"):
        rnn_cell.recurrent.recurrent_net(core.Net("n"), core.Net("c"), [("a", "b"), ("c", "d")],
                                         [], {})
    model = ModelHelper(name="bad_states")
    with pytest.raises(Exception, match="doesn't match the number of states"):
        rnn_cell.LSTM(model, "x", None, ["h0"], 2, 3)
    with pytest.raises(Exception, match="Unknown blob reference type"):
        rnn_cell._RectifyName(3)
    assert isinstance(ModelError("x"), AssertionError)


def test_lstm_initializer_params_get_batch_summed_gradients() -> None:
    workspace.ResetWorkspace()
    model = ModelHelper(name="init_states")
    with scope.NameScope("outer"):
        out = rnn_cell.LSTM(model, "x", None, None, 2, 3, scope="enc")
    names = [str(p) for p in model.params]
    assert "outer/enc/initial_hidden_state" in names
    model.AddGradientOperators([model.net.SumElements(out[0], "loss")])
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("outer/x", np.random.randn(3, 4, 2).astype(np.float32))
    workspace.RunNetOnce(model.net)
    grad = workspace.FetchBlob(str(model.param_to_grad[core.BlobReference(
        "outer/enc/initial_hidden_state")]))
    assert grad.shape == (3,) and np.any(grad != 0)


def test_small_helpers() -> None:
    from dpgraph import recurrent
    from dpgraph.errors import NotSupportedError

    workspace.ResetWorkspace()
    model = ModelHelper(name="helpers")
    out = rnn_cell.LSTM(model, "x", None, ["h0", "c0"], 2, 3, scope="L", return_params=True)
    params = out[-1]
    assert params == {"input": {"weights": "L/i2h_w", "biases": "L/i2h_b"},
                      "recurrent": {"weights": "L/gates_t_w", "biases": "L/gates_t_b"}}
    op = _rnn_op(model.net)
    recurrent.set_rnn_executor_config(op, num_threads=4, max_cuda_streams=2)
    assert arguments_dict(op.arg)["rnn_executor.num_threads"] == 4
    with pytest.raises(ModelError):
        recurrent.set_rnn_executor_config(model.net.Proto().op[0])
    assert rnn_cell.GetLSTMParamNames()["biases"][0] == "input_gate_b"
    workspace.RunNetOnce(model.param_init_net)
    names = rnn_cell.GetLSTMParamNames()
    values = {}
    for kind, width in (("input", 2), ("recurrent", 3)):
        gates = {n: np.full((3, width), k, np.float32) for k, n in enumerate(names["weights"])}
        gates.update({n: np.full(3, k, np.float32) for k, n in enumerate(names["biases"])})
        values[kind] = gates
    rnn_cell.InitFromLSTMParams(params, values)
    w = workspace.FetchBlob("L/i2h_w")
    assert w.shape == (12, 2) and np.all(w[:3] == 0) and np.all(w[9:] == 3)
    with pytest.raises(NotSupportedError, match="GPU-only"):
        rnn_cell.cudnn_LSTM(model, "x", ["h0", "c0"], 2, 3, scope="cudnn")


def test_dropout_cell_and_layered_lstm_names() -> None:
    model = ModelHelper(name="dropout")
    cell = rnn_cell.DropoutCell(rnn_cell.LSTMCell(2, 3, 0.0, False, name="enc"),
                                dropout_ratio=0.3, is_test=0, name="drop")
    output, _ = cell.apply_over_sequence(model, "x", initial_states=["h0", "c0"])
    assert str(output) == "drop/enc/hidden_state_all_with_dropout_mask0"
    assert model.net.Proto().op[-1].type == "Dropout"
    layered = ModelHelper(name="layered")
    outs = rnn_cell.layered_LSTM(layered, "x", "lengths", ["h0", "c0"], 2, [3, 4], scope="lay")
    assert str(outs[0]) == "lay_layer_1/hidden_state_all"
    assert "lay_layer_1/gates_t_w" in [str(p) for p in layered.params]


def test_predictor_exporter_round_trip_of_an_lstm(tmp_path: object) -> None:
    from dpgraph.predictor import predictor_exporter as pe

    workspace.ResetWorkspace()
    model = ModelHelper(name="lstm_export")
    out = rnn_cell.LSTM(model, "x", "lengths", ["h0", "c0"], 2, 3, scope="L",
                        forward_only=True)
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 2, 2)).astype(np.float32),
             "h0": rng.standard_normal((1, 2, 3)).astype(np.float32),
             "c0": rng.standard_normal((1, 2, 3)).astype(np.float32),
             "lengths": np.array([4, 2], np.int32)}
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(model.net)
    expected = workspace.FetchBlob(out[0])
    meta = pe.PredictorExportMeta(predict_net=model.net.Proto(),
                                  parameters=[str(p) for p in model.params],
                                  inputs=list(feeds), outputs=[str(out[0])])
    path = str(tmp_path) + "/lstm.minidb"  # type: ignore[operator]
    pe.save_to_db("minidb", path, meta)
    workspace.ResetWorkspace()
    net = pe.prepare_prediction_net(path, "minidb")
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunNet(net.Proto().name)
    np.testing.assert_array_equal(workspace.FetchBlob(out[0]), expected)
