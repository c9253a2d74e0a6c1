"""The GRU cell of Caffe2's ``gru_cell``: reset and update gates from FCs of h_prev, the
output gate from FC(r * h_prev) (or r * FC(h_prev) with ``linear_before_reset``), and
GRUUnit for h = u*h_prev + (1-u)*tanh(o)."""

from __future__ import annotations

import functools
from typing import Any

from dpgraph.modeling.brew import brew
from dpgraph.modeling.rnn.cell import RNNCell
from dpgraph.modeling.rnn.functional import _LSTM


class GRUCell(RNNCell):
    """One state, ``hidden_t``; ``forget_bias`` is accepted and unused, as in Caffe2."""

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float,
                 memory_optimization: bool, drop_states: bool = False,
                 linear_before_reset: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.linear_before_reset = linear_before_reset

    def _fc(self, model: Any, blob_in: Any, name: str) -> Any:
        return brew.fc(model, blob_in, self.scope(name), dim_in=self.hidden_size,
                       dim_out=self.hidden_size, axis=2)

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        hidden_t_prev = states[0]
        input_reset, input_update, input_output = model.net.Split(
            [input_t], [self.scope("input_t_reset"), self.scope("input_t_update"),
                        self.scope("input_t_output")], axis=2)
        reset_gate_t = self._fc(model, hidden_t_prev, "reset_gate_t")
        update_gate_t = self._fc(model, hidden_t_prev, "update_gate_t")
        reset_gate_t = model.net.Sum([reset_gate_t, input_reset], self.scope("reset_gate_t"))
        reset_sigmoid = model.net.Sigmoid(reset_gate_t, self.scope("reset_gate_t_sigmoid"))
        if self.linear_before_reset:
            output_fc = self._fc(model, hidden_t_prev, "output_gate_t")
            output_gate_t = model.net.Mul([reset_sigmoid, output_fc],
                                          self.scope("output_gate_t_mul"))
        else:
            modified = model.net.Mul([reset_sigmoid, hidden_t_prev],
                                     self.scope("modified_hidden_t_prev"))
            output_gate_t = self._fc(model, modified, "output_gate_t")
        update_gate_t = model.net.Sum([update_gate_t, input_update],
                                      self.scope("update_gate_t"))
        output_gate_t = model.net.Sum([output_gate_t, input_output],
                                      self.scope("output_gate_t_summed"))
        gates_t, _ = model.net.Concat([reset_gate_t, update_gate_t, output_gate_t],
                                      [self.scope("gates_t"), self.scope("_gates_t_concat_dims")],
                                      axis=2)
        inputs = [hidden_t_prev, gates_t]
        inputs += [seq_lengths, timestep] if seq_lengths is not None else [timestep]
        hidden_t = model.net.GRUUnit(inputs, list(self.get_state_names()),
                                     forget_bias=self.forget_bias, drop_states=self.drop_states,
                                     sequence_lengths=(seq_lengths is not None))
        model.net.AddExternalOutputs(hidden_t)
        return (hidden_t,)

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=3 * self.hidden_size, axis=2)

    def get_state_names(self) -> Any:
        return (self.scope("hidden_t"),)

    def get_output_dim(self) -> int:
        return self.hidden_size


GRU = functools.partial(_LSTM, GRUCell)
