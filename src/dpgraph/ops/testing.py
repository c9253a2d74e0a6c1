"""Helpers for testing kernels without a workspace: run ops on a dict of numpy blobs and
check gradient kernels against finite differences."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.blob import GradientSlice
from dpgraph.ir.device import effective_device
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.context import OpContext
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.proto import caffe2_pb2


class _DictWorkspace:
    """Just enough of a workspace for kernels: blobs in a dict, one RNG."""

    def __init__(self, blobs: dict[str, Any], seed: int) -> None:
        self.blobs = blobs
        self.rng = np.random.default_rng(seed)

    def get_blob_or_none(self, name: str, device: Any = None) -> Any:
        return self.blobs.get(name)


def run_ops(ops: Iterable[caffe2_pb2.OperatorDef], blobs: Mapping[str, Any],
            seed: int = 0) -> dict[str, Any]:
    """Run ``ops`` in order on a copy of ``blobs`` (numpy only); return all blobs."""
    state = dict(blobs)
    workspace = _DictWorkspace(state, seed)
    for op in ops:
        schema = OPERATORS.lookup(op.type)
        assert schema.kernel is not None, f"{op.type} has no kernel"
        ctx = OpContext(op, arguments_dict(op.arg), np, effective_device(op), workspace)
        ctx.inputs = [state[name] for name in op.input]
        outputs = schema.kernel(ctx)
        assert len(outputs) == len(op.output), (
            f"{op.type} kernel returned {len(outputs)} values for {len(op.output)} outputs")
        state.update(zip(op.output, outputs))
    return state


def run_op(op: caffe2_pb2.OperatorDef, inputs: Sequence[Any], seed: int = 0) -> list[Any]:
    """Run one op on positional ``inputs``; return its outputs."""
    state = run_ops([op], dict(zip(op.input, inputs)), seed)
    return [state[name] for name in op.output]


def _densify(value: Any, state: Mapping[str, Any], like: np.ndarray) -> np.ndarray:
    if isinstance(value, GradientSlice):
        dense = np.zeros_like(like)
        np.add.at(dense, state[str(value.indices)], state[str(value.values)])
        return dense
    return np.asarray(state[str(value)])


def _copies(values: Iterable[Any]) -> list[Any]:
    """Fresh copies of the arrays: kernels update in place where Caffe2's ops are in place,
    and the gradient checks reuse their inputs and output gradients."""
    return [v.copy() if isinstance(v, np.ndarray) else v for v in values]


def analytic_gradients(op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                       output_grads: Mapping[int, np.ndarray]) -> list[np.ndarray | None]:
    """Gradients of sum(out_k * output_grads[k]) w.r.t. every input, via the gradient ops."""
    g_output = [op.output[k] + "_grad" if k in output_grads else None
                for k in range(len(op.output))]
    grad_ops, g_input = build_gradient(op, g_output)
    state = run_ops([op], dict(zip(op.input, _copies(inputs))))
    for k, grad in output_grads.items():
        state[op.output[k] + "_grad"] = grad.copy()
    state = run_ops(grad_ops, state)
    return [None if g is None else _densify(g, state, np.asarray(x))
            for g, x in zip(g_input, inputs)]


def numeric_gradient(op: caffe2_pb2.OperatorDef, inputs: Sequence[Any], input_index: int,
                     output_grads: Mapping[int, np.ndarray], eps: float = 1e-3) -> np.ndarray:
    """Central finite differences of sum(out_k * output_grads[k]) w.r.t. one input."""
    base = [np.array(x, dtype=np.float64, order="C") if i == input_index else x
            for i, x in enumerate(inputs)]
    x = base[input_index]
    dtype = np.asarray(inputs[input_index]).dtype
    grad = np.zeros_like(x)

    def objective(values: list[Any]) -> float:
        values[input_index] = values[input_index].astype(dtype)
        outs = run_op(op, _copies(values))
        return float(sum(np.sum(np.asarray(outs[k], np.float64) * g)
                         for k, g in output_grads.items()))

    flat = x.reshape(-1)
    for j in range(flat.size):
        saved = flat[j]
        flat[j] = saved + eps
        plus = objective([*base[:input_index], x.copy(), *base[input_index + 1:]])
        flat[j] = saved - eps
        minus = objective([*base[:input_index], x.copy(), *base[input_index + 1:]])
        flat[j] = saved
        grad.reshape(-1)[j] = (plus - minus) / (2 * eps)
    return grad


def check_gradient(op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                   inputs_to_check: Iterable[int] | None = None,
                   outputs_with_grads: Sequence[int] = (0,), eps: float = 1e-3,
                   rtol: float = 5e-2, atol: float = 5e-3, seed: int = 0) -> None:
    """Assert the op's gradient kernels match finite differences.

    Random output gradients are drawn for ``outputs_with_grads``; every input in
    ``inputs_to_check`` (default: every floating-point input) is compared.
    """
    rng = np.random.default_rng(seed)
    outs = run_op(op, _copies(inputs))
    output_grads = {k: rng.standard_normal(np.shape(outs[k])).astype(np.float32)
                    for k in outputs_with_grads}
    analytic = analytic_gradients(op, inputs, output_grads)
    if inputs_to_check is None:
        inputs_to_check = [i for i, x in enumerate(inputs)
                           if np.asarray(x).dtype.kind == "f"]
    for index in inputs_to_check:
        numeric = numeric_gradient(op, inputs, index, output_grads, eps)
        got = analytic[index]
        assert got is not None, f"{op.type}: no gradient for input {index} ({op.input[index]})"
        np.testing.assert_allclose(
            got, numeric, rtol=rtol, atol=atol,
            err_msg=f"{op.type}: gradient of input {index} ({op.input[index]})")
