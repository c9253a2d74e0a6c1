"""Recurrent networks: the ``recurrent_net`` builder and Caffe2's rnn_cell, gru_cell and
attention modules (the top-level ``dpgraph.rnn_cell`` etc. re-export these)."""
