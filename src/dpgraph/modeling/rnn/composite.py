"""Cells built from other cells: DropoutCell, MultiRNNCell, UnrolledCell and the attention
cells (AttentionCell, LSTMWithAttentionCell, MILSTMWithAttentionCell)."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelError
from dpgraph.ir import scope as _scope
from dpgraph.ir.device import CPU, DeviceOption, IsGPUDeviceType
from dpgraph.modeling.brew import brew
from dpgraph.modeling.parameter_sharing import ParameterSharing
from dpgraph.modeling.rnn.attention import (
    AttentionType,
    apply_dot_attention,
    apply_recurrent_attention,
    apply_regular_attention,
    apply_soft_coverage_attention,
)
from dpgraph.modeling.rnn.cell import LSTMCell, MILSTMCell, RNNCell, _RectifyName
from dpgraph.proto import caffe2_pb2


class DropoutCell(RNNCell):
    """Applies Dropout to the output of ``internal_cell`` (not inside the recurrence)."""

    def __init__(self, internal_cell: RNNCell, dropout_ratio: float | None = None,
                 use_cudnn: bool = False, **kwargs: Any) -> None:
        self.internal_cell = internal_cell
        self.dropout_ratio = dropout_ratio
        if "is_test" not in kwargs:
            raise ModelError("Argument 'is_test' is required")
        self.is_test = kwargs.pop("is_test")
        self.use_cudnn = use_cudnn
        super().__init__(**kwargs)
        self.prepare_input = internal_cell.prepare_input  # type: ignore[method-assign]
        self.get_output_state_index = (  # type: ignore[method-assign]
            internal_cell.get_output_state_index)
        self.get_state_names = internal_cell.get_state_names  # type: ignore[method-assign]
        self.get_output_dim = internal_cell.get_output_dim  # type: ignore[method-assign]
        self.mask = 0

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        return self.internal_cell._apply(model, input_t, seq_lengths, states, timestep,
                                         extra_inputs=extra_inputs)

    def _prepare_output(self, model: Any, states: Any) -> Any:
        return self._apply_dropout(model, self.internal_cell._prepare_output(model, states))

    def _prepare_output_sequence(self, model: Any, state_outputs: Any) -> Any:
        output = self.internal_cell._prepare_output_sequence(model, state_outputs)
        return self._apply_dropout(model, output)

    def _apply_dropout(self, model: Any, output: Any) -> Any:
        if self.dropout_ratio and not self.forward_only:
            with _scope.NameScope(self.name or ""):
                output = brew.dropout(model, output,
                                      str(output) + f"_with_dropout_mask{self.mask}",
                                      ratio=float(self.dropout_ratio), is_test=self.is_test,
                                      use_cudnn=self.use_cudnn)
                self.mask += 1
        return output


class MultiRNNCellInitializer:
    """The initial states of every layer, each created in NameScope ``layer_<i>/<name>``."""

    def __init__(self, cells: list[RNNCell]) -> None:
        self.cells = cells

    def create_states(self, model: Any) -> list[Any]:
        states: list[Any] = []
        for i, cell in enumerate(self.cells):
            if cell.initializer is None:
                raise Exception("Either initial states or initializer have to be set")
            with _scope.NameScope(f"layer_{i}"), _scope.NameScope(cell.name):
                states.extend(cell.initializer.create_states(model))
        return states


class MultiRNNCell(RNNCell):
    """Stacked cells; layer i > 0 projects its input inside the step net."""

    def __init__(self, cells: list[RNNCell], residual_output_layers: list[int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cells = cells
        self.residual_output_layers = list(residual_output_layers or [])
        per_layer, base = [], 0
        for cell in cells:
            per_layer.append(base + cell.get_output_state_index())
            base += len(cell.get_state_names())
        self.output_connected_layers: list[int] = []
        self.output_indices: list[int] = []
        for i in range(len(cells) - 1):
            if i + 1 in self.residual_output_layers:
                self.output_connected_layers.append(i)
                self.output_indices.append(per_layer[i])
            else:
                self.output_connected_layers, self.output_indices = [], []
        self.output_connected_layers.append(len(cells) - 1)
        self.output_indices.append(per_layer[-1])
        self.state_names: list[str] = []
        for i, cell in enumerate(cells):
            self.state_names.extend(map(self.layer_scoper(i), cell.get_state_names()))
        self.initializer = MultiRNNCellInitializer(cells)

    def layer_scoper(self, layer_id: int) -> Any:
        def helper(name: str) -> str:
            return f"{self.name}/layer_{layer_id}/{name}"
        return helper

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        input_blob = _RectifyName(input_blob)
        with _scope.NameScope(self.name or ""):
            return self.cells[0].prepare_input(model, input_blob)

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        input_t, seq_lengths, states, timestep, extra_inputs = self._rectify_apply_inputs(
            input_t, seq_lengths, states, timestep, extra_inputs)
        counts = [len(cell.get_state_names()) for cell in self.cells]
        if len(states) != sum(counts):
            raise ModelError(f"MultiRNNCell: got {len(states)} states for layers needing "
                             f"{counts}")
        next_states: list[Any] = []
        index, layer_input = 0, input_t
        for i, cell in enumerate(self.cells):
            with _scope.NameScope(self.name), _scope.NameScope(f"layer_{i}"):
                layer_states = states[index:index + counts[i]]
                index += counts[i]
                prepared = cell.prepare_input(model, layer_input) if i > 0 else layer_input
                layer_next = cell._apply(model, prepared, seq_lengths, layer_states, timestep,
                                         extra_inputs=None if i > 0 else extra_inputs)
                if i != len(self.cells) - 1:
                    output = cell._prepare_output(model, layer_next)
                    if i > 0 and i in self.residual_output_layers:
                        layer_input = brew.sum(model, [output, layer_input],
                                               self.scope(f"residual_output_{i}"))
                    else:
                        layer_input = output
            next_states.extend(layer_next)
        return next_states

    def get_state_names(self) -> Any:
        return self.state_names

    def get_output_state_index(self) -> int:
        return (sum(len(c.get_state_names()) for c in self.cells[:-1])
                + self.cells[-1].get_output_state_index())

    def _connected_outputs(self, model: Any, states: Any, stride: int, sequence: bool) -> Any:
        outputs, index = [], 0
        for i, cell in enumerate(self.cells):
            count = len(cell.get_state_names())
            if i in self.output_connected_layers:
                layer = states[index:index + stride * count]
                outputs.append(cell._prepare_output_sequence(model, layer) if sequence
                               else cell._prepare_output(model, layer))
            index += stride * count
        if len(outputs) == 1:
            return outputs[0]
        name = "residual_output_sequence" if sequence else "residual_output"
        return brew.sum(model, outputs, self.scope(name))

    def _prepare_output(self, model: Any, states: Any) -> Any:
        return self._connected_outputs(model, states, 1, False)

    def _prepare_output_sequence(self, model: Any, states: Any) -> Any:
        return self._connected_outputs(model, states, 2, True)


class UnrolledCell(RNNCell):
    """``cell`` applied T times in the main net, without a RecurrentNetwork op."""

    def __init__(self, cell: RNNCell, T: int) -> None:
        self.T = T
        self.cell = cell

    def apply_over_sequence(self, model: Any, inputs: Any, seq_lengths: Any = None,
                            initial_states: Any = None, outputs_with_grads: Any = None
                            ) -> tuple[Any, tuple[Any, ...]]:
        inputs = self.cell.prepare_input(model, inputs)
        split = model.net.Split(inputs, [str(inputs) + f"_timestep_{i}" for i in range(self.T)],
                                axis=0)
        if self.T == 1:
            split = [split]
        states, all_states = initial_states, []
        for t in range(self.T):
            name = f"timestep_{t}"
            with ParameterSharing({name: ""}), _scope.NameScope(name):
                timestep = model.param_init_net.ConstantFill(
                    [], "timestep", value=t, shape=[1], dtype=caffe2_pb2.TensorProto.INT32,
                    device_option=DeviceOption(CPU))
                states = self.cell._apply(model=model, input_t=split[t],
                                          seq_lengths=seq_lengths, states=states,
                                          timestep=timestep)
            all_states.append(states)
        concatenated = []
        for values in zip(*all_states):
            cut = str(values[0])[len("timestep_0/"):]
            concatenated.append(model.net.Concat(list(values), [cut + "_concat",
                                                               cut + "_concat_info"], axis=0)[0])
        outputs = tuple(v for pair in zip(concatenated, states) for v in pair)
        if outputs_with_grads is None:
            raise ModelError("UnrolledCell.apply_over_sequence needs outputs_with_grads")
        for i in sorted(set(range(len(outputs))) - set(outputs_with_grads)):
            model.net.ZeroGradient(outputs[i], [])
        return self.cell._prepare_output_sequence(model, outputs), outputs


class AttentionCell(RNNCell):
    """A decoder cell whose recurrent input also gets the previous attention context."""

    def __init__(self, encoder_output_dim: int, encoder_outputs: Any, encoder_lengths: Any,
                 decoder_cell: RNNCell, decoder_state_dim: int, attention_type: int,
                 weighted_encoder_outputs: Any, attention_memory_optimization: bool,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder_output_dim = encoder_output_dim
        self.encoder_outputs = encoder_outputs
        self.encoder_lengths = encoder_lengths
        self.decoder_cell = decoder_cell
        self.decoder_state_dim = decoder_state_dim
        self.weighted_encoder_outputs = weighted_encoder_outputs
        self.encoder_outputs_transposed: Any = None
        if attention_type not in (AttentionType.Regular, AttentionType.Recurrent,
                                  AttentionType.Dot, AttentionType.SoftCoverage):
            raise ModelError(f"AttentionCell: unknown attention_type {attention_type!r}; use "
                             "an AttentionType value")
        self.attention_type = attention_type
        self.attention_memory_optimization = attention_memory_optimization

    def _coverage(self) -> bool:
        return self.attention_type == AttentionType.SoftCoverage

    def _apply(self, model: Any, input_t: Any, seq_lengths: Any, states: Any, timestep: Any,
               extra_inputs: Any = None) -> Any:
        tail = 2 if self._coverage() else 1
        decoder_prev, context_prev = states[:-tail], states[-tail]
        if extra_inputs is not None:
            raise ModelError("AttentionCell takes no extra_inputs")
        decoder_states = self.decoder_cell._apply(
            model, input_t, seq_lengths, decoder_prev, timestep,
            extra_inputs=[(context_prev, self.encoder_output_dim)])
        self.hidden_t_intermediate = self.decoder_cell._prepare_output(model, decoder_states)
        context, self.attention_weights_3d, blobs, coverage = self._attend(
            model, context_prev, states[-1])
        if self.attention_memory_optimization:
            self.recompute_blobs.extend(blobs)
        output = list(decoder_states) + [context] + ([coverage] if self._coverage() else [])
        index = self.decoder_cell.get_output_state_index()
        output[index] = model.Copy(output[index], self.scope("hidden_t_external"))
        model.net.AddExternalOutputs(*output)
        return output

    def _attend(self, model: Any, context_prev: Any, coverage_prev: Any
                ) -> tuple[Any, Any, list[Any], Any]:
        common = dict(model=model, encoder_output_dim=self.encoder_output_dim,
                      encoder_outputs_transposed=self.encoder_outputs_transposed,
                      decoder_hidden_state_t=self.hidden_t_intermediate,
                      decoder_hidden_state_dim=self.decoder_state_dim, scope=self.name,
                      encoder_lengths=self.encoder_lengths)
        if self.attention_type == AttentionType.Recurrent:
            return (*apply_recurrent_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                attention_weighted_encoder_context_t_prev=context_prev, **common), None)
        if self.attention_type == AttentionType.Regular:
            return (*apply_regular_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs, **common), None)
        if self.attention_type == AttentionType.Dot:
            return (*apply_dot_attention(**common), None)
        return apply_soft_coverage_attention(
            weighted_encoder_outputs=self.weighted_encoder_outputs,
            coverage_t_prev=coverage_prev, coverage_weights=self.coverage_weights, **common)

    def get_attention_weights(self) -> Any:
        return self.attention_weights_3d

    def prepare_input(self, model: Any, input_blob: Any) -> Any:
        if self.encoder_outputs_transposed is None:
            self.encoder_outputs_transposed = brew.transpose(
                model, self.encoder_outputs, self.scope("encoder_outputs_transposed"),
                axes=[1, 2, 0])
        if self.weighted_encoder_outputs is None and self.attention_type != AttentionType.Dot:
            self.weighted_encoder_outputs = brew.fc(
                model, self.encoder_outputs, self.scope("weighted_encoder_outputs"),
                dim_in=self.encoder_output_dim, dim_out=self.encoder_output_dim, axis=2)
        return self.decoder_cell.prepare_input(model, input_blob)

    def build_initial_coverage(self, model: Any) -> Any:
        """Zero coverage of length L (SoftCoverage only); also creates the coverage FC."""
        if not self._coverage():
            raise ModelError("build_initial_coverage needs attention_type SoftCoverage")
        self.coverage_weights = brew.fc(model, self.encoder_outputs,
                                        self.scope("coverage_weights"),
                                        dim_in=self.encoder_output_dim,
                                        dim_out=self.encoder_output_dim, axis=2)
        length = model.net.Slice(model.net.Shape(self.encoder_outputs), starts=[0], ends=[1])
        device = _scope.CurrentDeviceScope()
        if device is not None and IsGPUDeviceType(device.device_type):
            length = model.net.CopyGPUToCPU(length, "encoder_length_cpu")
        return model.net.ConstantFill(length, self.scope("initial_coverage"), value=0.0,
                                      input_as_shape=1)

    def get_state_names(self) -> Any:
        names = list(self.decoder_cell.get_state_names())
        names[self.get_output_state_index()] = self.scope("hidden_t_external")
        names.append(self.scope("attention_weighted_encoder_context_t"))
        if self._coverage():
            names.append(self.scope("coverage_t"))
        return names

    def get_output_dim(self) -> int:
        return self.decoder_state_dim + self.encoder_output_dim

    def get_output_state_index(self) -> int:
        return self.decoder_cell.get_output_state_index()

    def _prepare_output(self, model: Any, states: Any) -> Any:
        context = states[-2] if self._coverage() else states[-1]
        with _scope.NameScope(self.name or ""):
            return brew.concat(model, [self.hidden_t_intermediate, context],
                               "states_and_context_combination", axis=2)

    def _prepare_output_sequence(self, model: Any, state_outputs: Any) -> Any:
        tail = 2 if self._coverage() else 1
        decoder_output = self.decoder_cell._prepare_output_sequence(
            model, state_outputs[:-2 * tail])
        context = state_outputs[2 * (len(self.get_state_names()) - tail)]
        with _scope.NameScope(self.name or ""):
            return brew.concat(model, [decoder_output, context],
                               "states_and_context_combination", axis=2)


class LSTMWithAttentionCell(AttentionCell):
    """AttentionCell around an LSTMCell named ``<name>/decoder``."""

    def __init__(self, encoder_output_dim: int, encoder_outputs: Any, encoder_lengths: Any,
                 decoder_input_dim: int, decoder_state_dim: int, name: str, attention_type: int,
                 weighted_encoder_outputs: Any, forget_bias: float,
                 lstm_memory_optimization: bool, attention_memory_optimization: bool,
                 forward_only: bool = False) -> None:
        decoder_cell = LSTMCell(input_size=decoder_input_dim, hidden_size=decoder_state_dim,
                                forget_bias=forget_bias,
                                memory_optimization=lstm_memory_optimization,
                                name=f"{name}/decoder", forward_only=False, drop_states=False)
        super().__init__(encoder_output_dim=encoder_output_dim,
                         encoder_outputs=encoder_outputs, encoder_lengths=encoder_lengths,
                         decoder_cell=decoder_cell, decoder_state_dim=decoder_state_dim,
                         name=name, attention_type=attention_type,
                         weighted_encoder_outputs=weighted_encoder_outputs,
                         attention_memory_optimization=attention_memory_optimization,
                         forward_only=forward_only)


class MILSTMWithAttentionCell(AttentionCell):
    """AttentionCell around an MILSTMCell named ``<name>/decoder`` (no encoder lengths;
    Caffe2's constructor forgot to pass them on and raised TypeError, dpgraph passes None)."""

    def __init__(self, encoder_output_dim: int, encoder_outputs: Any, decoder_input_dim: int,
                 decoder_state_dim: int, name: str, attention_type: int,
                 weighted_encoder_outputs: Any, forget_bias: float,
                 lstm_memory_optimization: bool, attention_memory_optimization: bool,
                 forward_only: bool = False) -> None:
        decoder_cell = MILSTMCell(input_size=decoder_input_dim, hidden_size=decoder_state_dim,
                                  forget_bias=forget_bias,
                                  memory_optimization=lstm_memory_optimization,
                                  name=f"{name}/decoder", forward_only=False,
                                  drop_states=False)
        super().__init__(encoder_output_dim=encoder_output_dim,
                         encoder_outputs=encoder_outputs, encoder_lengths=None,
                         decoder_cell=decoder_cell, decoder_state_dim=decoder_state_dim,
                         name=name, attention_type=attention_type,
                         weighted_encoder_outputs=weighted_encoder_outputs,
                         attention_memory_optimization=attention_memory_optimization,
                         forward_only=forward_only)
