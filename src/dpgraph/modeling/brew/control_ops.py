"""Control-flow helpers: cond (If) and loop (While).

The subnets run in the enclosing workspace.  As in Caffe2's ``control_ops_util``, the op's
inputs are the blobs a subnet reads before writing them (they must be in ``external_blobs``,
the lexical scope) and its outputs are the ``external_blobs`` a subnet writes, so the outer
net's dependency analysis sees the data flow.
"""

from __future__ import annotations

from typing import Any

from dpgraph.errors import ModelConfigError


def _external_blob_names(net: Any, lexical_scope: set[str]) -> tuple[list[str], list[str]]:
    """``(inputs, outputs)`` of ``net`` seen from outside, in first-use order."""
    defined: set[str] = set()
    inputs: list[str] = []
    outputs: list[str] = []
    for op in net.Proto().op:
        for name in op.input:
            if name not in defined and name not in inputs:
                if name not in lexical_scope:
                    raise ModelConfigError(
                        f"Input blob {name} of net {net.Name()} is undefined: produce it in "
                        "the subnet or list it in external_blobs.")
                inputs.append(name)
        for name in op.output:
            defined.add(name)
            if name in lexical_scope and name not in outputs:
                outputs.append(name)
    return inputs, outputs


def _merge(first: list[str], second: list[str]) -> list[str]:
    return first + [name for name in second if name not in first]


def cond(model: Any, cond_blob: Any, external_blobs: list[Any], then_model: Any,
         else_model: Any = None) -> Any:
    """``If([cond_blob] + subnet inputs, subnet outputs, then_net=..., else_net=...)``."""
    scope = {str(b) for b in external_blobs}
    inputs, outputs = _external_blob_names(then_model.net, scope)
    kwargs: dict[str, Any] = {"then_net": then_model.net.Proto()}
    if else_model is not None:
        else_inputs, else_outputs = _external_blob_names(else_model.net, scope)
        inputs, outputs = _merge(inputs, else_inputs), _merge(outputs, else_outputs)
        kwargs["else_net"] = else_model.net.Proto()
    return model.net.If([cond_blob, *inputs], outputs, **kwargs)


def loop(model: Any, cond_blob: Any, external_blobs: list[Any], loop_model: Any,
         cond_model: Any = None) -> Any:
    """``While([cond_blob] + subnet inputs, subnet outputs, loop_net=..., cond_net=...)``;
    the loop's outputs are inputs too, since the body may not run at all."""
    scope = {str(b) for b in external_blobs}
    inputs, outputs = _external_blob_names(loop_model.net, scope)
    inputs = _merge(inputs, outputs)
    kwargs: dict[str, Any] = {"loop_net": loop_model.net.Proto()}
    if cond_model is not None:
        cond_inputs, cond_outputs = _external_blob_names(cond_model.net, scope)
        inputs, outputs = _merge(inputs, cond_inputs), _merge(outputs, cond_outputs)
        kwargs["cond_net"] = cond_model.net.Proto()
    return model.net.While([cond_blob, *inputs], outputs, **kwargs)
