"""Caffe2's ``rnn_cell`` module: the RNN cells and the functional LSTM builders."""

from dpgraph import brew, core, scope, utils, workspace
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.modeling.rnn import recurrent
from dpgraph.modeling.rnn.attention import (
    AttentionType,
    apply_dot_attention,
    apply_recurrent_attention,
    apply_regular_attention,
    apply_soft_coverage_attention,
)
from dpgraph.modeling.rnn.cell import (
    BasicRNNCell,
    LayerNormLSTMCell,
    LayerNormMILSTMCell,
    LSTMCell,
    LSTMInitializer,
    MILSTMCell,
    RNNCell,
    _RectifyName,
    _RectifyNames,
)
from dpgraph.modeling.rnn.composite import (
    AttentionCell,
    DropoutCell,
    LSTMWithAttentionCell,
    MILSTMWithAttentionCell,
    MultiRNNCell,
    MultiRNNCellInitializer,
    UnrolledCell,
)
from dpgraph.modeling.rnn.functional import (
    _LSTM,
    LSTM,
    MILSTM,
    BasicRNN,
    GetLSTMParamNames,
    InitFromLSTMParams,
    LayerNormLSTM,
    LayerNormMILSTM,
    LSTMWithAttention,
    _layered_LSTM,
    cudnn_LSTM,
    layered_LSTM,
)

__all__ = [
    "LSTM", "MILSTM", "AttentionCell", "AttentionType", "BasicRNN", "BasicRNNCell",
    "DropoutCell", "GetLSTMParamNames", "InitFromLSTMParams", "LSTMCell", "LSTMInitializer",
    "LSTMWithAttention", "LSTMWithAttentionCell", "LayerNormLSTM", "LayerNormLSTMCell",
    "LayerNormMILSTM", "LayerNormMILSTMCell", "MILSTMCell", "MILSTMWithAttentionCell",
    "ModelHelper", "MultiRNNCell", "MultiRNNCellInitializer", "RNNCell", "UnrolledCell",
    "_LSTM", "_RectifyName", "_RectifyNames", "_layered_LSTM", "apply_dot_attention",
    "apply_recurrent_attention", "apply_regular_attention", "apply_soft_coverage_attention",
    "brew", "core", "cudnn_LSTM", "layered_LSTM", "recurrent", "scope", "utils", "workspace",
]
