"""Caffe2's ``rnn.rnn_cell_test_util``: numpy activations and ``_prepare_rnn``, the helper
Caffe2's RNN tests build their models with."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph import scope, workspace
from dpgraph.model_helper import ModelHelper


def sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


def tanh(x: Any) -> Any:
    return 2.0 * sigmoid(2.0 * x) - 1.0


def _prepare_rnn(t: int, n: int, dim_in: int, create_rnn: Any, outputs_with_grads: Any,
                 forget_bias: float, memory_optim: bool = False, forward_only: bool = False,
                 drop_states: bool = False, T: int | None = None,
                 two_d_initial_states: bool | None = None, dim_out: Any = None,
                 num_states: int = 2, **kwargs: Any) -> tuple[Any, Any, list[Any]]:
    """Build ``create_rnn`` (e.g. rnn_cell.LSTM) on external inputs ``state_<i>/layer_<l>``
    (fed with random (n, d) or (1, n, d) values) and ``test_name_scope/input_blob``.

    Returns:
        (the RNN's outputs, the net, [the initial states..., the input blob]).
    """
    if dim_out is None:
        dim_out = [dim_in]
    model = ModelHelper(name="external")
    if two_d_initial_states is None:
        two_d_initial_states = bool(np.random.randint(2))

    def initial_state(d: int) -> np.ndarray:
        shape = (n, d) if two_d_initial_states else (1, n, d)
        return np.random.randn(*shape).astype(np.float32)

    states = []
    for layer, d in enumerate(dim_out):
        for i in range(num_states):
            states.append(model.net.AddExternalInput(f"state_{i}/layer_{layer}"))
            workspace.FeedBlob(states[-1], initial_state(d))
    with scope.NameScope("test_name_scope"):
        input_blob, seq_lengths = model.net.AddScopedExternalInputs("input_blob",
                                                                    "seq_lengths")
        outputs = create_rnn(model, input_blob, seq_lengths, states, dim_in=dim_in,
                             dim_out=dim_out, scope="external/recurrent",
                             outputs_with_grads=outputs_with_grads,
                             memory_optimization=memory_optim, forget_bias=forget_bias,
                             forward_only=forward_only, drop_states=drop_states,
                             static_rnn_unroll_size=T, **kwargs)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob(seq_lengths,
                       np.random.randint(1, t + 1, size=(n,)).astype(np.int32))
    return outputs, model.net, states + [input_blob]
