"""The RNNCell API and Caffe2's basic cells: BasicRNNCell, LSTMCell, LayerNormLSTMCell,
MILSTMCell, LayerNormMILSTMCell, with their state initializers.

A cell builds the ops of one timestep (``_apply``) into a step model;
``apply_over_sequence`` wraps them into a RecurrentNetwork op with
:func:`~dpgraph.modeling.rnn.recurrent.recurrent_net`.  Blob names follow Caffe2: with
NameScope ``P`` and cell name ``S`` the LSTM input projection is ``P+S/i2h``, its recurrent
FC ``P+S/gates_t`` and its outputs ``P+S/hidden_state_all`` etc.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from dpgraph.errors import NotSupportedError
from dpgraph.ir import scope as _scope
from dpgraph.ir.blob import BlobReference, ScopedBlobReference
from dpgraph.modeling.brew import brew
from dpgraph.modeling.initializers import Initializer
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.modeling.rnn.recurrent import recurrent_net


def _RectifyName(blob_reference_or_name: Any) -> BlobReference | None:
    """None -> None; str -> scoped BlobReference; BlobReference -> itself."""
    if blob_reference_or_name is None:
        return None
    if isinstance(blob_reference_or_name, str):
        return ScopedBlobReference(blob_reference_or_name)
    if isinstance(blob_reference_or_name, BlobReference):
        return blob_reference_or_name
    raise Exception("Unknown blob reference type")


def _RectifyNames(blob_references_or_names: Any) -> list[Any] | None:
    if blob_references_or_names is None:
        return None
    return [_RectifyName(x) for x in blob_references_or_names]


def _abstract(cell: Any) -> NotSupportedError:
    caller = inspect.stack()[1].function
    return NotSupportedError(f"{type(cell).__name__}.{caller} is an abstract RNNCell method; "
                             "override it in the cell class")


class RNNCell:
    """Base class of the cells: one step in ``_apply``, a whole sequence in
    ``apply_over_sequence``."""

    def __init__(self, name: str | None = None, forward_only: bool = False,
                 initializer: Any = None) -> None:
        self.forward_only = forward_only
        self._initializer = initializer
        self.name = name
        self.recompute_blobs: list[Any] = []

    @property
    def initializer(self) -> Any:
        return self._initializer

    @initializer.setter
    def initializer(self, value: Any) -> None:
        self._initializer = value

    def scope(self, name: str) -> str:
        return self.name + "/" + name if self.name is not None else name

    def apply_over_sequence(self, model: Any, inputs: Any, seq_lengths: Any = None,
                            initial_states: Any = None, outputs_with_grads: Any = None
                            ) -> tuple[Any, tuple[Any, ...]]:
        """Run the cell over ``inputs`` (T x N x D); return (output sequence, all states)."""
        if initial_states is None:
            with _scope.NameScope(self.name):
                if self.initializer is None:
                    raise Exception("Either initial states or initializer have to be set")
                initial_states = self.initializer.create_states(model)
        preprocessed = self.prepare_input(model, inputs)
        step_model = ModelHelper(name=self.name, param_model=model)
        input_t, timestep = step_model.net.AddScopedExternalInputs("input_t", "timestep")
        if len(initial_states) != len(self.get_state_names()):
            raise Exception("Number of initial state values provided doesn't match the number "
                            f"of states. {len(initial_states)} != {len(self.get_state_names())}")
        states_prev = step_model.net.AddScopedExternalInputs(
            *[s + "_prev" for s in self.get_state_names()])
        states = self._apply(model=step_model, input_t=input_t, seq_lengths=seq_lengths,
                             states=states_prev, timestep=timestep)
        declared = set(step_model.net.Proto().external_output)
        for state in states:
            if str(state) not in declared:
                step_model.net.AddExternalOutput(state)
        if outputs_with_grads is None:
            outputs_with_grads = [self.get_output_state_index() * 2]
        states_for_all_steps = recurrent_net(
            net=model.net, cell_net=step_model.net, inputs=[(input_t, preprocessed)],
            initial_cell_inputs=list(zip(states_prev, initial_states)),
            links=dict(zip(states_prev, states)), timestep=timestep, scope=self.name,
            forward_only=self.forward_only, outputs_with_grads=outputs_with_grads,
            recompute_blobs_on_backward=self.recompute_blobs)
        output = self._prepare_output_sequence(model, states_for_all_steps)
        return output, states_for_all_steps

    def apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any
              ) -> tuple[Any, Any]:
        """One step in the current net: (output, states)."""
        input_t = self.prepare_input(model, input_t)
        states = self._apply(model, input_t, seq_lengths, states, timestep)
        return self._prepare_output(model, states), states

    def _rectify_apply_inputs(self, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
                              extra_inputs: Any) -> tuple[Any, Any, Any, Any, Any]:
        input_t, seq_lengths, timestep = (_RectifyName(b) for b in (input_t, seq_lengths,
                                                                    timestep))
        states = _RectifyNames(states)
        if extra_inputs:
            names, sizes = zip(*extra_inputs)
            extra_inputs = list(zip(_RectifyNames(names), sizes))  # type: ignore[arg-type]
        return input_t, seq_lengths, states, timestep, extra_inputs

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        input_t, seq_lengths, states, timestep, extra_inputs = self._rectify_apply_inputs(
            input_t, seq_lengths, states, timestep, extra_inputs)
        with _scope.NameScope(self.name):
            kwargs = {}
            if "extra_inputs" in inspect.signature(self.apply_override).parameters:
                kwargs["extra_inputs"] = extra_inputs
            return self.apply_override(model, input_t, seq_lengths, states, timestep, **kwargs)

    def apply_override(self, model: Any, input_t: Any, seq_lengths: Any, states: Any,
                       timestep: Any, extra_inputs: Any = None) -> Any:
        """The ops of one step (inside NameScope(name)); returns the new states."""
        raise _abstract(self)

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        return input_blob

    def get_output_state_index(self) -> int:
        return 0

    def get_state_names(self) -> Any:
        return [self.scope(name) for name in self.get_state_names_override()]

    def get_state_names_override(self) -> Sequence[str]:
        raise _abstract(self)

    def get_output_dim(self) -> int:
        raise _abstract(self)

    def _prepare_output(self, model: Any, states: Any) -> Any:
        return states[self.get_output_state_index()]

    def _prepare_output_sequence(self, model: Any, state_outputs: Any) -> Any:
        return state_outputs[2 * self.get_output_state_index()]


class LSTMInitializer:
    """Zero initial hidden and cell states as parameters of shape [hidden_size]."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size

    def create_states(self, model: Any) -> list[BlobReference]:
        return [model.create_param(param_name=name, shape=[self.hidden_size],
                                   initializer=Initializer("ConstantFill", value=0.0))
                for name in ("initial_hidden_state", "initial_cell_state")]


class BasicRNNCell(RNNCell):
    """h_t = activation(FC(h_prev) + FC(x_t)), tanh or relu; one state ``hidden_t``."""

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float,
                 memory_optimization: bool, drop_states: bool = False, initializer: Any = None,
                 activation: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drop_states = drop_states
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.activation = activation
        if self.activation not in ("relu", "tanh"):
            raise RuntimeError(f"BasicRNNCell with unknown activation function "
                               f"({self.activation})")

    def apply_override(self, model: Any, input_t: Any, seq_lengths: Any, states: Any,
                       timestep: Any, extra_inputs: Any = None) -> Any:
        hidden_t_prev = states[0]
        gates_t = brew.fc(model, hidden_t_prev, "gates_t", dim_in=self.hidden_size,
                          dim_out=self.hidden_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        activation = model.net.Tanh if self.activation == "tanh" else model.net.Relu
        hidden_t = activation(gates_t, "hidden_t")
        if seq_lengths is not None:
            timestep = model.net.CopyFromCPUInput(timestep, "timestep_gpu")
            valid_b = model.net.GT([seq_lengths, timestep], "valid_b", broadcast=1)
            valid = model.net.Cast(valid_b, "valid", to="float")
            hidden_valid = model.net.Mul([hidden_t, valid], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden_t = hidden_valid
            else:
                invalid_b = model.net.LE([seq_lengths, timestep], "invalid_b", broadcast=1)
                invalid = model.net.Cast(invalid_b, "invalid", to="float")
                hidden_invalid = model.net.Mul([hidden_t_prev, invalid], "hidden_invalid",
                                               broadcast=1, axis=1)
                hidden_t = model.net.Add([hidden_valid, hidden_invalid], hidden_t)
        return (hidden_t,)

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=self.hidden_size, axis=2)

    def get_state_names(self) -> Any:
        return (self.scope("hidden_t"),)

    def get_output_dim(self) -> int:
        return self.hidden_size


def _gates_input(model: Any, hidden_t_prev: Any, hidden_size: int, extra_inputs: Any,
                 name: str) -> tuple[Any, int]:
    """The recurrent FC's input: h_prev, or h_prev concatenated with the extra inputs
    (attention context) along axis 2; and its width."""
    if not extra_inputs:
        return hidden_t_prev, hidden_size
    blobs, sizes = zip(*extra_inputs)
    fc_input = brew.concat(model, [hidden_t_prev] + list(blobs), name, axis=2)
    return fc_input, hidden_size + sum(sizes)


def _unit_inputs(*blobs: Any) -> list[Any]:
    """LSTMUnit's inputs, without seq_lengths when it is None."""
    return [b for b in blobs if b is not None]


def _lengths_flag(seq_lengths: Any) -> dict[str, Any]:
    """Caffe2's LayerNorm and MI cells always pass seq_lengths (and no flag); without one,
    dpgraph says so with ``sequence_lengths=False`` instead of failing."""
    return {} if seq_lengths is not None else {"sequence_lengths": False}


class _LSTMGates(RNNCell):
    """What the LSTMUnit cells share: their configuration, the input projection ``i2h``
    (4 * hidden gates) and the output width."""

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float,
                 memory_optimization: bool, drop_states: bool = False, initializer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * self.hidden_size

    def get_input_params(self) -> dict[str, str]:
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size,
                       dim_out=self.gates_size, axis=2)

    def get_output_dim(self) -> int:
        return self.hidden_size


class LSTMCell(_LSTMGates):
    """The LSTM of LSTMUnit: gates = FC(h_prev) + FC(x_t), laid out [i | f | o | g]."""

    def apply_override(self, model: Any, input_t: Any, seq_lengths: Any, states: Any,
                       timestep: Any, extra_inputs: Any = None) -> Any:
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = _gates_input(model, hidden_t_prev, self.hidden_size,
                                              extra_inputs, "gates_concatenated_input_t")
        gates_t = brew.fc(model, fc_input, "gates_t", dim_in=fc_input_dim,
                          dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        hidden_t, cell_t = model.net.LSTMUnit(
            _unit_inputs(hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep),
            ["hidden_state", "cell_state"], forget_bias=self.forget_bias,
            drop_states=self.drop_states, sequence_lengths=(seq_lengths is not None))
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_recurrent_params(self) -> dict[str, str]:
        return {"weights": self.scope("gates_t") + "_w", "biases": self.scope("gates_t") + "_b"}

    def get_state_names_override(self) -> Sequence[str]:
        return ["hidden_t", "cell_t"]


class LayerNormLSTMCell(_LSTMGates):
    """LSTMCell with layer normalisation of the gates (``S/gates_t_norm``)."""

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = _gates_input(model, hidden_t_prev, self.hidden_size,
                                              extra_inputs,
                                              self.scope("gates_concatenated_input_t"))
        gates_t = brew.fc(model, fc_input, self.scope("gates_t"), dim_in=fc_input_dim,
                          dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        gates_t, _, _ = brew.layer_norm(model, self.scope("gates_t"), self.scope("gates_t_norm"),
                                        dim_in=self.gates_size, axis=-1)
        hidden_t, cell_t = model.net.LSTMUnit(
            _unit_inputs(hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep),
            list(self.get_state_names()), forget_bias=self.forget_bias,
            drop_states=self.drop_states, **_lengths_flag(seq_lengths))
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_state_names(self) -> Any:
        return (self.scope("hidden_t"), self.scope("cell_t"))


class MILSTMCell(LSTMCell):
    """Multiplicative-integration LSTM: gates = (alpha*x + beta1)*FC(h_prev) + beta2*x + b."""

    _layer_norm = False

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = _gates_input(model, hidden_t_prev, self.hidden_size,
                                              extra_inputs,
                                              self.scope("gates_concatenated_input_t"))
        prev_t = brew.fc(model, fc_input, self.scope("prev_t"), dim_in=fc_input_dim,
                         dim_out=self.gates_size, axis=2)
        alpha, beta_h, beta_i, b = (
            model.create_param(self.scope(name), shape=[self.gates_size],
                               initializer=Initializer("ConstantFill", value=value))
            for name, value in (("alpha", 1.0), ("beta1", 1.0), ("beta2", 1.0), ("b", 0.0)))
        scaled = model.net.ElementwiseLinear([input_t, alpha, beta_h],
                                             self.scope("alpha_by_input_t_plus_beta_h"), axis=2)
        scaled_by_prev = model.net.Mul([scaled, prev_t],
                                       self.scope("alpha_by_input_t_plus_beta_h_by_prev_t"))
        shifted = model.net.ElementwiseLinear([input_t, beta_i, b],
                                              self.scope("beta_i_by_input_t_plus_b"), axis=2)
        gates_t = brew.sum(model, [scaled_by_prev, shifted], self.scope("gates_t"))
        if self._layer_norm:
            gates_t, _, _ = brew.layer_norm(model, self.scope("gates_t"),
                                            self.scope("gates_t_norm"), dim_in=self.gates_size,
                                            axis=-1)
        hidden_t, cell_t = model.net.LSTMUnit(
            _unit_inputs(hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep),
            [self.scope("hidden_t_intermediate"), self.scope("cell_t")],
            forget_bias=self.forget_bias, drop_states=self.drop_states,
            **_lengths_flag(seq_lengths))
        model.net.AddExternalOutputs(cell_t, hidden_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t


class LayerNormMILSTMCell(MILSTMCell):
    """MILSTMCell with layer normalisation of the gates."""

    _layer_norm = True
