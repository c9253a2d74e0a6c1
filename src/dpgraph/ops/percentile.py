"""Percentile mapping ops (Caffe2's ``Percentile`` and ``BisectPercentile``; no gradients).

* ``Percentile([original_values [N, F], value_to_pct [V, 2], lengths [F]])``: column ``f``
  of the values uses its own ``lengths[f]`` consecutive (value, percentile) pairs, sorted by
  value.  A value found in the table gets its percentile; one above every value 1, one
  below every value 0; otherwise the percentile is interpolated linearly between the two
  neighbouring pairs (``std::lower_bound`` semantics: the first pair not below the value).
* ``BisectPercentile([raw [N, F]])`` with arguments ``percentile_raw``,
  ``percentile_mapping``, ``percentile_lower``, ``percentile_upper`` and ``lengths``
  (concatenated per feature): below ``R[0]`` -> 0, above ``R[-1]`` -> 1; otherwise Caffe2's
  bisection finds ``k`` (``R[k] <= x < R[k+1]`` when ``R`` is strictly increasing), a hit
  returns ``P[k]``, else ``(1 - w) · U[k] + w · L[k+1]`` with
  ``w = (x - R[k]) / (R[k+1] - R[k] + 1e-10)``.  The bisection is Caffe2's own (it moves
  ``hi`` to ``mid - 1``), reproduced step for step, so repeated raw values map alike.

Both compute in float32 and return float32 shaped like their first input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import OPERATORS, register_gradient, register_op
from dpgraph.ops._common import FLOAT, host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

F32 = np.float32


def _matrix(ctx: OpContext, index: int, what: str) -> np.ndarray:
    value = host(ctx.inputs[index])
    if value.ndim != 2:
        raise ctx.fail(f"{what} ({ctx.input_name(index)}) must be a 2-D tensor, got shape "
                       f"{tuple(value.shape)}")
    return value.astype(F32, copy=False)


def _interpolate(x: np.ndarray, values: np.ndarray, pcts: np.ndarray) -> np.ndarray:
    """Percentile's rule for one feature: ``x`` [N] against sorted ``values``/``pcts``."""
    out = np.ones(x.shape, dtype=F32)
    if not values.size:
        return out
    pos = np.searchsorted(values, x, side="left")
    inside = pos < values.size
    at = np.minimum(pos, values.size - 1)
    hit = inside & (values[at] == x)
    below = inside & ~hit & (pos == 0)
    mid = inside & ~hit & (pos > 0)
    out[hit], out[below] = pcts[at[hit]], 0
    lo, hi = pos[mid] - 1, pos[mid]
    frac = ((x[mid] - values[lo]) / (values[hi] - values[lo])).astype(F32)
    out[mid] = pcts[lo] + frac * (pcts[hi] - pcts[lo])
    return out


@register_op("Percentile", inputs=3, outputs=1, shape=same_as_input(0, FLOAT))
def percentile(ctx: OpContext) -> Outputs:
    """[original_values [N, F], value_to_pct [V, 2], lengths [F]] -> percentiles [N, F]."""
    x = _matrix(ctx, 0, "original_values")
    table = _matrix(ctx, 1, "value_to_pct")
    if table.shape[1] != 2:
        raise ctx.fail(f"value_to_pct ({ctx.input_name(1)}) must have 2 columns (value, "
                       f"percentile), got shape {tuple(table.shape)}")
    lens = host(ctx.inputs[2]).reshape(-1).astype(np.int64)
    if lens.size != x.shape[1]:
        raise ctx.fail(f"lengths ({ctx.input_name(2)}) must hold one length per column of "
                       f"original_values ({x.shape[1]}), got {lens.size}")
    if (lens < 0).any() or int(lens.sum()) != table.shape[0]:
        raise ctx.fail(f"Sum of lengths should be equal to the total number of samples "
                       f"({table.shape[0]}), got lengths {lens.tolist()}")
    out = np.empty(x.shape, dtype=F32)
    bounds = np.concatenate([[0], np.cumsum(lens)])
    for f in range(x.shape[1]):
        part = table[bounds[f]:bounds[f + 1]]
        out[:, f] = _interpolate(x[:, f], part[:, 0], part[:, 1])
    return (out,)


# --- BisectPercentile ----------------------------------------------------------------------
def _bisect(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Caffe2's ``binary_search(raw, 0, size - 1, x)`` for every ``x`` at once."""
    lo = np.zeros(x.shape, dtype=np.int64)
    hi = np.full(x.shape, raw.size - 1, dtype=np.int64)
    found = np.full(x.shape, -1, dtype=np.int64)
    live = np.flatnonzero(lo < hi)
    while live.size:
        mid = lo[live] + (hi[live] - lo[live]) // 2
        low_ok = raw[mid] <= x[live]
        high_ok = x[live] < raw[mid + 1]
        hit = low_ok & high_ok
        found[live[hit]] = mid[hit]
        hi[live[~low_ok]] = mid[~low_ok] - 1
        step = low_ok & ~high_ok
        lo[live[step]] = mid[step] + 1
        live = live[~hit]
        live = live[lo[live] < hi[live]]
    return np.where(found >= 0, found, lo)


def _bisect_feature(x: np.ndarray, raw: np.ndarray, mapping: np.ndarray, lower: np.ndarray,
                    upper: np.ndarray) -> np.ndarray:
    out = np.where(x < raw[0], F32(0), F32(1)).astype(F32)
    inside = np.flatnonzero((x >= raw[0]) & (x <= raw[-1]))
    xs = x[inside]
    k = _bisect(raw, xs)
    nxt = np.minimum(k + 1, raw.size - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = ((xs - raw[k]) / (raw[nxt] - raw[k] + F32(1e-10))).astype(F32)
        mixed = ((F32(1) - w) * upper[k] + w * lower[nxt]).astype(F32)
    out[inside] = np.where(raw[k] == xs, mapping[k], mixed)
    return out


def _bisect_tables(ctx: OpContext) -> tuple[list[np.ndarray], np.ndarray]:
    """([raw, mapping, lower, upper] float32, feature bounds) from the arguments."""
    tables = [np.asarray(ctx.floats_arg(name, []), dtype=F32) for name in
              ("percentile_raw", "percentile_mapping", "percentile_lower", "percentile_upper")]
    for name, table in zip(("mapping", "lower", "upper"), tables[1:]):
        if table.size != tables[0].size:
            raise ctx.fail(f"percentile_{name} has {table.size} entries but percentile_raw "
                           f"has {tables[0].size}; they must match one to one")
    lens = np.asarray(ctx.ints_arg("lengths", []), dtype=np.int64)
    if (lens < 1).any() or int(lens.sum()) != tables[0].size:
        raise ctx.fail(f"Sum of lengths should be equal to the total number of percentile "
                       f"mapping data samples ({tables[0].size}), and each feature needs at "
                       f"least one; got lengths {lens.tolist()}")
    return tables, np.concatenate([[0], np.cumsum(lens)])


def _bisect_shape(op: Any, shapes: list, types: list) -> list:
    return [None if shapes[0] is None else (tuple(shapes[0]), FLOAT)]


@register_op("BisectPercentile", inputs=1, outputs=1, shape=_bisect_shape)
def bisect_percentile(ctx: OpContext) -> Outputs:
    """raw [N, F] -> percentiles [N, F] from the per-feature mapping arguments."""
    x = _matrix(ctx, 0, "raw_values")
    tables, bounds = _bisect_tables(ctx)
    if x.shape[1] != bounds.size - 1:
        raise ctx.fail(f"raw_values has {x.shape[1]} features but lengths describes "
                       f"{bounds.size - 1}")
    out = np.empty(x.shape, dtype=F32)
    for f in range(x.shape[1]):
        part = [t[bounds[f]:bounds[f + 1]] for t in tables]
        out[:, f] = _bisect_feature(x[:, f], *part)
    return (out,)


def _no_gradient(g: GradientBuilder) -> None:
    """Caffe2's ``NO_GRADIENT``: no gradient ops and no input gradients."""


for _type in OPERATORS.types():
    _schema = OPERATORS.get(_type)
    if _schema is not None and _schema.kernel.__module__ == __name__:
        register_gradient(_type)(_no_gradient)
