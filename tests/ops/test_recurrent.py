"""RecurrentNetwork, its gradient and the recurrent units as operators: hand-built step nets
against step-by-step references, finite-difference gradients (through step-net parameters
and sequence lengths), link windows, empty sequences, step blobs, forward-only errors and
the executors/devices."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpgraph import core, recurrent, workspace
from dpgraph.errors import DpgraphError
from dpgraph.model_helper import ModelHelper
from dpgraph.ops.testing import check_gradient
from dpgraph.proto import caffe2_pb2


def _sum_mul_model(with_param: bool) -> tuple[ModelHelper, Any]:
    """output_t = input_t * (input_t + output_t_prev [* w])."""
    model = ModelHelper(name="external")
    input_blob, initial = model.net.AddScopedExternalInputs("input", "initial_input")
    step = ModelHelper(name="step", param_model=model)
    input_t, output_t_prev = step.net.AddExternalInput("input_t", "output_t_prev")
    prev = output_t_prev
    if with_param:
        weight = step.net.AddExternalInput("w")
        prev = step.net.Mul([output_t_prev, weight], "scaled_prev", broadcast=1)
    inner = step.net.Sum([input_t, prev])
    output_t = step.net.Mul([input_t, inner])
    step.net.AddExternalOutput(output_t)
    recurrent.recurrent_net(net=model.net, cell_net=step.net, inputs=[(input_t, input_blob)],
                            initial_cell_inputs=[(output_t_prev, initial)],
                            links={output_t_prev: output_t}, scope="test_rnn_sum_mull")
    return model, model.net.Proto().op[-1]


def _sum_mul_reference(x: np.ndarray, h0: np.ndarray, w: np.ndarray | float = 1.0
                       ) -> np.ndarray:
    h = h0.reshape(x.shape[1:])
    out = []
    for t in range(x.shape[0]):
        h = x[t] * (x[t] + h * w)
        out.append(h)
    return np.stack(out)


def test_sum_mul_forward_and_structure() -> None:
    workspace.ResetWorkspace()
    model, op = _sum_mul_model(False)
    assert op.type == "RecurrentNetwork"
    assert list(op.input) == ["input", "initial_input"]
    assert op.output[-1] == "test_rnn_sum_mull/step_workspaces"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 3)).astype(np.float32)
    h0 = rng.standard_normal((1, 2, 3)).astype(np.float32)
    workspace.FeedBlob("input", x)
    workspace.FeedBlob("initial_input", h0)
    workspace.RunNetOnce(model.net)
    expected = _sum_mul_reference(x, h0)
    np.testing.assert_allclose(workspace.FetchBlob(op.output[0]), expected, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob(op.output[1]), expected[-1:], rtol=1e-5)
    states = workspace.FetchBlob("test_rnn_sum_mull/output_t_prev_states")
    assert states.shape == (5, 2, 3)


@pytest.mark.parametrize("with_param", [False, True])
def test_sum_mul_gradients_by_finite_differences(with_param: bool) -> None:
    _, op = _sum_mul_model(with_param)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-0.8, 0.8, (3, 2, 2)).astype(np.float32),
              rng.uniform(-0.8, 0.8, (2, 2)).astype(np.float32)]
    if with_param:
        inputs.append(rng.uniform(0.5, 1.0, (2,)).astype(np.float32))
        assert list(op.input)[2] == "w"
    check_gradient(op, inputs, outputs_with_grads=[0], eps=1e-2, rtol=2e-2, atol=2e-3)


def _lstm_unit_inputs(n: int, d: int, lengths: bool, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal((1, n, d)).astype(np.float32),
              rng.standard_normal((1, n, d)).astype(np.float32),
              rng.standard_normal((1, n, 4 * d)).astype(np.float32)]
    if lengths:
        values.append(np.array([1, 3, 2][:n], np.int32))
    values.append(np.array([1], np.int32))
    return values


@pytest.mark.parametrize("drop_states", [0, 1])
@pytest.mark.parametrize("lengths", [True, False])
def test_lstm_unit_gradient(lengths: bool, drop_states: int) -> None:
    names = ["h_prev", "c_prev", "gates"] + (["seq_lengths"] if lengths else []) + ["t"]
    op = core.CreateOperator("LSTMUnit", names, ["h", "c"], forget_bias=0.7,
                             drop_states=drop_states, sequence_lengths=int(lengths))
    check_gradient(op, _lstm_unit_inputs(3, 2, lengths, seed=2), inputs_to_check=[1, 2],
                   outputs_with_grads=[0, 1], eps=1e-2, rtol=1e-2, atol=1e-3)


def test_lstm_unit_invalid_rows_carry_or_drop() -> None:
    from dpgraph.ops.testing import run_op

    inputs = _lstm_unit_inputs(3, 2, True, seed=3)
    for drop in (0, 1):
        op = core.CreateOperator("LSTMUnit", ["hp", "cp", "g", "len", "t"], ["h", "c"],
                                 drop_states=drop)
        h, c = run_op(op, inputs)
        expected_h = 0 if drop else inputs[0][0, 0]
        np.testing.assert_array_equal(h[0, 0], np.broadcast_to(expected_h, (2,)))
        assert np.all(c[0, 1:] != inputs[1][0, 1:])


@pytest.mark.parametrize("lengths", [True, False])
def test_gru_unit_gradient(lengths: bool) -> None:
    rng = np.random.default_rng(4)
    names = ["h_prev", "gates"] + (["seq_lengths"] if lengths else []) + ["t"]
    inputs = [rng.standard_normal((1, 3, 2)).astype(np.float32),
              rng.standard_normal((1, 3, 6)).astype(np.float32)]
    inputs += ([np.array([1, 3, 2], np.int32)] if lengths else []) + [np.array([1], np.int32)]
    op = core.CreateOperator("GRUUnit", names, ["h"], sequence_lengths=int(lengths))
    check_gradient(op, inputs, inputs_to_check=[0, 1], eps=1e-2, rtol=1e-2, atol=1e-3)


def _stateful_conv(t_len: int, window: int, batch: int, size: int) -> ModelHelper:
    """Caffe2's stateful-convolution example: the sequence is generated inside the steps,
    a link window of ``window`` rows feeds a Conv, 3-D initial state of window-1 rows."""
    model = ModelHelper(name="model")
    fake = model.param_init_net.UniformFill([], "fake_inputs", min=-1.0, max=1.0,
                                            shape=[t_len, batch, size])
    init_in = model.param_init_net.ConstantFill([], "initial_input_state", value=0.0,
                                                shape=[window - 1, batch, size])
    init_out = model.param_init_net.ConstantFill([], "initial_output_state", value=0.0,
                                                 shape=[1, batch, size])
    step = ModelHelper(name="step_model", param_model=model)
    step.net.AddExternalInputs("fake_input_t", "timestep", "input_state_t_prev")
    conv_filter = step.param_init_net.XavierFill([], "conv_filter",
                                                 shape=[size, 1, window, size])
    conv_bias = step.param_init_net.ConstantFill([], "conv_bias", shape=[size], value=0.0)
    step.net.UniformFill([], "input_state_t", min=-1.0, max=1.0, shape=[1, batch, size])
    batch_major = step.net.Transpose("input_state_t_prev", "input_state_t_prev_bm",
                                     axes=[1, 0, 2])
    expanded = step.net.ExpandDims(batch_major, "input_state_t_prev_expanded", dims=[1])
    conv = step.net.Conv([expanded, conv_filter, conv_bias], "output_state_t_4d",
                         kernel_h=1, kernel_w=window, order="NHWC")
    squeezed = step.net.Squeeze(conv, "output_state_t_2d", dims=[1, 2])
    step.net.ExpandDims(squeezed, "output_state_t", dims=[0])
    step.net.AddExternalOutputs(core.BlobReference("input_state_t"),
                                core.BlobReference("output_state_t"))
    model.net.RecurrentNetwork(
        [fake, init_in, init_out, conv_filter, conv_bias],
        ["input_state_all", "output_state_all", "step_workspaces"],
        param=[3, 4], alias_src=["input_state", "output_state"],
        alias_dst=["input_state_all", "output_state_all"], alias_offset=[window - 1, 1],
        recurrent_states=["input_state", "output_state"],
        initial_recurrent_state_ids=[1, 2],
        link_internal=["input_state_t_prev", "input_state_t", "output_state_t_prev",
                       "output_state_t", "fake_input_t"],
        link_external=["input_state", "input_state", "output_state", "output_state",
                       "fake_inputs"],
        link_offset=[0, window - 1, 0, 1, 0], link_window=[window, 1, 1, 1, 1],
        backward_link_internal=[], backward_link_external=[], backward_link_offset=[],
        step_net=step.net.Proto(), timestep="timestep", outputs_with_grads=[])
    return model


@pytest.mark.parametrize("window", [1, 3])
def test_link_window_and_multi_row_initial_state(window: int) -> None:
    workspace.ResetWorkspace()
    t_len, batch, size = 5, 2, 3
    model = _stateful_conv(t_len, window, batch, size)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    inputs = workspace.FetchBlob("input_state_all")
    outputs = workspace.FetchBlob("output_state_all")
    assert inputs.shape == (t_len, batch, size) and outputs.shape == (t_len, batch, size)
    # The same convolution applied to the whole generated sequence (zero left padding).
    w = workspace.FetchBlob("conv_filter")[:, 0]  # (out, window, in)
    padded = np.concatenate([np.zeros((window - 1, batch, size), np.float32), inputs])
    expected = np.stack([np.einsum("kbi,oki->bo", padded[t:t + window], w)
                         for t in range(t_len)])
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-5)


def test_empty_sequence() -> None:
    workspace.ResetWorkspace()
    model, op = _sum_mul_model(False)
    h0 = np.ones((1, 2, 3), np.float32)
    workspace.FeedBlob("input", np.zeros((0, 2, 3), np.float32))
    workspace.FeedBlob("initial_input", h0)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob(op.output[0]).shape == (0, 2, 3)
    np.testing.assert_array_equal(workspace.FetchBlob(op.output[1]), h0)


def test_retrieve_step_blobs_lists_each_step() -> None:
    workspace.ResetWorkspace()
    model, _ = _sum_mul_model(False)
    model.net.AddExternalInput("out_grad")
    model.AddGradientOperators({model.net.Proto().op[-1].output[0]: "out_grad"})
    workspace.FeedBlob("input", np.ones((3, 1, 2), np.float32))
    workspace.FeedBlob("initial_input", np.ones((1, 1, 2), np.float32))
    workspace.FeedBlob("out_grad", np.ones((3, 1, 2), np.float32))
    workspace.RunNetOnce(model.net)
    names = [n.decode() for n in recurrent.retrieve_step_blobs(model.net, "extractTest")]
    for t in range(3):
        assert f"extractTest_input_t{t}" in names
        np.testing.assert_array_equal(workspace.FetchBlob(f"extractTest_input_t{t}"),
                                      np.ones((1, 1, 2)))


def test_gradient_after_forward_only_run_is_refused() -> None:
    workspace.ResetWorkspace()
    model, op = _sum_mul_model(False)
    forward = caffe2_pb2.OperatorDef()
    forward.CopyFrom(op)
    for arg in forward.arg:
        if arg.name == "backward_step_net":
            arg.n.CopyFrom(caffe2_pb2.NetDef())  # what ExtractPredictorNet leaves
    workspace.FeedBlob("input", np.ones((3, 1, 2), np.float32))
    workspace.FeedBlob("initial_input", np.ones((1, 1, 2), np.float32))
    workspace.RunOperatorOnce(forward)
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, [op.output[0] + "_grad", None,
                                                              None])
    workspace.FeedBlob(op.output[0] + "_grad", np.ones((3, 1, 2), np.float32))
    with pytest.raises(DpgraphError, match="forward-only"):
        workspace.RunOperatorsOnce(grad_ops)


def test_gradient_needs_listed_output_gradients() -> None:
    _, op = _sum_mul_model(False)
    with pytest.raises(DpgraphError, match="is not provided"):
        core.GradientRegistry.GetGradientForOp(op, [None, op.output[1] + "_grad", None])


def _train_step(net_type: str, device: caffe2_pb2.DeviceOption) -> list[np.ndarray]:
    from dpgraph import rnn_cell

    workspace.ResetWorkspace()
    model = ModelHelper(name=f"exec_{net_type}")
    with core.DeviceScope(device):
        x, h0, c0, seq = model.net.AddExternalInputs("x", "h0", "c0", "seq")
        out = rnn_cell.LSTM(model, x, seq, [h0, c0], dim_in=2, dim_out=3, scope="lstm")
        loss = model.net.AveragedLoss(model.net.SumElements(out[0], "s"), "loss")
        model.AddGradientOperators([loss])
    model.net.Proto().type = net_type
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 2, 2)), "h0": rng.standard_normal((1, 2, 3)),
             "c0": rng.standard_normal((1, 2, 3))}
    workspace.RunNetOnce(model.param_init_net)
    for name, value in feeds.items():
        workspace.FeedBlob(name, value.astype(np.float32), device)
    workspace.FeedBlob("seq", np.array([4, 2], np.int32), device)
    for param in sorted(str(p) for p in model.params):
        shape = workspace.FetchBlob(param).shape
        workspace.FeedBlob(param, rng.standard_normal(shape).astype(np.float32), device)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    return [workspace.FetchBlob(str(model.param_to_grad[p])) for p in model.params]


def test_dag_executor_and_virtual_gpu_match_simple() -> None:
    cpu = core.DeviceOption(caffe2_pb2.CPU)
    expected = _train_step("simple", cpu)
    for got in (_train_step("dag", cpu),):
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)
    workspace.SetVirtualGpus(2)
    try:
        gpu = _train_step("simple", core.DeviceOption(caffe2_pb2.CUDA, 1))
    finally:
        workspace.SetVirtualGpus(0)
    for a, b in zip(expected, gpu):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _apply_memonger_renames(op: caffe2_pb2.OperatorDef, renames: dict[str, str]) -> None:
    """What memonger does to a RecurrentNetwork(-Gradient) op: rename its blobs and those of
    its step nets, and record each renamed blob of the op as a ``<blob>.rename`` argument."""
    from dpgraph.ir.arguments import MakeArgument

    def rename(names: Any) -> None:
        for k, name in enumerate(names):
            names[k] = renames.get(name, name)

    touched = [b for b in list(op.input) + list(op.output) if b in renames]
    rename(op.input)
    rename(op.output)
    for arg in op.arg:
        if arg.name.endswith("step_net") and arg.HasField("n"):
            for inner in arg.n.op:
                rename(inner.input)
                rename(inner.output)
    op.arg.extend(MakeArgument(b + ".rename", renames[b]) for b in touched)


def test_gradient_op_follows_memonger_renames() -> None:
    _, op = _sum_mul_model(True)
    grad_ops, _ = core.GradientRegistry.GetGradientForOp(op, [op.output[0] + "_grad", None,
                                                              None])
    rng = np.random.default_rng(6)
    feeds = {"input": rng.uniform(-0.8, 0.8, (3, 2, 2)), "initial_input": rng.uniform(
        -0.8, 0.8, (1, 2, 2)), "w": rng.uniform(0.5, 1.0, (2,)),
        op.output[0] + "_grad": rng.standard_normal((3, 2, 2))}
    results = []
    for renames in ({}, {"input_grad": "buffer_0", "w_grad": "buffer_1"}):
        workspace.ResetWorkspace()
        for name, value in feeds.items():
            workspace.FeedBlob(name, value.astype(np.float32))
        workspace.RunOperatorOnce(op)
        grad = caffe2_pb2.OperatorDef()
        grad.CopyFrom(grad_ops[0])
        _apply_memonger_renames(grad, renames)
        workspace.RunOperatorOnce(grad)
        results.append([workspace.FetchBlob(b) for b in grad.output])
        assert not renames or list(grad.output)[:2] == ["buffer_0", "buffer_1"]
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_shape_inference_matches_the_run() -> None:
    from dpgraph import rnn_cell

    workspace.ResetWorkspace()
    model = ModelHelper(name="shapes")
    out = rnn_cell.LSTM(model, "x", "l", ["h0", "c0"], 2, 3, scope="L")
    model.AddGradientOperators([model.net.SumElements(out[0], "loss")])
    feeds = {"x": (5, 4, 2), "h0": (4, 3), "c0": (1, 4, 3)}
    shapes, types = workspace.InferShapesAndTypes(
        [model.param_init_net, model.net], {**{k: list(v) for k, v in feeds.items()}, "l": [4]})
    workspace.RunNetOnce(model.param_init_net)
    for name, shape in feeds.items():
        workspace.FeedBlob(name, np.random.randn(*shape).astype(np.float32))
    workspace.FeedBlob("l", np.array([5, 4, 3, 1], np.int32))
    workspace.RunNetOnce(model.net)
    for name in [*map(str, out), "L/i2h_grad", "L/gates_t_w_grad", "h0_grad", "c0_grad"]:
        assert list(workspace.FetchBlob(name).shape) == list(shapes[name]), name
        assert types[name] == caffe2_pb2.TensorProto.FLOAT
    assert "L/step_workspaces" not in shapes


def test_bad_inputs_raise_typed_errors_naming_the_blobs() -> None:
    from dpgraph.errors import BlobNotFoundError, ShapeError

    workspace.ResetWorkspace()
    model, op = _sum_mul_model(False)
    workspace.FeedBlob("input", np.ones((3, 2, 2), np.float32))
    workspace.FeedBlob("initial_input", np.ones((1, 5, 2), np.float32))
    with pytest.raises(ShapeError, match="initial_input.*batch size"):
        workspace.RunNetOnce(model.net)
    workspace.FeedBlob("input", np.ones((3,), np.float32))
    with pytest.raises(ShapeError, match="must be T x N"):
        workspace.RunNetOnce(model.net)
    step = [a for a in op.arg if a.name == "step_net"][0].n
    step.op[0].input[0] = "not_a_blob"
    workspace.FeedBlob("input", np.ones((3, 5, 2), np.float32))
    with pytest.raises(BlobNotFoundError, match="timestep 0.*not_a_blob"):
        workspace.RunOperatorOnce(op)


def test_a_recurrent_state_may_itself_be_an_output() -> None:
    """Caffe2's elman test lists the state tensor among the outputs: it gets all T + 1 rows."""
    workspace.ResetWorkspace()
    _, op = _sum_mul_model(False)
    state = "test_rnn_sum_mull/output_t_prev_states"
    op.output.insert(len(op.output) - 1, state)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 3)).astype(np.float32)
    h0 = rng.standard_normal((1, 2, 3)).astype(np.float32)
    workspace.FeedBlob("input", x)
    workspace.FeedBlob("initial_input", h0)
    workspace.RunOperatorOnce(op)
    states = workspace.FetchBlob(state)
    assert states.shape == (4, 2, 3)
    np.testing.assert_allclose(states[1:], _sum_mul_reference(x, h0), rtol=1e-5)
    op.output.insert(len(op.output) - 1, "not_a_state")
    with pytest.raises(DpgraphError, match="neither an alias destination"):
        workspace.RunOperatorOnce(op)
