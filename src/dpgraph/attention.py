"""Caffe2's ``attention`` module."""

from dpgraph.modeling.rnn.attention import (
    AttentionType,
    _apply_fc_weight_for_sum_match,
    _calc_attention_logits_from_sum_match,
    _calc_attention_weights,
    _calc_weighted_context,
    apply_dot_attention,
    apply_recurrent_attention,
    apply_regular_attention,
    apply_soft_coverage_attention,
    s,
)

__all__ = ["AttentionType", "_apply_fc_weight_for_sum_match",
           "_calc_attention_logits_from_sum_match", "_calc_attention_weights",
           "_calc_weighted_context", "apply_dot_attention", "apply_recurrent_attention",
           "apply_regular_attention", "apply_soft_coverage_attention", "s"]
