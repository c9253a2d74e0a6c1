"""The checks Caffe2's rnn_cell_test makes, through dpgraph's gradient_checker: dynamic vs
unrolled nets (CompareNets) under a NameScope, op-level gradient checks of the RNN op on
every input (LSTM with recompute, attention decoders of all four types), a custom cell
stacked in a MultiRNNCell, and NetGradientChecker on a multi-layer LSTM's parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph import core, gradient_checker, rnn_cell, workspace
from dpgraph.attention import AttentionType
from dpgraph.model_helper import ModelHelper
from dpgraph.proto import caffe2_pb2
from dpgraph.rnn.rnn_cell_test_util import _prepare_rnn

CPU = core.DeviceOption(caffe2_pb2.CPU)


@pytest.mark.parametrize("outputs_with_grads", [[0], [1], [0, 1, 2, 3]])
def test_unroll_lstm_in_name_scope(outputs_with_grads: list[int]) -> None:
    np.random.seed(1)
    workspace.ResetWorkspace()
    x = np.random.rand(3, 2, 2).astype(np.float32)
    built = [_prepare_rnn(*x.shape, create_rnn=rnn_cell.LSTM,
                          outputs_with_grads=outputs_with_grads, T=t,
                          two_d_initial_states=False, dim_out=[2, 3], forget_bias=0.5,
                          drop_states=True) for t in (x.shape[0], None)]
    outputs, nets, inputs = zip(*built)
    workspace.FeedBlob(inputs[0][-1], x)
    assert inputs[0] == inputs[1]
    gradient_checker.NetGradientChecker.CompareNets(nets, outputs, outputs_with_grads,
                                                    inputs_with_grads=inputs[0])


def test_lstm_op_gradients_with_memory_optimization() -> None:
    np.random.seed(2)
    workspace.ResetWorkspace()
    t, n, d = 3, 2, 2
    net = _prepare_rnn(t, n, d, rnn_cell.LSTM, outputs_with_grads=[0, 1, 2, 3],
                       memory_optim=True, forget_bias=0.3, forward_only=False,
                       drop_states=False)[1]
    workspace.FeedBlob("test_name_scope/external/recurrent/i2h",
                       np.random.randn(t, n, 4 * d).astype(np.float32))
    op = net._net.op[-1]
    inputs = [workspace.FetchBlob(name) for name in op.input]
    checker = gradient_checker.GradientChecker(0.005, 0.01, CPU, "gradient_check")
    for param in range(5):
        ok, _, _ = checker.CheckSimple(op, inputs, param, [0, 1, 2, 3])
        assert ok, f"input {param} ({op.input[param]})"


@pytest.mark.parametrize("attention_type", [AttentionType.Regular, AttentionType.Recurrent,
                                            AttentionType.Dot, AttentionType.SoftCoverage])
def test_lstm_with_attention_op_gradients(attention_type: int) -> None:
    np.random.seed(3)
    workspace.ResetWorkspace()
    length, enc_dim, steps, state_dim, batch = 2, 3, 2, 3, 2
    model = ModelHelper(name="external")
    names = ["encoder_outputs", "decoder_inputs", "decoder_input_lengths",
             "initial_decoder_hidden_state", "initial_decoder_cell_state",
             "initial_attention_weighted_encoder_context"]
    refs = dict(zip(names, model.net.AddExternalInputs(*names)))
    rnn_cell.LSTMWithAttention(
        model=model, decoder_inputs=refs["decoder_inputs"],
        decoder_input_lengths=refs["decoder_input_lengths"],
        initial_decoder_hidden_state=refs["initial_decoder_hidden_state"],
        initial_decoder_cell_state=refs["initial_decoder_cell_state"],
        initial_attention_weighted_encoder_context=refs[
            "initial_attention_weighted_encoder_context"],
        encoder_output_dim=enc_dim, encoder_outputs=refs["encoder_outputs"],
        encoder_lengths=None, decoder_input_dim=state_dim, decoder_state_dim=state_dim,
        scope="external/LSTMWithAttention", attention_type=attention_type)
    op = model.net._net.op[-2]
    workspace.RunNetOnce(model.param_init_net)
    feeds: dict[str, Any] = {
        op.input[0]: np.random.randn(steps, batch, 4 * state_dim),
        "external/LSTMWithAttention/encoder_outputs_transposed":
            np.random.randn(batch, enc_dim, length),
        "external/LSTMWithAttention/weighted_encoder_outputs":
            np.random.randn(length, batch, enc_dim),
        "external/LSTMWithAttention/coverage_weights": np.random.randn(length, batch, enc_dim),
        "initial_decoder_hidden_state": np.random.randn(1, batch, state_dim),
        "initial_decoder_cell_state": np.random.randn(1, batch, state_dim),
        "initial_attention_weighted_encoder_context": np.random.randn(1, batch, enc_dim),
        "external/LSTMWithAttention/initial_coverage": np.zeros((1, batch, length))}
    for name, value in feeds.items():
        workspace.FeedBlob(name, value.astype(np.float32))
    workspace.FeedBlob("decoder_input_lengths", np.array([2, 1], np.int32))
    inputs = [workspace.FetchBlob(name) for name in op.input]
    checker = gradient_checker.GradientChecker(0.001, 0.01, CPU, "gradient_check")
    for param, name in enumerate(op.input):
        if name != "decoder_input_lengths":
            ok, _, _ = checker.CheckSimple(op, inputs, param, [0, 4])
            assert ok, f"input {param} ({name})"


class MulCell(rnn_cell.RNNCell):
    """Caffe2's test cell: state_t = input_t * state_prev."""

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any) -> Any:
        result = model.net.Mul([input_t, states[0]])
        model.net.AddExternalOutput(result)
        return [result]

    def get_state_names(self) -> Any:
        return [self.scope("state")]


@pytest.mark.parametrize("outputs_with_grad", [[0], [1], [0, 1]])
def test_unroll_custom_cell_in_multi_rnn_cell(outputs_with_grad: list[int]) -> None:
    np.random.seed(4)
    workspace.ResetWorkspace()
    x = np.random.rand(3, 2, 2).astype(np.float32)
    outputs, nets, layers = [], [], 2
    for unroll in (x.shape[0], None):
        model = ModelHelper(f"rnn_mul_{'unroll' if unroll else 'dynamic'}")
        input_blob = model.net.AddExternalInputs("input_blob")
        cell: Any = rnn_cell.MultiRNNCell(name="multi_mul_rnn",
                                          cells=[MulCell(name=f"layer_{i}")
                                                 for i in range(layers)])
        if unroll is not None:
            cell = rnn_cell.UnrolledCell(cell, T=unroll)
        states = [model.param_init_net.ConstantFill([], f"initial_state_{i}", value=1.0,
                                                    shape=[1, 2, 2]) for i in range(layers)]
        _, results = cell.apply_over_sequence(
            model=model, inputs=input_blob, initial_states=states, seq_lengths=None,
            outputs_with_grads=[i + 2 * (layers - 1) for i in outputs_with_grad])
        outputs.append(results[-2:])
        workspace.RunNetOnce(model.param_init_net)
        nets.append(model.net)
        workspace.blobs[input_blob] = x
    gradient_checker.NetGradientChecker.CompareNets(
        nets, outputs, outputs_with_grad_ids=outputs_with_grad, inputs_with_grads=[input_blob])


def test_multi_lstm_parameter_gradients() -> None:
    np.random.seed(5)
    workspace.ResetWorkspace()
    model = ModelHelper(name="external")
    sequence, lengths = model.net.AddExternalInputs("input_sequence", "seq_lengths")
    h_all, _, _, _ = rnn_cell.LSTM(model=model, input_blob=sequence, seq_lengths=lengths,
                                   initial_states=None, dim_in=2, dim_out=[2, 3],
                                   outputs_with_grads=(0,), return_params=False,
                                   memory_optimization=False, forget_bias=0.0,
                                   forward_only=False, return_last_layer_only=True)
    workspace.RunNetOnce(model.param_init_net)
    values = {"input_sequence": np.random.randn(3, 2, 2).astype(np.float32),
              "seq_lengths": np.array([3, 2], np.int32)}
    for param in model.GetParams():
        values[str(param)] = workspace.FetchBlob(param)
    fake_loss = model.net.Tanh(model.net.SumElements([h_all], "output_sum", average=True))
    for param in model.GetParams():
        gradient_checker.NetGradientChecker.Check(
            model.net, outputs_with_grad=[fake_loss], input_values=values,
            input_to_check=str(param), print_net=False, step_size=0.0001, threshold=0.05)


def _attention_decoder(unroll: int | None, residual: bool, final_dropout: bool,
                       dims: tuple[int, int, int, int]) -> dict[str, Any]:
    """Caffe2's _prepare_attention: MILSTM layers in a MultiRNNCell under Recurrent
    attention, optionally residual and wrapped in a DropoutCell of ratio 0."""
    t, n, dim_in, encoder_dim = dims
    model = ModelHelper(name="external")
    initial_states = []
    for layer in range(2):
        h, c = model.net.AddExternalInputs(f"hidden_init_{layer}", f"cell_init_{layer}")
        initial_states.extend([h, c])
        workspace.FeedBlob(h, np.random.random((1, n, 3)).astype(np.float32))
        workspace.FeedBlob(c, np.random.random((1, n, 3)).astype(np.float32))
    awec = model.net.AddExternalInputs("initial_attention_weighted_encoder_context")
    initial_states.append(awec)
    workspace.FeedBlob(awec, np.random.random((1, n, encoder_dim)).astype(np.float32))
    with core.NameScope("test_name_scope"):
        input_blob, seq_lengths, encoder_outputs, weighted = model.net.AddScopedExternalInputs(
            "input_blob", "seq_lengths", "encoder_outputs", "weighted_encoder_outputs")
        cells = [rnn_cell.MILSTMCell(name=f"decoder_{i}", forward_only=False,
                                     input_size=dim_in if i == 0 else 3, hidden_size=3,
                                     forget_bias=0.0, memory_optimization=False)
                 for i in range(2)]
        decoder = rnn_cell.MultiRNNCell(cells, name="decoder",
                                        residual_output_layers=range(1, 2) if residual else None)
        cell: Any = rnn_cell.AttentionCell(
            encoder_output_dim=encoder_dim, encoder_outputs=encoder_outputs,
            encoder_lengths=None, decoder_cell=decoder, decoder_state_dim=3,
            name="attention_decoder", attention_type=AttentionType.Recurrent,
            weighted_encoder_outputs=weighted, attention_memory_optimization=True)
        if final_dropout:
            cell = rnn_cell.DropoutCell(internal_cell=cell, dropout_ratio=0.0, name="dropout",
                                        forward_only=False, is_test=False)
        if unroll is not None:
            cell = rnn_cell.UnrolledCell(cell, unroll)
        output_indices = list(decoder.output_indices) + [2 * len(cells)]
        outputs_with_grads = [2 * i for i in output_indices]
        final_output, _ = cell.apply_over_sequence(
            model=model, inputs=input_blob, seq_lengths=seq_lengths,
            initial_states=initial_states, outputs_with_grads=outputs_with_grads)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob(seq_lengths, np.random.randint(1, t + 1, size=(n,)).astype(np.int32))
    return {"final_output": final_output, "net": model.net, "initial_states": initial_states,
            "input_blob": input_blob, "encoder_outputs": encoder_outputs,
            "weighted_encoder_outputs": weighted}


@pytest.mark.parametrize("residual,final_dropout", [(False, False), (True, True)])
def test_unroll_attention(residual: bool, final_dropout: bool) -> None:
    np.random.seed(6)
    workspace.ResetWorkspace()
    dims = (3, 2, 2, 2)
    net, unrolled = [_attention_decoder(unroll, residual, final_dropout, dims)
                     for unroll in (dims[0], None)]
    encoder = np.random.random((2, dims[1], dims[3])).astype(np.float32)
    workspace.FeedBlob(net["input_blob"], np.random.rand(*dims[:3]).astype(np.float32))
    workspace.FeedBlob(net["encoder_outputs"], encoder)
    workspace.FeedBlob(net["weighted_encoder_outputs"],
                       np.random.random(encoder.shape).astype(np.float32))
    inputs_with_grads = net["initial_states"] + [
        net["input_blob"], net["encoder_outputs"], net["weighted_encoder_outputs"]]
    gradient_checker.NetGradientChecker.CompareNets(
        [net["net"], unrolled["net"]], [[net["final_output"]], [unrolled["final_output"]]],
        [0], inputs_with_grads=inputs_with_grads, threshold=0.000001)
