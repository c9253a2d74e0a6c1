"""Small utility ops: ``Assert``, ``EnforceFinite``, ``AliasWithName``, ``EnsureClipped``,
``PrependDim`` and its gradient ``MergeDim``, ``Bucketize``."""

from __future__ import annotations

import numpy as np

from dpgraph.errors import OperatorError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.gradient_builder import GradientBuilder


@register_op("Assert", inputs=1, outputs=0, side_effects=True)
def assert_op(ctx: OpContext) -> Outputs:
    """Fail (with ``error_msg``) unless every element of the bool/int input is true."""
    values = host(ctx.inputs[0])
    if values.dtype.kind not in "biu":
        raise ctx.fail(f"Assert takes a bool or integer tensor, got {values.dtype}")
    if not np.all(values):
        message = ctx.str_arg("error_msg", "") or "Assert failed: an element is false"
        raise OperatorError(ctx.describe(f"{message} (input {ctx.input_name(0)!r})"))
    return ()


@register_op("AliasWithName", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input())
def alias_with_name(ctx: OpContext) -> Outputs:
    """Y = X (a marker carrying ``name`` and ``is_backward`` for graph tools)."""
    x = ctx.inputs[0]
    return (x if ctx.input_name(0) == ctx.output_name(0) else ctx.xp.array(x),)


@register_gradient("AliasWithName")
def _alias_with_name_gradient(g: GradientBuilder) -> None:
    g.add("AliasWithName", [g.GO(0)], [g.GI(0)], name=str(g.arg("name", "")),
          is_backward=True)


@register_op("EnsureClipped", inputs=(1, 3), outputs=1, inplace=[(0, 0)])
def ensure_clipped(ctx: OpContext) -> Outputs:
    """Clip PARAM to [min, max] (each optional); with [PARAM, INDICES, GRAD] (in place)
    only the rows at INDICES."""
    param = ctx.xp.asarray(ctx.inputs[0])
    low = ctx.arg("min")
    high = ctx.arg("max")
    if len(ctx.inputs) == 1:
        return (ctx.xp.clip(param, low, high).astype(param.dtype, copy=False),)
    if len(ctx.inputs) != 3 or ctx.input_name(0) != ctx.output_name(0):
        raise ctx.fail("the sparse form takes [PARAM, INDICES, GRAD] and updates PARAM in "
                       "place (output = input 0)")
    rows = host(ctx.inputs[1]).reshape(-1).astype(np.int64)
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= param.shape[0]):
        raise ctx.fail(f"indices must lie in [0, {param.shape[0]})")
    param[rows] = ctx.xp.clip(param[rows], low, high)
    return (param,)


register_gradient("EnsureClipped")(no_gradient)


@register_op("PrependDim", inputs=1, outputs=1, inplace=[(0, 0)])
def prepend_dim(ctx: OpContext) -> Outputs:
    """X [d0, ...] -> [dim_size, d0 / dim_size, ...]."""
    x = ctx.xp.asarray(ctx.inputs[0])
    size = ctx.int_arg("dim_size", 0)
    if x.ndim < 1 or size <= 0 or x.shape[0] % size:
        raise ctx.fail(f"dim_size {size} must be > 0 and divide the first dim of "
                       f"{tuple(x.shape)}")
    return (x.reshape(size, x.shape[0] // size, *x.shape[1:]),)


@register_op("MergeDim", inputs=1, outputs=1, inplace=[(0, 0)])
def merge_dim(ctx: OpContext) -> Outputs:
    """X [d0, d1, ...] -> [d0 * d1, ...]."""
    x = ctx.xp.asarray(ctx.inputs[0])
    if x.ndim < 2:
        raise ctx.fail(f"MergeDim needs at least 2 dims, got {tuple(x.shape)}")
    return (x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]),)


@register_gradient("PrependDim")
def _prepend_dim_gradient(g: GradientBuilder) -> None:
    g.add("MergeDim", [g.GO(0)], [g.GI(0)])


@register_op("EnforceFinite", inputs=1, outputs=0, side_effects=True)
def enforce_finite(ctx: OpContext) -> Outputs:
    """Fail if the float input holds a NaN or an infinity."""
    values = host(ctx.inputs[0])
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values.reshape(-1)))[0])
        raise OperatorError(ctx.describe(
            f"Tensor {ctx.input_name(0)!r} contains {values.reshape(-1)[bad]} at flat index "
            f"{bad}; find the op that produced it (e.g. a learning rate or loss scale too "
            f"large)"))
    return ()


@register_op("Bucketize", inputs=1, outputs=1, shape=same_as_input(0))
def bucketize(ctx: OpContext) -> Outputs:
    """X -> int32 bucket index per value: the number of ``boundaries`` strictly below it
    (a value equal to a boundary goes to that boundary's bucket)."""
    boundaries = np.asarray(ctx.arg("boundaries", []) or [], dtype=np.float64)
    if boundaries.size > 1 and np.any(np.diff(boundaries) < 0):
        raise ctx.fail(f"boundaries must be sorted, got {boundaries.tolist()}")
    x = host(ctx.inputs[0])
    return (np.searchsorted(boundaries, x, side="left").astype(np.int32),)


for _type in ("Assert", "EnforceFinite", "Bucketize"):
    register_gradient(_type)(no_gradient)
