"""Attention for decoder cells (Caffe2's ``caffe2.python.attention``).

Shapes: encoder outputs (L, B, E), their transpose ``encoder_outputs_transposed`` (B, E, L),
the decoder hidden state (1, B, D).  Each ``apply_*`` returns the attention-weighted encoder
context (1, B, E), the attention weights (B, L, 1) and the blobs worth recomputing on
backward (``SoftCoverage`` also returns the new coverage).
"""

from __future__ import annotations

from typing import Any

from dpgraph.modeling.brew import brew


class AttentionType:
    Regular, Recurrent, Dot, SoftCoverage = tuple(range(4))


def s(scope: Any, name: Any) -> str:
    """``"scope/name"`` (the current NameScope is added when it names an op output)."""
    return f"{scope}/{name}"


def _calc_weighted_context(model: Any, encoder_outputs_transposed: Any,
                           encoder_output_dim: int, attention_weights_3d: Any,
                           scope: Any) -> Any:
    context = brew.batch_mat_mul(model, [encoder_outputs_transposed, attention_weights_3d],
                                 s(scope, "attention_weighted_encoder_context"))
    context, _ = model.net.Reshape(
        context, [context, s(scope, "attention_weighted_encoder_context_old_shape")],
        shape=[1, -1, encoder_output_dim])
    return context


def _calc_attention_weights(model: Any, attention_logits_transposed: Any, scope: Any,
                            encoder_lengths: Any = None) -> Any:
    if encoder_lengths is not None:
        attention_logits_transposed = model.net.SequenceMask(
            [attention_logits_transposed, encoder_lengths], ["masked_attention_logits"],
            mode="sequence")
    return brew.softmax(model, attention_logits_transposed, s(scope, "attention_weights_3d"),
                        engine="CUDNN", axis=1)


def _calc_attention_logits_from_sum_match(model: Any, decoder_hidden_encoder_outputs_sum: Any,
                                          encoder_output_dim: int, scope: Any) -> Any:
    summed = model.net.Tanh(decoder_hidden_encoder_outputs_sum,
                            decoder_hidden_encoder_outputs_sum)
    logits = brew.fc(model, summed, s(scope, "attention_logits"), dim_in=encoder_output_dim,
                     dim_out=1, axis=2, freeze_bias=True)
    return brew.transpose(model, logits, s(scope, "attention_logits_transposed"),
                          axes=[1, 0, 2])


def _apply_fc_weight_for_sum_match(model: Any, input: Any, dim_in: int, dim_out: int,
                                   scope: Any, name: str) -> Any:
    output = brew.fc(model, input, s(scope, name), dim_in=dim_in, dim_out=dim_out, axis=2)
    return model.net.Squeeze(output, output, dims=[0])


def _weights_and_context(model: Any, summed: Any, encoder_output_dim: int,
                         encoder_outputs_transposed: Any, scope: Any,
                         encoder_lengths: Any) -> tuple[Any, Any]:
    logits = _calc_attention_logits_from_sum_match(model, summed, encoder_output_dim, scope)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim,
                                     weights, scope)
    return context, weights


def apply_recurrent_attention(model: Any, encoder_output_dim: int,
                              encoder_outputs_transposed: Any, weighted_encoder_outputs: Any,
                              decoder_hidden_state_t: Any, decoder_hidden_state_dim: int,
                              attention_weighted_encoder_context_t_prev: Any, scope: Any,
                              encoder_lengths: Any = None) -> tuple[Any, Any, list[Any]]:
    """Regular attention whose match also sees the previous context."""
    weighted_prev = _apply_fc_weight_for_sum_match(
        model, attention_weighted_encoder_context_t_prev, encoder_output_dim,
        encoder_output_dim, scope, "weighted_prev_attention_context")
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, encoder_output_dim, scope,
        "weighted_decoder_hidden_state")
    tmp = model.net.Add([weighted_prev, weighted_decoder],
                        s(scope, "decoder_hidden_encoder_outputs_sum_tmp"))
    summed = model.net.Add([weighted_encoder_outputs, tmp],
                           s(scope, "decoder_hidden_encoder_outputs_sum"), broadcast=1)
    context, weights = _weights_and_context(model, summed, encoder_output_dim,
                                            encoder_outputs_transposed, scope, encoder_lengths)
    return context, weights, [summed]


def apply_regular_attention(model: Any, encoder_output_dim: int,
                            encoder_outputs_transposed: Any, weighted_encoder_outputs: Any,
                            decoder_hidden_state_t: Any, decoder_hidden_state_dim: int,
                            scope: Any, encoder_lengths: Any = None
                            ) -> tuple[Any, Any, list[Any]]:
    """Additive (Bahdanau) attention: v . tanh(W_e e + W_d h)."""
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, encoder_output_dim, scope,
        "weighted_decoder_hidden_state")
    summed = model.net.Add([weighted_encoder_outputs, weighted_decoder],
                           s(scope, "decoder_hidden_encoder_outputs_sum"), broadcast=1,
                           use_grad_hack=1)
    context, weights = _weights_and_context(model, summed, encoder_output_dim,
                                            encoder_outputs_transposed, scope, encoder_lengths)
    return context, weights, [summed]


def apply_dot_attention(model: Any, encoder_output_dim: int, encoder_outputs_transposed: Any,
                        decoder_hidden_state_t: Any, decoder_hidden_state_dim: int, scope: Any,
                        encoder_lengths: Any = None) -> tuple[Any, Any, list[Any]]:
    """Dot-product attention (the decoder state is projected to E first when D != E)."""
    if decoder_hidden_state_dim != encoder_output_dim:
        weighted = brew.fc(model, decoder_hidden_state_t,
                           s(scope, "weighted_decoder_hidden_state"),
                           dim_in=decoder_hidden_state_dim, dim_out=encoder_output_dim, axis=2)
    else:
        weighted = decoder_hidden_state_t
    squeezed = model.net.Squeeze(weighted, s(scope, "squeezed_weighted_decoder_hidden_state"),
                                 dims=[0])
    expanded = model.net.ExpandDims(squeezed, squeezed, dims=[2])
    logits = model.net.BatchMatMul([encoder_outputs_transposed, expanded],
                                   s(scope, "attention_logits"), trans_a=1)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim,
                                     weights, scope)
    return context, weights, []


def apply_soft_coverage_attention(model: Any, encoder_output_dim: int,
                                  encoder_outputs_transposed: Any,
                                  weighted_encoder_outputs: Any, decoder_hidden_state_t: Any,
                                  decoder_hidden_state_dim: int, scope: Any,
                                  encoder_lengths: Any, coverage_t_prev: Any,
                                  coverage_weights: Any) -> tuple[Any, Any, list[Any], Any]:
    """Regular attention plus a coverage term: the attention paid so far, per position."""
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model, decoder_hidden_state_t, decoder_hidden_state_dim, encoder_output_dim, scope,
        "weighted_decoder_hidden_state")
    tmp = model.net.Add([weighted_encoder_outputs, weighted_decoder],
                        s(scope, "decoder_hidden_encoder_outputs_sum_tmp"), broadcast=1)
    coverage_2d = model.net.Squeeze(coverage_t_prev, s(scope, "coverage_t_prev_2d"), dims=[0])
    coverage_transposed = brew.transpose(model, coverage_2d,
                                         s(scope, "coverage_t_prev_transposed"))
    scaled = model.net.Mul([coverage_weights, coverage_transposed],
                           s(scope, "scaled_coverage_weights"), broadcast=1, axis=0)
    summed = model.net.Add([tmp, scaled], s(scope, "decoder_hidden_encoder_outputs_sum"))
    context, weights = _weights_and_context(model, summed, encoder_output_dim,
                                            encoder_outputs_transposed, scope, encoder_lengths)
    weights_2d = model.net.Squeeze(weights, s(scope, "attention_weights_2d"), dims=[2])
    coverage_t = model.net.Add([coverage_t_prev, weights_2d], s(scope, "coverage_t"),
                               broadcast=1)
    return context, weights, [summed], coverage_t
