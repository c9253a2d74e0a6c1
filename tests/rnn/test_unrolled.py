"""RecurrentNetwork against the same cells unrolled into plain ops (UnrolledCell): multi-layer
LSTMs, MILSTM, dropout wrappers and attention decoders give the same outputs and the same
gradients for every parameter and input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpgraph import rnn_cell, workspace
from dpgraph.attention import AttentionType
from dpgraph.core import BlobReference
from dpgraph.model_helper import ModelHelper

T, N, D_IN = 3, 2, 3


def _run(build: Callable[[ModelHelper, int | None], list[Any]], unroll: int | None,
         feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    workspace.ResetWorkspace()
    model = ModelHelper(name="unroll_test")
    for name in feeds:
        model.net.AddExternalInput(name)
    outputs = build(model, unroll)
    losses = [model.net.SumElements(o, f"loss_{k}") for k, o in enumerate(outputs)]
    total = model.net.Sum(losses, "loss")
    grad_map = model.AddGradientOperators([total])
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(0)
    for param in sorted(str(p) for p in model.params):
        shape = workspace.FetchBlob(param).shape
        workspace.FeedBlob(param, (rng.standard_normal(shape) * 0.3).astype(np.float32))
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.RunNetOnce(model.net)
    wanted = [str(p) for p in model.params] + [n for n in feeds if n != "seq_lengths"]
    grads = {name: workspace.FetchBlob(str(grad_map[name])) for name in wanted
             if name in {str(k) for k in grad_map}}
    return [workspace.FetchBlob(o) for o in outputs], grads


def _compare(build: Callable[[ModelHelper, int | None], list[Any]],
             feeds: dict[str, np.ndarray]) -> None:
    dyn_out, dyn_grads = _run(build, None, feeds)
    unr_out, unr_grads = _run(build, T, feeds)
    for a, b in zip(dyn_out, unr_out):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert set(dyn_grads) == set(unr_grads) and len(dyn_grads) >= 4
    for name, value in dyn_grads.items():
        np.testing.assert_allclose(value, unr_grads[name], rtol=1e-4, atol=1e-5, err_msg=name)


def _lstm_feeds(layers: int, hidden: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"input": rng.standard_normal((T, N, D_IN)).astype(np.float32),
             "seq_lengths": np.array([3, 2], np.int32)}
    for layer in range(layers):
        for kind in ("h", "c"):
            feeds[f"{kind}{layer}"] = rng.standard_normal((1, N, hidden)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("fn", [rnn_cell.LSTM, rnn_cell.MILSTM], ids=["lstm", "milstm"])
def test_multi_layer_matches_unrolled(fn: Any) -> None:
    def build(model: ModelHelper, unroll: int | None) -> list[Any]:
        states = [BlobReference(s) for s in ("h0", "c0", "h1", "c1")]
        out = fn(model, BlobReference("input"), BlobReference("seq_lengths"), states,
                 dim_in=D_IN, dim_out=[4, 4], scope="multi", outputs_with_grads=(0, 3),
                 static_rnn_unroll_size=unroll)
        return [out[0], out[3]]

    _compare(build, _lstm_feeds(2, 4))


@pytest.mark.parametrize("attention_type", [AttentionType.Regular, AttentionType.Recurrent,
                                            AttentionType.Dot, AttentionType.SoftCoverage])
def test_attention_matches_unrolled(attention_type: int) -> None:
    E, L, H = 4, 5, 4
    feeds = _lstm_feeds(1, H)
    rng = np.random.default_rng(2)
    feeds["encoder_outputs"] = rng.standard_normal((L, N, E)).astype(np.float32)
    feeds["awec0"] = rng.standard_normal((1, N, E)).astype(np.float32)
    feeds["encoder_lengths"] = np.array([5, 3], np.int32)
    if attention_type == AttentionType.SoftCoverage:
        feeds["cov0"] = np.abs(rng.standard_normal((1, N, L))).astype(np.float32)

    def build(model: ModelHelper, unroll: int | None) -> list[Any]:
        decoder: Any = rnn_cell.LSTMCell(input_size=D_IN, hidden_size=H, forget_bias=0.5,
                                         memory_optimization=True, name="decoder")
        if attention_type == AttentionType.Recurrent:
            decoder = rnn_cell.MultiRNNCell(
                [rnn_cell.DropoutCell(rnn_cell.MILSTMCell(input_size=D_IN, hidden_size=H,
                                                          forget_bias=0.0,
                                                          memory_optimization=False),
                                      dropout_ratio=0.0, is_test=1)],
                name="decoder")
        cell = rnn_cell.AttentionCell(
            encoder_output_dim=E, encoder_outputs=BlobReference("encoder_outputs"),
            encoder_lengths=BlobReference("encoder_lengths"), decoder_cell=decoder,
            decoder_state_dim=H,
            name="attention", attention_type=attention_type,
            weighted_encoder_outputs=None, attention_memory_optimization=True)
        initial = [BlobReference(s) for s in ("h0", "c0", "awec0")]
        if attention_type == AttentionType.SoftCoverage:
            cell.build_initial_coverage(model)  # the coverage FC; 1-D state not unrollable
            initial.append(BlobReference("cov0"))
        if unroll is not None:
            cell = rnn_cell.UnrolledCell(cell, unroll)
        output, states = cell.apply_over_sequence(
            model, BlobReference("input"), seq_lengths=BlobReference("seq_lengths"),
            initial_states=initial, outputs_with_grads=[0, 4])
        return [output, states[4]]

    feeds.pop("h1", None)
    _compare(build, feeds)
