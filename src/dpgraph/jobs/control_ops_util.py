"""Caffe2's ``control_ops_util``: wrap nets into If / While ops whose branches run in Do
scopes, so blobs a branch defines stay local and only the lexical scope reaches outside."""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError
from dpgraph.ir.analysis import get_ssa
from dpgraph.ir.net import Net
from dpgraph.ir.proto_io import proto_of
from dpgraph.proto import caffe2_pb2


def get_external_blob_names(net: Any, lexical_scope: Any) -> tuple[set[str], set[str]]:
    """``(inputs, outputs)`` of ``net`` seen from outside: the blobs it reads before
    defining them (each must be in the lexical scope) and the outputs in the scope."""
    proto = proto_of(net)
    scope = {str(b) for b in lexical_scope}
    net_ssa, _ = get_ssa(proto)
    inputs = {name for op_inputs, _ in net_ssa for name, version in op_inputs
              if version == 0}
    for name in inputs:
        if name not in scope:
            raise ModelConfigError(f"Input blob {name} is undefined: net {proto.name!r} reads "
                                   "it, but it is neither defined in the net nor in the "
                                   "lexical scope; define it before the control block.")
    outputs = {o for op in proto.op for o in op.output if o in scope}
    return inputs, outputs


def add_if_op(if_net: Any, cond_blob: Any, lexical_scope: Any, then_net: Any,
              else_net: Any = None) -> None:
    """Append ``If(cond, then_net, else_net)`` to ``if_net``, each branch inside a Do."""
    then_inputs, then_outputs = get_external_blob_names(then_net, lexical_scope)
    inputs, outputs = set(then_inputs), set(then_outputs)
    if else_net is not None:
        else_inputs, else_outputs = get_external_blob_names(else_net, lexical_scope)
        inputs |= else_inputs
        outputs |= else_outputs
    ordered_in, ordered_out = sorted(inputs), sorted(outputs)
    then_ws = if_net.NextScopedBlob(if_net.Name() + "/workspace_if_then")
    do_then = _do_net("do_then_net", then_net, ordered_in, ordered_out, then_ws)
    ws_blobs = [then_ws]
    else_proto = None
    if else_net is not None:
        else_ws = if_net.NextScopedBlob(if_net.Name() + "/workspace_if_else")
        else_proto = _do_net("do_else_net", else_net, ordered_in, ordered_out, else_ws)
        ws_blobs.append(else_ws)
    for ws_blob in ws_blobs:
        if_net.CreateScope([], [ws_blob])
    kwargs: dict[str, Any] = {"then_net": do_then}
    if else_proto is not None:
        kwargs["else_net"] = else_proto
    if_net.If([cond_blob, *ordered_in, *ws_blobs], [*ordered_out, *ws_blobs], **kwargs)
    _add_external_outputs(if_net, ordered_out)


def add_while_op(while_net: Any, cond_blob: Any, lexical_scope: Any, loop_body_net: Any,
                 condition_body_net: Any = None) -> None:
    """Append ``While(cond, loop_net=Do(body), cond_net=Do(condition))`` to ``while_net``.

    The loop's outputs are inputs too (the body may not run at all); the body's Do copies
    the blobs it binds, so every iteration keeps its own values for the gradient.
    """
    inputs, outputs = get_external_blob_names(loop_body_net, lexical_scope)
    inputs |= outputs
    ordered_in, ordered_out = sorted(inputs), sorted(outputs)
    body_ws = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_body")
    loop_net = _do_net("do_loop_body_net", loop_body_net, ordered_in, ordered_out, body_ws,
                       copy_external_blobs=True)
    ws_blobs = [body_ws]
    cond_proto = None
    if condition_body_net is not None:
        cond_in, cond_out = get_external_blob_names(condition_body_net, lexical_scope)
        if not any(str(cond_blob) in op.output for op in proto_of(condition_body_net).op):
            raise ModelConfigError(f"the condition net of the While loop must write the "
                                   f"condition blob {cond_blob}.")
        cond_out.add(str(cond_blob))
        cond_ws = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_cond")
        cond_proto = _do_net("do_loop_condition_net", condition_body_net, sorted(cond_in),
                             sorted(cond_out), cond_ws)
        ws_blobs.append(cond_ws)
        ordered_in = sorted(set(ordered_in) | cond_in)
        ordered_out = sorted(set(ordered_out) | cond_out)
    if str(cond_blob) not in {str(b) for b in lexical_scope}:
        while_net.ConstantFill([], cond_blob, dtype=caffe2_pb2.TensorProto.BOOL, value=False)
    for ws_blob in ws_blobs:
        while_net.CreateScope([], [ws_blob])
    kwargs: dict[str, Any] = {"loop_net": loop_net}
    if cond_proto is not None:
        kwargs["cond_net"] = cond_proto
    while_net.While([cond_blob, *ordered_in, *ws_blobs], [*ordered_out, *ws_blobs], **kwargs)
    _add_external_outputs(while_net, ordered_out)


def _do_net(name: str, net: Any, inputs: list[str], outputs: list[str], ws_blob: Any,
            copy_external_blobs: bool = False) -> caffe2_pb2.NetDef:
    """A net ``name`` holding one Do op that runs ``net`` with ``inputs``/``outputs`` bound
    under their own names."""
    do_net = Net(name)
    inner = inputs + outputs
    idx = list(range(len(inner)))  # into inputs then outputs, without the workspace blob
    kwargs: dict[str, Any] = {"net": proto_of(net), "inner_blobs": inner,
                              "outer_blobs_idx": idx}
    if copy_external_blobs:
        kwargs["copy_external_blobs"] = True
    do_net.Do([*inputs, ws_blob], [*outputs, ws_blob], **kwargs)
    _add_external_outputs(do_net, [*outputs, str(ws_blob)])
    return do_net.Proto()


def _add_external_outputs(net: Any, names: list[str]) -> None:
    proto = net.Proto()
    proto.external_output.extend(n for n in names if n not in proto.external_output)
