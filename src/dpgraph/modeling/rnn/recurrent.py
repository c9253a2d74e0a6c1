"""``recurrent_net``: wrap a one-timestep cell net into a RecurrentNetwork op (Caffe2's
``caffe2.python.recurrent``), plus ``set_rnn_executor_config`` and ``retrieve_step_blobs``.

Before/after::

    cell net: FC(hidden_t_prev) -> gates_t; Sum; LSTMUnit -> hidden_state, cell_state
    recurrent_net(net, cell, [(input_t, seq)], [(hidden_t_prev, h0), (cell_t_prev, c0)],
                  {hidden_t_prev: hidden_state, cell_t_prev: cell_state})
    net: RecurrentNetwork([seq, h0, c0, <params...>],
                          [hidden_state_all, hidden_state_last, cell_state_all,
                           cell_state_last, <scope>/step_workspaces],
                          step_net=cell, backward_step_net=<its gradient ops>, links...)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dpgraph.autodiff import GRADIENT_REGISTRY, IR
from dpgraph.autodiff.registry import normalize_gradient
from dpgraph.errors import ModelError
from dpgraph.ir.analysis import get_ssa, get_undefined_blobs
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.blob import BlobReference, GradientSlice, blob_name
from dpgraph.ir.net import Net
from dpgraph.proto import caffe2_pb2

Triple = tuple[str, str, int]


class _CellIR(IR):
    """Caffe2's IR for a cell net: a *given* output gradient is not one of the pieces
    accumulated into that blob's gradient (only an autogen ConstantFill is).  A cell output
    also read inside the step (an attention decoder's hidden state, a lower layer's output)
    then gets its in-step gradient under the plain ``<blob>_grad`` name, and
    :meth:`_Backward.accumulate_external_gradients` adds the given one, as in Caffe2."""

    def _init_gradients(self, ys: dict[Any, Any]) -> tuple[list[Any], dict[str, Any]]:
        return [], {blob_name(y): normalize_gradient(g) for y, g in ys.items()}


class _Backward:
    """The backward step net and what recurrent_net needs to know about it."""

    def __init__(self, cell_net: Net, recompute: Iterable[Any] | None) -> None:
        proto = cell_net.Proto()
        grads = {o: o + "_grad" for o in proto.external_output}
        ops, mapping = _CellIR(list(proto.op), registry=GRADIENT_REGISTRY).GetBackwardPass(grads)
        self.mapping: dict[str, Any] = {str(k): v for k, v in mapping.items()}
        self.net = Net("RecurrentBackwardStep")
        net_proto = self.net.Proto()
        del net_proto.op[:]
        if recompute is not None:
            wanted = {str(b) for b in recompute}
            for op in proto.op:
                if wanted.intersection(op.output):
                    if not set(op.output) <= wanted:
                        raise ModelError(
                            f"recompute_blobs_on_backward {sorted(wanted)}: op {op.type} also "
                            f"outputs {sorted(set(op.output) - wanted)}; every output of a "
                            "recomputed op must be in the list")
                    net_proto.op.add().CopyFrom(op)
        net_proto.op.extend(ops)
        ssa, self.versions = get_ssa(net_proto)
        undefined = get_undefined_blobs(ssa)
        _, forward_versions = get_ssa(proto)
        outputs = set(proto.external_output)
        net_proto.external_input.extend(
            b for b, v in forward_versions.items() if v > 0 and b in undefined and b not in outputs)
        net_proto.type = "simple"

    def grad_of(self, blob: str) -> str:
        value = self.mapping[blob]
        if isinstance(value, GradientSlice):
            raise ModelError(f"recurrent_net: the gradient of {blob!r} is sparse; sparse "
                             "gradients of step-net blobs are not supported")
        return str(value)

    def accumulate_external_gradients(self) -> None:
        """A backward op writing a blob that also arrives from outside the step (a state's
        gradient) writes ``<blob>_accum`` instead, and a Sum adds the two."""
        proto = self.net.Proto()
        ops = list(proto.op)
        del proto.op[:]
        externals = set(proto.external_input)
        for op in ops:
            added = proto.op.add()
            added.CopyFrom(op)
            for j, blob in enumerate(op.output):
                if blob in externals and blob not in op.input:
                    added.output[j] = blob + "_accum"
                    total = BlobReference(blob)  # a reference: no NameScope added
                    self.net.Sum([total, BlobReference(blob + "_accum")], [total])


def _unzip(triples: Sequence[Triple]) -> tuple[list[str], list[str], list[int]]:
    return [a for a, _, _ in triples], [b for _, b, _ in triples], [c for _, _, c in triples]


def recurrent_net(net: Net, cell_net: Net, inputs: Sequence[Any],
                  initial_cell_inputs: Iterable[Any], links: dict[Any, Any],
                  timestep: Any = None, scope: Any = None, outputs_with_grads: Sequence[int] = (0,),
                  recompute_blobs_on_backward: Iterable[Any] | None = None,
                  forward_only: bool = False) -> tuple[BlobReference, ...]:
    """Add a RecurrentNetwork op running ``cell_net`` over the sequence of ``inputs``.

    Args:
        inputs: exactly one ``(cell_input_name, external_sequence_blob)`` pair.
        initial_cell_inputs: ``(cell_state_input, external_initial_blob)`` pairs.
        links: ``{cell_state_input: cell_output}``.
    Returns:
        ``(out0_all, out0_last, out1_all, out1_last, ...)``, one pair per state.
    """
    if len(inputs) != 1:
        raise ModelError("Only one input blob is supported so far")
    # Blob *objects* are kept for the op: a BlobReference is used as is, a str gets the
    # current NameScope when the op is created (as Caffe2's op creation does).
    initial_objects = [b for _, b in initial_cell_inputs]
    initial_cell_inputs = [(str(a), str(b)) for a, b in initial_cell_inputs]
    link_objects = {str(k): v for k, v in links.items()}
    links = {str(k): str(v) for k, v in links.items()}
    op_name = net.NextName("recurrent")

    def s(name: str) -> str:
        return f"{op_name if scope is None else scope}/{name}"

    input_t, input_blob = str(inputs[0][0]), str(inputs[0][1])
    known = {input_t, *(b for _, b in initial_cell_inputs), *(a for a, _ in initial_cell_inputs)}
    if timestep is not None:
        known.add(str(timestep))
    references = [BlobReference(b) for b in cell_net.Proto().external_input if b not in known]
    backward = None if forward_only else _Backward(cell_net, recompute_blobs_on_backward)
    all_inputs = [input_blob] + [b for _, b in initial_cell_inputs] + [str(r) for r in references]
    input_objects = [inputs[0][1], *initial_objects, *references]
    cell_net.Proto().type = "simple"

    forward_links: list[Triple] = []
    backward_links: list[Triple] = []
    aliases: list[Triple] = []
    states: list[str] = []
    outputs: list[Any] = []
    for cell_input, _ in initial_cell_inputs:
        state = s(cell_input + "_states")
        cell_output = links[cell_input]
        forward_links += [(cell_input, state, 0), (cell_output, state, 1)]
        aliases += [(state, cell_output + "_all", 1), (state, cell_output + "_last", -1)]
        outputs += [_suffixed(link_objects[cell_input], suffix) for suffix in ("_all", "_last")]
        states.append(state)
        if backward is not None:
            backward_links.append((cell_output + "_grad", state + "_grad", 1))
            backward.net.Proto().external_input.append(cell_output + "_grad")
            input_grad = cell_input + "_grad"
            if not backward.versions.get(input_grad, 0):
                input_grad = backward.grad_of(cell_input)
            backward_links.append((input_grad, state + "_grad", 0))
    forward_links.append((input_t, input_blob, 0))

    backward_args: dict[str, Any] = {}
    if backward is not None:
        backward_links.append((backward.grad_of(input_t), input_blob + "_grad", 0))
        backward.net.Proto().external_input.extend(cell_net.Proto().external_input)
        backward.net.Proto().external_input.extend(cell_net.Proto().external_output)
        backward.accumulate_external_gradients()
        backward_args = _backward_arguments(backward, references, all_inputs, backward_links,
                                            outputs_with_grads, recompute_blobs_on_backward)

    alias_src, alias_dst, alias_offset = _unzip(aliases)
    link_internal, link_external, link_offset = _unzip(forward_links)
    results = net.RecurrentNetwork(
        input_objects, outputs + [s("step_workspaces")],
        alias_src=alias_src, alias_dst=alias_dst, alias_offset=alias_offset,
        recurrent_states=states,
        initial_recurrent_state_ids=[all_inputs.index(b) for _, b in initial_cell_inputs],
        link_internal=link_internal, link_external=link_external, link_offset=link_offset,
        enable_rnn_executor=1, step_net=cell_net.Proto(),
        timestep="timestep" if timestep is None else str(timestep), **backward_args)
    cell_net.Proto().type = "simple"
    return tuple(results[:-1])


def _suffixed(blob: Any, suffix: str) -> Any:
    """``blob + suffix``: a BlobReference stays one (no NameScope added), a str stays str."""
    return BlobReference(str(blob) + suffix) if isinstance(blob, BlobReference) \
        else str(blob) + suffix


def _backward_arguments(backward: _Backward, references: list[BlobReference],
                        all_inputs: list[str], backward_links: list[Triple],
                        outputs_with_grads: Sequence[int], recompute: Iterable[Any] | None
                        ) -> dict[str, Any]:
    params = [str(r) for r in references if str(r) in backward.mapping]
    internal, external, offset = _unzip(backward_links)
    args: dict[str, Any] = {
        "param": [all_inputs.index(p) for p in params],
        "param_grads": [backward.grad_of(p) for p in params],
        "backward_link_internal": internal,
        "backward_link_external": external,
        "backward_link_offset": offset,
        "outputs_with_grads": list(outputs_with_grads),
        "recompute_blobs_on_backward": [str(b) for b in (recompute or ())],
    }
    if len(backward.net.Proto().op):
        args["backward_step_net"] = backward.net.Proto()
    return args


def set_rnn_executor_config(rnn_op: caffe2_pb2.OperatorDef, num_threads: int | None = None,
                            max_cuda_streams: int | None = None) -> None:
    """Append the executor tuning arguments (dpgraph runs steps in order and ignores them)."""
    if rnn_op.type not in ("RecurrentNetwork", "RecurrentNetworkGradient"):
        raise ModelError(f"set_rnn_executor_config: op type {rnn_op.type!r} is not "
                         "RecurrentNetwork or RecurrentNetworkGradient")
    if num_threads is not None:
        rnn_op.arg.extend([MakeArgument("rnn_executor.num_threads", num_threads)])
    if max_cuda_streams is not None:
        rnn_op.arg.extend([MakeArgument("rnn_executor.max_cuda_streams", max_cuda_streams)])


def retrieve_step_blobs(net: Net, prefix: str = "rnn") -> list[bytes]:
    """Copy every step workspace's local blobs of each RecurrentNetwork op of ``net`` into
    the current workspace (``<prefix>_<blob><t>``); return their names (bytes)."""
    from dpgraph.ir.arguments import MakeArgument
    from dpgraph.runtime.api import current

    workspace = current()
    names: list[bytes] = []
    count = 1
    for op in net.Proto().op:
        if op.type != "RecurrentNetwork":
            continue
        output = f"{prefix}_{count}"
        count += 1
        fetch = caffe2_pb2.OperatorDef(type="RecurrentNetworkBlobFetcher", input=[op.output[-1]],
                                       output=[output])
        fetch.arg.extend([MakeArgument("prefix", prefix)])
        workspace.run_operators_once([fetch])
        names.extend(workspace.fetch_blob(output).tolist())
    return names
