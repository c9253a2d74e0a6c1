"""Caffe2's ``control_ops_grad``: gradients of the Do, If and While ops.

Each gradient runs the backward pass of the inner net(s) (``IR.GetBackwardPass``) and wraps
it in an op of the same type:

* Do: a gradient Do (``is_gradient_op``) over the inner backward net; the inner gradient of
  output ``y`` is ``y/_DO_OPERATOR_INNER_GRAD_``, outer input gradients are
  ``<input>_grad``; the forward blobs it needs (``saved_fwd_blobs``) come from the scope the
  forward Do pushed.
* If: an If over the gradients of both branches; a gradient that only one branch computes
  is zero-filled (or copied from the incoming gradient) in the other branch.
* While (body = one Do): a While that runs the body's gradient while forward scopes are
  left (``HasScope``); gradients of inputs that are not loop-carried are summed over the
  iterations.
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import GradientError
from dpgraph.ir.arguments import MakeArgument
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2

INNER_GRAD = "/_DO_OPERATOR_INNER_GRAD_"
INNER_GRAD_COPY = "/_DO_OPERATOR_INNER_GRAD_COPY_"


def getNetArgument(op: caffe2_pb2.OperatorDef, name: str) -> caffe2_pb2.NetDef | None:
    """The NetDef argument ``name`` of ``op`` (None if absent)."""
    for arg in op.arg:
        if arg.name == name and arg.HasField("n"):
            return arg.n
    return None


_get_net_argument = getNetArgument


def _args(op: caffe2_pb2.OperatorDef) -> dict[str, caffe2_pb2.Argument]:
    return {arg.name: arg for arg in op.arg}


def dedupe_g_output(op: caffe2_pb2.OperatorDef, g_output: list[Any]
                    ) -> tuple[list[caffe2_pb2.OperatorDef], list[Any]]:
    """Copy a gradient used for two outputs to ``<out>_<grad>_DEDUP`` so every output has
    its own gradient blob."""
    grad_ops: list[caffe2_pb2.OperatorDef] = []
    deduped: list[Any] = []
    seen: set[str] = set()
    for output, grad in zip(op.output, g_output):
        if grad is None:
            deduped.append(None)
            continue
        if isinstance(grad, GradientSlice):
            raise GradientError(f"{op.type} op {op.name!r}: sparse gradient {grad} of output "
                                f"{output} is not supported by control-flow ops; densify it "
                                "(SparseToDense) first.")
        name = str(grad)
        if name in seen:
            new_name = f"{output}_{name}_DEDUP"
            grad_ops.append(CreateOperator("Copy", [name], [new_name]))
            deduped.append(new_name)
        else:
            seen.add(name)
            deduped.append(name)
    return grad_ops, deduped


def disambiguate_grad_if_op_output(grad_op: caffe2_pb2.OperatorDef, idx: int,
                                   new_grad_output: str) -> None:
    """Rename output ``idx`` of a gradient If op, and that output inside both branches."""
    old = grad_op.output[idx]
    grad_op.output[idx] = new_grad_output
    for arg in grad_op.arg:
        if arg.name in ("then_net", "else_net") and arg.HasField("n"):
            for op in arg.n.op:
                for i, out in enumerate(op.output):
                    if out == old:
                        op.output[i] = new_grad_output


def _backward(ops: Any, init_grad: dict[Any, Any]) -> tuple[list[Any], dict[str, str]]:
    from dpgraph.autodiff.backward import IR

    grad_ops, grad_map = IR(list(ops)).GetBackwardPass(init_grad)
    names: dict[str, str] = {}
    for blob, grad in grad_map.items():
        if isinstance(grad, GradientSlice):
            raise GradientError(f"sparse gradient of {blob} inside a control-flow op is not "
                                "supported; densify it first.")
        names[str(blob)] = str(grad)
    return list(grad_ops), names


def _do_bindings(op: caffe2_pb2.OperatorDef) -> tuple[dict[str, str], dict[str, str]]:
    """``(outer -> inner, inner -> outer)`` name maps of a Do op."""
    args = _args(op)
    if "net" not in args or not args["net"].HasField("n"):
        raise GradientError(f"Do op {op.name!r} has no 'net' argument.")
    inner = [s.decode() for s in args["inner_blobs"].strings] if "inner_blobs" in args else []
    idx = list(args["outer_blobs_idx"].ints) if "outer_blobs_idx" in args else []
    outer_names = list(op.input[:-1]) + list(op.output[:-1])
    inner_to_outer = {name: outer_names[i] for name, i in zip(inner, idx)}
    outer_to_inner = {o: i for i, o in inner_to_outer.items()}
    return outer_to_inner, inner_to_outer


def gen_do_gradient(op: caffe2_pb2.OperatorDef, g_output: list[Any]
                    ) -> tuple[list[caffe2_pb2.OperatorDef], list[Any]]:
    """The gradient Do of a forward Do op, and the gradients of its inputs."""
    subnet = getNetArgument(op, "net")
    if subnet is None:
        raise GradientError(f"Do op {op.name!r} has no 'net' argument.")
    outer_to_inner, inner_to_outer = _do_bindings(op)
    if len(g_output) != len(op.output):
        raise GradientError("Different number of gradient blobs and Do op outputs")
    grad_ops, g_output = dedupe_g_output(op, g_output)
    ws_blob: str = op.input[-1]
    init_grad: dict[Any, Any] = {}
    outer_grad_of_inner: dict[str, str] = {}
    for output, grad in zip(op.output[:-1], g_output[:-1]):
        if grad:
            inner = outer_to_inner[output]
            init_grad[BlobReference(inner)] = BlobReference(inner + INNER_GRAD)
            outer_grad_of_inner[inner + INNER_GRAD] = grad
    if not init_grad:
        raise GradientError("Empty initial gradient map for Do op")
    inner_ops, inner_grads = _backward(subnet.op, init_grad)
    bindings: dict[str, str] = {}
    new_outputs: list[str] = []
    g_input: list[Any] = []
    copies: list[caffe2_pb2.OperatorDef] = []
    for outer_input in op.input[:-1]:
        inner_name = outer_to_inner.get(outer_input)
        if inner_name is None or inner_name not in inner_grads:
            g_input.append(None)
            continue
        copy_name = inner_name + INNER_GRAD_COPY
        copies.append(CreateOperator("Copy", [inner_grads[inner_name]], [copy_name]))
        bindings[copy_name] = outer_input + "_grad"
        new_outputs.append(outer_input + "_grad")
        g_input.append(outer_input + "_grad")
    g_input.append(None)  # the workspace blob
    if not copies:
        return [], []
    new_inputs, saved = _grad_do_inputs(inner_ops + copies, inner_to_outer, outer_grad_of_inner,
                                        bindings)
    grad_do = _gradient_do_op(op, subnet, inner_ops + copies, new_inputs, new_outputs,
                              bindings, saved, ws_blob)
    return grad_ops + [grad_do], g_input


def _grad_do_inputs(inner_ops: list[Any], inner_to_outer: dict[str, str],
                    outer_grads: dict[str, str], bindings: dict[str, str]
                    ) -> tuple[list[str], list[str]]:
    """The outer blobs the inner backward net reads (bound in ``bindings``) and the forward
    blobs it reads from the saved scope."""
    new_inputs: list[str] = []
    saved: list[str] = []
    written: set[str] = set()
    for grad_op in inner_ops:
        for name in grad_op.input:
            if name in written:
                continue
            outer = inner_to_outer.get(name) or outer_grads.get(name)
            if outer:
                if outer not in new_inputs:
                    new_inputs.append(outer)
                bindings[name] = outer
            elif name not in saved:
                saved.append(name)
        written.update(grad_op.output)
    return new_inputs, saved


def _gradient_do_op(fwd_op: caffe2_pb2.OperatorDef, fwd_net: caffe2_pb2.NetDef,
                    grad_ops: list[Any], inputs: list[str], outputs: list[str],
                    bindings: dict[str, str], saved: list[str], ws_blob: str
                    ) -> caffe2_pb2.OperatorDef:
    grad_net = caffe2_pb2.NetDef()
    grad_net.CopyFrom(fwd_net)
    grad_net.name = (fwd_net.name or "do") + "_grad"
    del grad_net.op[:]
    grad_net.op.extend(grad_ops)
    del grad_net.external_input[:]
    del grad_net.external_output[:]
    grad = caffe2_pb2.OperatorDef()
    grad.CopyFrom(fwd_op)
    if grad.name:
        grad.name += "_grad"
    del grad.input[:]
    grad.input.extend([*inputs, ws_blob])
    del grad.output[:]
    grad.output.extend([*outputs, ws_blob])
    outer = [*inputs, *outputs]  # Do's outer_blobs_idx skips the workspace blobs
    inner = list(bindings)
    del grad.arg[:]
    grad.arg.extend([MakeArgument("net", grad_net), MakeArgument("inner_blobs", inner),
                     MakeArgument("outer_blobs_idx", [outer.index(bindings[n]) for n in inner]),
                     MakeArgument("saved_fwd_blobs", saved)])
    del grad.control_input[:]
    grad.is_gradient_op = True
    return grad


def _gen_subnet_gradient(subnet: caffe2_pb2.NetDef, init_grad: dict[Any, Any]
                         ) -> tuple[caffe2_pb2.NetDef, dict[str, str], list[str], list[str]]:
    """The gradient net of ``subnet``, its gradient map, and the blobs it reads before
    writing and the blobs it writes (in first-use order)."""
    grad_ops, grad_map = _backward(subnet.op, init_grad)
    inputs: list[str] = []
    outputs: list[str] = []
    for op in grad_ops:
        inputs.extend(i for i in op.input if i not in outputs and i not in inputs)
        outputs.extend(o for o in op.output if o not in outputs)
    net = caffe2_pb2.NetDef()
    net.CopyFrom(subnet)
    net.name += "_grad"
    del net.op[:]
    net.op.extend(grad_ops)
    del net.external_input[:]
    del net.external_output[:]
    return net, grad_map, inputs, outputs


def _zero_init_ops(init_grad: dict[str, str], grad_map: dict[str, str],
                   grad_outputs: list[str]) -> list[caffe2_pb2.OperatorDef]:
    """Ops that give the gradients in ``grad_outputs`` a value in a branch that does not
    compute them: the incoming gradient (copied when named differently) or zeros."""
    ops = []
    for grad_output in grad_outputs:
        blob = next(b for b, g in grad_map.items() if g == grad_output)
        if blob in init_grad:
            if init_grad[blob] != grad_output:
                ops.append(CreateOperator("Copy", [init_grad[blob]], [grad_output]))
        else:
            ops.append(CreateOperator("ConstantFill", [blob], [grad_output], value=0.0))
    return ops


def gen_if_gradient(op: caffe2_pb2.OperatorDef, g_output: list[Any]
                    ) -> tuple[list[caffe2_pb2.OperatorDef], list[Any]]:
    """The gradient If of an If op, and the gradients of its inputs."""
    if len(g_output) != len(op.output):
        raise GradientError("Different number of gradient blobs and If op outputs")
    grad_ops, g_output = dedupe_g_output(op, g_output)
    init_grad = {o: g for o, g in zip(op.output, g_output) if g}
    if not init_grad:
        raise GradientError("Empty initial gradient map for If op")
    init_refs = {BlobReference(o): BlobReference(g) for o, g in init_grad.items()}
    then_net = getNetArgument(op, "then_net")
    if then_net is None:
        raise GradientError(f"If op {op.name!r} has no then_net.")
    then_grad, then_map, then_in, then_out = _gen_subnet_gradient(then_net, init_refs)
    grad_map = dict(then_map)
    else_net = getNetArgument(op, "else_net")
    else_grad: caffe2_pb2.NetDef | None = None
    else_in: list[str] = []
    else_out: list[str] = []
    if else_net is not None:
        else_grad, else_map, else_in, else_out = _gen_subnet_gradient(else_net, init_refs)
        _merge_branch_grads(grad_map, then_map, else_map, init_grad)
    grads = set(grad_map.values())
    only_then = [o for o in then_out if o not in else_out and o in grads]
    only_else = [o for o in else_out if o not in then_out and o in grads]
    zero_then = _zero_init_ops(init_grad, grad_map, only_then)
    if else_grad is not None:
        else_grad.op.extend(zero_then)
    elif zero_then:
        else_grad = caffe2_pb2.NetDef(name=then_grad.name + "_auto_else_zero_blobs_")
        else_grad.op.extend(zero_then)
    then_grad.op.extend(_zero_init_ops(init_grad, grad_map, only_else))
    outputs = then_out + [o for o in else_out if o not in then_out]
    inputs = [op.input[0]] + [i for i in then_in + else_in if i != op.input[0]]
    inputs = list(dict.fromkeys(inputs))
    grad_if = caffe2_pb2.OperatorDef()
    grad_if.CopyFrom(op)
    if grad_if.name:
        grad_if.name += "_grad"
    del grad_if.input[:]
    grad_if.input.extend(inputs)
    del grad_if.output[:]
    grad_if.output.extend(outputs)
    del grad_if.arg[:]
    grad_if.arg.append(MakeArgument("then_net", then_grad))
    if else_grad is not None:
        grad_if.arg.append(MakeArgument("else_net", else_grad))
    del grad_if.control_input[:]
    grad_if.is_gradient_op = True
    return grad_ops + [grad_if], [grad_map.get(i) for i in op.input]


def _merge_branch_grads(grad_map: dict[str, str], then_map: dict[str, str],
                        else_map: dict[str, str], init_grad: dict[str, str]) -> None:
    """Where the branches name a blob's gradient differently, one of them just passes the
    incoming gradient through: keep the other's name."""
    for blob, else_grad in else_map.items():
        then_grad = then_map.get(blob)
        if then_grad is None:
            grad_map[blob] = else_grad
        elif then_grad != else_grad:
            incoming = init_grad.get(blob)
            if then_grad == incoming:
                grad_map[blob] = else_grad
            elif else_grad != incoming:
                raise GradientError(f"If branches name the gradient of {blob} differently "
                                    f"({then_grad} and {else_grad}).")


def gen_while_gradient(op: caffe2_pb2.OperatorDef, g_output: list[Any]
                       ) -> tuple[list[caffe2_pb2.OperatorDef], list[Any]]:
    """The gradient While of a While op whose body is one Do, and its input gradients."""
    if len(g_output) != len(op.output):
        raise GradientError("Different number of gradient blobs and While op outputs")
    grad_ops, g_output = dedupe_g_output(op, g_output)
    init_grad = {o: g for o, g in zip(op.output, g_output) if g}
    if not init_grad:
        raise GradientError("Empty initial gradient map for While op")
    loop_net = getNetArgument(op, "loop_net")
    if loop_net is None or len(loop_net.op) != 1 or loop_net.op[0].type != "Do":
        raise GradientError("Gradient While op requires single Do op as a loop body")
    do_op = loop_net.op[0]
    reuse = _args(do_op).get("reuse_workspace")
    if reuse is not None and reuse.i:
        raise GradientError("Gradient While op requires Do loop body op without "
                            "reuse_workspace set")
    ws_blob = do_op.output[-1]
    init_refs = {BlobReference(o): BlobReference(g) for o, g in init_grad.items()}
    loop_grad, loop_map, loop_in, loop_out = _gen_subnet_gradient(loop_net, init_refs)
    accumulate = [i for i in op.input[1:] if i in loop_map and i not in op.output
                  and loop_map[i] != init_grad.get(i)]
    init_ops = _accumulators(loop_grad, loop_map, accumulate)
    cond = f"{op.name or 'while'}_{ws_blob}/gradient_loop_cond"
    cond_net = caffe2_pb2.NetDef(name="gradient_loop_cond_net")
    init_ops.append(CreateOperator("HasScope", [ws_blob], [cond]))
    cond_net.op.extend([CreateOperator("HasScope", [ws_blob], [cond])])
    for blob, grad in init_grad.items():
        if blob in loop_map and loop_map[blob] != grad:
            cond_net.op.extend([CreateOperator("Copy", [loop_map[blob]], [grad])])
            init_ops.append(CreateOperator("Copy", [grad], [loop_map[blob]]))
    grad_while = caffe2_pb2.OperatorDef()
    grad_while.CopyFrom(op)
    if grad_while.name:
        grad_while.name += "_grad"
    del grad_while.arg[:]
    grad_while.arg.extend([MakeArgument("loop_net", loop_grad),
                           MakeArgument("cond_net", cond_net)])
    del grad_while.control_input[:]
    del grad_while.input[:]
    grad_while.input.extend([cond] + [i for i in loop_in if i != cond])
    del grad_while.output[:]
    grad_while.output.extend(list(dict.fromkeys(loop_out + [loop_map[i] for i in accumulate])))
    grad_while.is_gradient_op = True
    return grad_ops + init_ops + [grad_while], [loop_map.get(i) for i in op.input]


def _accumulators(loop_grad: caffe2_pb2.NetDef, loop_map: dict[str, str],
                  blobs: list[str]) -> list[caffe2_pb2.OperatorDef]:
    """Make the loop's gradient net sum the per-iteration gradients of ``blobs`` (inputs
    that are not loop-carried) into their gradient blobs, zero-filled before the loop."""
    init_ops = []
    for blob in blobs:
        grad = loop_map[blob]
        step = grad + "_while_step"
        for grad_op in loop_grad.op:
            for i, out in enumerate(grad_op.output):
                if out == grad:
                    grad_op.output[i] = step
        loop_grad.op.extend([CreateOperator("Sum", [grad, step], [grad])])
        init_ops.append(CreateOperator("ConstantFill", [blob], [grad], value=0.0))
    return init_ops


def register_control_gradients(registry: Any) -> None:
    """Register the Do, If and While gradient makers with ``registry`` (once)."""
    makers = {"Do": gen_do_gradient, "If": gen_if_gradient, "While": gen_while_gradient}
    for op_type, maker in makers.items():
        if registry.gradient_registry_.get(op_type) is not maker:
            registry.gradient_registry_.pop(op_type, None)
            registry.RegisterGradient(op_type)(maker)


def _register_default() -> None:
    from dpgraph.autodiff import GRADIENT_REGISTRY

    register_control_gradients(GRADIENT_REGISTRY)


_register_default()
