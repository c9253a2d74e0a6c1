"""The functional RNN builders of Caffe2's rnn_cell: ``LSTM``, ``MILSTM``, ``LayerNormLSTM``,
``LayerNormMILSTM``, ``BasicRNN``, ``LSTMWithAttention``, ``layered_LSTM`` and the LSTM
parameter helpers."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from dpgraph.errors import ModelError, NotSupportedError
from dpgraph.modeling.rnn.attention import AttentionType
from dpgraph.modeling.rnn.cell import (
    BasicRNNCell,
    LayerNormLSTMCell,
    LayerNormMILSTMCell,
    LSTMCell,
    MILSTMCell,
)
from dpgraph.modeling.rnn.composite import LSTMWithAttentionCell, MultiRNNCell, UnrolledCell


def _LSTM(cell_class: Any, model: Any, input_blob: Any, seq_lengths: Any, initial_states: Any,
          dim_in: int, dim_out: Any, scope: Any = None, outputs_with_grads: Any = (0,),
          return_params: bool = False, memory_optimization: bool = False,
          forget_bias: float = 0.0, forward_only: bool = False, drop_states: bool = False,
          return_last_layer_only: bool = True, static_rnn_unroll_size: int | None = None,
          **cell_kwargs: Any) -> tuple[Any, ...]:
    """One or more layers of ``cell_class`` over ``input_blob`` (T x N x dim_in).

    Returns:
        For one LSTM layer ``(hidden_all, hidden_last, cell_all, cell_last)`` (the last
        layer's unless ``return_last_layer_only=False``), plus the param dict when
        ``return_params``.
    """
    if not isinstance(dim_out, (list, tuple)):
        dim_out = [dim_out]
    num_layers = len(dim_out)
    cells = [cell_class(input_size=(dim_in if i == 0 else dim_out[i - 1]),
                        hidden_size=dim_out[i], forget_bias=forget_bias,
                        memory_optimization=memory_optimization,
                        name=scope if num_layers == 1 else None, forward_only=forward_only,
                        drop_states=drop_states, **cell_kwargs)
             for i in range(num_layers)]
    cell: Any = MultiRNNCell(cells, name=scope, forward_only=forward_only) if num_layers > 1 \
        else cells[0]
    if static_rnn_unroll_size is not None:
        cell = UnrolledCell(cell, static_rnn_unroll_size)
    outputs_with_grads = [4 * (num_layers - 1) + i for i in outputs_with_grads]
    _, result = cell.apply_over_sequence(model=model, inputs=input_blob,
                                         seq_lengths=seq_lengths,
                                         initial_states=initial_states,
                                         outputs_with_grads=outputs_with_grads)
    if return_last_layer_only:
        result = result[4 * (num_layers - 1):]
    if return_params:
        result = list(result) + [{"input": cell.get_input_params(),
                                  "recurrent": cell.get_recurrent_params()}]
    return tuple(result)


LSTM = functools.partial(_LSTM, LSTMCell)
BasicRNN = functools.partial(_LSTM, BasicRNNCell)
MILSTM = functools.partial(_LSTM, MILSTMCell)
LayerNormLSTM = functools.partial(_LSTM, LayerNormLSTMCell)
LayerNormMILSTM = functools.partial(_LSTM, LayerNormMILSTMCell)


def LSTMWithAttention(model: Any, decoder_inputs: Any, decoder_input_lengths: Any,
                      initial_decoder_hidden_state: Any, initial_decoder_cell_state: Any,
                      initial_attention_weighted_encoder_context: Any, encoder_output_dim: int,
                      encoder_outputs: Any, encoder_lengths: Any, decoder_input_dim: int,
                      decoder_state_dim: int, scope: Any,
                      attention_type: int = AttentionType.Regular,
                      outputs_with_grads: Any = (0, 4), weighted_encoder_outputs: Any = None,
                      lstm_memory_optimization: bool = False,
                      attention_memory_optimization: bool = False, forget_bias: float = 0.0,
                      forward_only: bool = False) -> tuple[Any, ...]:
    """An attention LSTM decoder; returns all its states' (all, last) pairs."""
    cell = LSTMWithAttentionCell(
        encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs,
        encoder_lengths=encoder_lengths, decoder_input_dim=decoder_input_dim,
        decoder_state_dim=decoder_state_dim, name=scope, attention_type=attention_type,
        weighted_encoder_outputs=weighted_encoder_outputs, forget_bias=forget_bias,
        lstm_memory_optimization=lstm_memory_optimization,
        attention_memory_optimization=attention_memory_optimization,
        forward_only=forward_only)
    initial_states = [initial_decoder_hidden_state, initial_decoder_cell_state,
                      initial_attention_weighted_encoder_context]
    if attention_type == AttentionType.SoftCoverage:
        initial_states.append(cell.build_initial_coverage(model))
    _, result = cell.apply_over_sequence(model=model, inputs=decoder_inputs,
                                         seq_lengths=decoder_input_lengths,
                                         initial_states=initial_states,
                                         outputs_with_grads=outputs_with_grads)
    return result


def GetLSTMParamNames() -> dict[str, list[str]]:
    weights = ["input_gate_w", "forget_gate_w", "output_gate_w", "cell_w"]
    return {"weights": weights, "biases": [w[:-1] + "b" for w in weights]}


def InitFromLSTMParams(lstm_pblobs: dict[str, dict[str, Any]],
                       param_values: dict[str, dict[str, Any]]) -> None:
    """Feed per-gate values (GetLSTMParamNames order) into the LSTM's weight/bias blobs."""
    from dpgraph.runtime.api import FeedBlob, FetchBlob

    names = GetLSTMParamNames()
    for input_type, values in param_values.items():
        for kind in ("weights", "biases"):
            flat = np.concatenate([np.asarray(values[n]).reshape(-1) for n in names[kind]])
            blob = lstm_pblobs[input_type][kind]
            shape = FetchBlob(blob).shape
            FeedBlob(blob, flat.reshape(shape).astype(np.float32))


def cudnn_LSTM(model: Any, input_blob: Any, initial_states: Any, dim_in: int, dim_out: int,
               scope: Any, recurrent_params: Any = None, input_params: Any = None,
               num_layers: int = 1, return_params: bool = False) -> Any:
    """cuDNN's fused LSTM (the ``Recurrent`` op) exists only on CUDA in Caffe2."""
    raise NotSupportedError(
        f"cudnn_LSTM (scope {scope!r}): the cuDNN Recurrent op is GPU-only and dpgraph has no "
        "cuDNN binding; use rnn_cell.LSTM, which builds the same LSTM from RecurrentNetwork "
        "and LSTMUnit on any device.")


def _layered_LSTM(model: Any, input_blob: Any, seq_lengths: Any, initial_states: Any,
                  dim_in: int, dim_out: Any, scope: Any, outputs_with_grads: Any = (0,),
                  return_params: bool = False, memory_optimization: bool = False,
                  forget_bias: float = 0.0, forward_only: bool = False,
                  drop_states: bool = False, create_lstm: Any = None) -> Any:
    """Chain single-layer LSTMs; layer i > 0 is scoped ``<scope>_layer_<i+1>``."""
    params = dict(model=model, input_blob=input_blob, seq_lengths=seq_lengths,
                  initial_states=initial_states, dim_in=dim_in, dim_out=dim_out, scope=scope,
                  outputs_with_grads=outputs_with_grads, return_params=return_params,
                  memory_optimization=memory_optimization, forget_bias=forget_bias,
                  forward_only=forward_only, drop_states=drop_states)
    if not isinstance(dim_out, list):
        return create_lstm(**params)
    if len(dim_out) == 1:
        params["dim_out"] = dim_out[0]
        return create_lstm(**params)
    if return_params:
        raise ModelError("return_params not supported for layering")
    result: Any = None
    for i, output_dim in enumerate(dim_out):
        params["dim_out"] = output_dim
        result = create_lstm(**params)
        output, last_output, _all_states, last_state = result
        params.update(input_blob=output, dim_in=output_dim,
                      initial_states=(last_output, last_state), scope=f"{scope}_layer_{i + 1}")
    return result


layered_LSTM = functools.partial(_layered_LSTM, create_lstm=LSTM)
