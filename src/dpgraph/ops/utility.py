"""Utility ops: StopGradient, Cast, Print, Summarize, Free, EnsureDense, ZeroGradient, Alias,
NanCheck and small lengths/index helpers (LengthsToRanges, LengthsTile, Find,
FindDuplicateElements).  The control-flow ops If and While live in :mod:`dpgraph.ops.control`.

``StopGradient`` and ``LengthsToRanges`` have Caffe2's ``NO_GRADIENT`` (a maker that adds
nothing); the autodiff layer also stops at StopGradient by type.
``Free`` returns ``None`` for every output; the runtime treats ``None`` as "blob emptied".
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError, GradientError, OperatorError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import same_as_input, to_host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import DataType, no_gradient, numpy_dtype, parse_dtype
from dpgraph.ops.gradient_builder import GradientBuilder

_LOG = logging.getLogger("dpgraph.ops.utility")


# --- identities --------------------------------------------------------------------------
@register_op("StopGradient", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def stop_gradient(ctx: OpContext) -> Outputs:
    """Identity; gradients do not flow back through it."""
    return (_identity(ctx),)


def _identity(ctx: OpContext) -> Any:
    """Input 0 itself when the op is in place, else a copy (as Caffe2 copies)."""
    value = ctx.inputs[0]
    if ctx.op.input[0] == ctx.op.output[0] or not hasattr(value, "copy"):
        return value
    return value.copy()


register_gradient("StopGradient")(no_gradient)


@register_op("Alias", inputs=1, outputs=1, shape=same_as_input())
def alias(ctx: OpContext) -> Outputs:
    """Y shares X's data."""
    return (ctx.inputs[0],)


@register_op("EnsureDense", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def ensure_dense(ctx: OpContext) -> Outputs:
    """Identity on a dense tensor (sparse gradients are densified by the autodiff layer)."""
    return (_identity(ctx),)


def _pass_through(g: GradientBuilder) -> None:
    if g.go_is_sparse(0):
        raise GradientError(f"{g.op.type}: the gradient of output {g.O(0)!r} must be dense; "
                            "densify it with SparseToDense first.")
    g.set_input_grad(0, g.GO(0))


register_gradient("Alias")(_pass_through)
@register_gradient("EnsureDense")
def _ensure_dense_gradient(g: GradientBuilder) -> None:
    """Caffe2's: a sparse output gradient becomes ``SparseToDense(indices, values, X)``; a
    dense one passes through."""
    if g.go_is_sparse(0):
        g.add("SparseToDense", [g.GO_I(0), g.GO_V(0), g.I(0)], [g.GI(0)])
        return
    g.set_input_grad(0, g.GO(0))


@register_op("NanCheck", inputs=(1, None), outputs=1, inplace=[(0, 0)], shape=same_as_input())
def nan_check(ctx: OpContext) -> Outputs:
    """Y = X; fails if X holds a NaN or an infinity (all inputs are logged then)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.dtype.kind in "fc" and not bool(ctx.xp.all(ctx.xp.isfinite(x))):
        for name, value in zip(ctx.op.input, ctx.inputs):
            _LOG.error("NanCheck: %s = %s", name, np.asarray(to_host(value)))
        raise OperatorError(ctx.describe(f"input {ctx.input_name(0)!r} contains NaN or inf"))
    return (_identity(ctx),)


@register_gradient("NanCheck")
def _nan_check_gradient(g: GradientBuilder) -> None:
    g.add("NanCheck", [g.GO(0)], [g.GI(0)])


# --- Cast --------------------------------------------------------------------------------
def _cast_infer(op: Any, in_shapes: Any, in_types: Any) -> list[Any]:
    to = arguments_dict(op.arg).get("to")
    if in_shapes[0] is None or to is None:
        return [None]
    return [(tuple(in_shapes[0]), parse_dtype(to, "Cast 'to'"))]


@register_op("Cast", inputs=1, outputs=1, inplace=[(0, 0)], shape=_cast_infer)
def cast(ctx: OpContext) -> Outputs:
    """Y = X converted to the type ``to`` (a DataType int or name)."""
    if not ctx.has_arg("to"):
        raise ArgumentError(ctx.describe("needs the 'to' argument (e.g. to=core.DataType.FLOAT)"))
    dtype = numpy_dtype(parse_dtype(ctx.arg("to"), "Cast 'to'"), "Cast 'to'")
    if dtype is np.object_:
        return (_to_strings(ctx),)
    return (ctx.xp.asarray(ctx.inputs[0]).astype(dtype),)


def _to_strings(ctx: OpContext) -> np.ndarray:
    """Cast to STRING as Caffe2's ``std::to_string``: integers and bools in decimal, floats
    with ``%f`` (six decimals); a string tensor of bytes."""
    values = np.asarray(to_host(ctx.inputs[0]))
    if values.dtype.kind not in "biuf":
        raise ArgumentError(ctx.describe(f"Cast to STRING needs a numeric input, got "
                                         f"{values.dtype} for {ctx.input_name(0)!r}"))
    text = (lambda v: b"%f" % v) if values.dtype.kind == "f" else (lambda v: b"%d" % v)
    out = np.empty(values.shape, dtype=object)
    out.reshape(-1)[:] = [text(v) for v in values.reshape(-1).tolist()]
    return out


@register_gradient("Cast", copy_arguments=False)
def _cast_gradient(g: GradientBuilder) -> None:
    if g.arg("from_type") is None:
        raise GradientError(f"Cast {list(g.op.input)} -> {list(g.op.output)}: argument "
                            "'from_type' is required to get the gradient of Cast.")
    g.add("Cast", [g.GO(0)], [g.GI(0)], to=parse_dtype(g.arg("from_type")),
          from_type=parse_dtype(g.arg("to")))


# --- side effects and bookkeeping --------------------------------------------------------
_CAFFE2_TYPE_NAMES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long",
                      "float16": "at::Half", "bool": "bool", "uint8": "unsigned char"}


def _log_file(ctx: OpContext, extension: str) -> str:
    """``<root folder>/<input name, '/' -> '#'><extension>`` (Caffe2's to_file target)."""
    root = getattr(ctx.workspace, "root_folder", ".")
    return os.path.join(root, ctx.input_name(0).replace("/", "#") + extension)


def _append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@register_op("Print", inputs=1, outputs=0, side_effects=True)
def print_op(ctx: OpContext) -> Outputs:
    """Log and print the input blob; with ``to_file=1`` append Caffe2's line
    ``Tensor <name> of type <dtype>. Dims: (<dims>): <values>`` (at most ``limit``, default
    1000, values) to ``<root folder>/<name>.log`` instead."""
    value = ctx.inputs[0]
    host = to_host(value)
    if ctx.int_arg("to_file", 0) and isinstance(host, np.ndarray):
        limit = ctx.int_arg("limit", 0) or 1000
        values = ",".join(f"{v:g}" if isinstance(v, float) else str(v)
                          for v in host.reshape(-1)[:limit].tolist())
        dims = ",".join(str(d) for d in host.shape)
        dtype = _CAFFE2_TYPE_NAMES.get(host.dtype.name, host.dtype.name)
        _append_line(_log_file(ctx, ".log"), f"Tensor {ctx.input_name(0)} of type "
                     f"{dtype}. Dims: ({dims}): {values}")
        return ()
    shape = list(np.shape(host)) if isinstance(host, np.ndarray) else None
    text = f"{ctx.input_name(0)}" + (f" (shape {shape}): {host}" if shape is not None
                                     else f": {host!r}")
    _LOG.info("%s", text)
    print(text, file=sys.stdout)
    return ()


@register_op("Summarize", inputs=1, outputs=(0, 1), side_effects=True)
def summarize(ctx: OpContext) -> Outputs:
    """[min, max, mean, std (unbiased)] of the input as float32; with ``to_file=1`` also
    append ``min max mean std`` to ``<root folder>/<name, '/' -> '#'>.summary``."""
    x = np.asarray(to_host(ctx.inputs[0]), dtype=np.float32).reshape(-1)
    if x.size == 0:
        raise ctx.fail("the input must not be empty")
    mean = float(np.mean(x, dtype=np.float64))
    std = float(np.std(x, dtype=np.float64, ddof=1)) if x.size > 1 else 0.0
    stats = [float(x.min()), float(x.max()), mean, std]
    if ctx.int_arg("to_file", 0):
        _append_line(_log_file(ctx, ".summary"), " ".join(f"{v:g}" for v in stats))
    if ctx.num_outputs == 0:
        return ()
    return (ctx.xp.asarray(np.array(stats, dtype=np.float32)),)


register_gradient("Summarize")(no_gradient)


@register_op("Free", inputs=(1, None), outputs=(1, None))
def free(ctx: OpContext) -> Outputs:
    """Release the outputs' data: every output becomes ``None`` (an emptied blob)."""
    return tuple(None for _ in range(ctx.num_outputs))


@register_op("ZeroGradient", inputs=1, outputs=0)
def zero_gradient(ctx: OpContext) -> Outputs:
    """No-op forward; its gradient sets the input's gradient to zeros."""
    return ()


@register_gradient("ZeroGradient")
def _zero_gradient_gradient(g: GradientBuilder) -> None:
    g.add("ConstantFill", [g.I(0)], [g.GI(0)], value=0.0)


# --- lengths and index helpers -----------------------------------------------------------
@register_op("LengthsToRanges", inputs=1, outputs=1)
def lengths_to_ranges(ctx: OpContext) -> Outputs:
    """[3, 2] -> [[0, 3], [3, 2]] (offset, length) pairs, int32."""
    xp = ctx.xp
    lengths = xp.asarray(ctx.inputs[0]).astype(np.int32).reshape(-1)
    offsets = xp.cumsum(lengths) - lengths
    return (xp.stack([offsets, lengths], axis=1).astype(np.int32),)


register_gradient("LengthsToRanges")(no_gradient)


@register_op("LengthsTile", inputs=2, outputs=1)
def lengths_tile(ctx: OpContext) -> Outputs:
    """Repeat row i of data lengths[i] times."""
    data = ctx.xp.asarray(ctx.inputs[0])
    lengths = np.asarray(to_host(ctx.inputs[1])).astype(np.int64).reshape(-1)
    if data.ndim == 0 or lengths.size != data.shape[0]:
        raise ctx.fail(f"lengths {lengths.shape} must have one entry per row of data "
                       f"{data.shape}")
    return (ctx.xp.repeat(data, ctx.xp.asarray(lengths), axis=0),)


@register_gradient("LengthsTile")
def _lengths_tile_gradient(g: GradientBuilder) -> None:
    g.add("LengthsSum", [g.GO(0), g.I(1)], [g.GI(0)])


@register_op("FindDuplicateElements", inputs=1, outputs=1)
def find_duplicate_elements(ctx: OpContext) -> Outputs:
    """int64 indices of the elements equal to an earlier element."""
    data = np.asarray(to_host(ctx.inputs[0])).reshape(-1)
    if data.size == 0:
        return (np.zeros(0, dtype=np.int64),)
    _, first = np.unique(data, return_index=True)
    duplicate = np.ones(data.size, dtype=bool)
    duplicate[first] = False
    return (np.flatnonzero(duplicate).astype(np.int64),)


@register_op("Find", inputs=2, outputs=1, shape=same_as_input(1))
def find(ctx: OpContext) -> Outputs:
    """For each value of X, its position in ``idx`` (last match), else ``missing_value``."""
    index = np.asarray(to_host(ctx.inputs[0])).reshape(-1)
    needles = np.asarray(to_host(ctx.inputs[1]))
    missing = ctx.int_arg("missing_value", -1)
    result = np.full(needles.shape, missing, dtype=index.dtype)
    if index.size:
        reversed_index = index[::-1]
        keys, first = np.unique(reversed_index, return_index=True)
        last = index.size - 1 - first
        slot = np.clip(np.searchsorted(keys, needles), 0, keys.size - 1)
        hit = keys[slot] == needles
        result[hit] = last[slot[hit]]
    return (ctx.xp.asarray(result),)


# --- selection and membership ------------------------------------------------------------
@register_op("NegateGradient", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def negate_gradient(ctx: OpContext) -> Outputs:
    """Identity forward; its gradient is the negated output gradient."""
    return (ctx.xp.asarray(ctx.inputs[0]).copy(),)


@register_gradient("NegateGradient")
def _negate_gradient_gradient(g: GradientBuilder) -> None:
    g.add("Negative", [g.GO(0)], [g.GI(0)])


@register_op("Where", inputs=3, outputs=1, inplace=[(1, 0), (2, 0)], shape=same_as_input(1))
def where(ctx: OpContext) -> Outputs:
    """Z = C ? X : Y; ``broadcast_on_rows=1`` applies a 1-D C to X's rows."""
    cond, x, y = (ctx.xp.asarray(v) for v in ctx.inputs)
    if ctx.int_arg("broadcast_on_rows", 0) and cond.ndim == 1:
        cond = cond.reshape((-1,) + (1,) * (x.ndim - 1))
    elif cond.shape != x.shape or x.shape != y.shape:
        raise ctx.fail(f"C {cond.shape}, X {x.shape} and Y {y.shape} must have the same shape "
                       "(or set broadcast_on_rows=1 with a 1-D C)")
    return (ctx.xp.where(cond, x, y),)


@register_op("IsMemberOf", inputs=1, outputs=1, shape=same_as_input(0, DataType.BOOL))
def is_member_of(ctx: OpContext) -> Outputs:
    """Y[i] = X[i] in the ``value`` list (bool)."""
    x = ctx.xp.asarray(ctx.inputs[0])
    values = ctx.arg("value", [])
    values = values if isinstance(values, list) else [values]
    if x.dtype == object or x.dtype.kind in "SU":
        members = {v.encode() if isinstance(v, str) else v for v in values}
        flat = [(v.encode() if isinstance(v, str) else v) in members for v in x.reshape(-1)]
        return (np.asarray(flat, dtype=bool).reshape(x.shape),)
    return (ctx.xp.isin(x, ctx.xp.asarray(values, dtype=x.dtype)),)


@register_op("Conditional", inputs=3, outputs=1, shape=same_as_input(1))
def conditional(ctx: OpContext) -> Outputs:
    """Row i of the output is DataT[i] if condition[i] else DataF[i]."""
    cond, data_t, data_f = (ctx.xp.asarray(v) for v in ctx.inputs)
    if cond.ndim != 1 or data_t.shape != data_f.shape or data_t.shape[:1] != cond.shape:
        raise ctx.fail(f"condition {cond.shape} must be 1-D with one entry per row of DataT "
                       f"{data_t.shape} and DataF {data_f.shape} (equal shapes)")
    rows = cond.reshape((-1,) + (1,) * (data_t.ndim - 1)).astype(bool)
    return (ctx.xp.where(rows, data_t, data_f),)
