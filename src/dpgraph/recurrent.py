"""Caffe2's ``recurrent`` module: ``recurrent_net`` and the RNN executor helpers."""

from dpgraph.modeling.rnn.recurrent import (
    recurrent_net,
    retrieve_step_blobs,
    set_rnn_executor_config,
)

__all__ = ["recurrent_net", "retrieve_step_blobs", "set_rnn_executor_config"]
