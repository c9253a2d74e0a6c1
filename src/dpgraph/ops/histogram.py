"""Histograms and quantiles over all the values of several tensors.

* ``Histogram``: counts per ``[bin_edges[i], bin_edges[i+1])`` (float32 edges, as Caffe2
  reads them); values outside every bin are not counted.
* ``SelfBinningHistogram``: ``num_bins`` linear or logarithmic bins spanning the values
  themselves (``[min, min + 1.0001 (max - min)]``), returned with their counts.
* ``Quantile``: a value ``v`` with at least ``ceil(quantile * n)`` values ``<= v``, found by
  bisection to the relative tolerance ``tol``.

Each is computed in the inputs' own float type (float or double), as Caffe2 does, so edges
and bisection steps round the same way.  None has a gradient.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs


def _float_inputs(ctx: OpContext) -> list[np.ndarray]:
    """Every input as a flat array; all must share one dtype, float or double."""
    values = [np.asarray(host(v)) for v in ctx.inputs]
    dtype = values[0].dtype
    if dtype not in (np.float32, np.float64):
        raise ctx.fail(f"inputs must be float or double tensors, got {dtype} for "
                       f"{ctx.input_name(0)!r}")
    for i, value in enumerate(values[1:], start=1):
        if value.dtype != dtype:
            raise ctx.fail(f"All inputs must have the same type; expected {dtype} but got "
                           f"{value.dtype} for input {i} ({ctx.input_name(i)!r})")
    return [v.reshape(-1) for v in values]


def _all_values(ctx: OpContext, use_abs: bool) -> np.ndarray:
    values = _float_inputs(ctx)
    flat = np.concatenate(values)
    return np.abs(flat) if use_abs else flat


# --- Histogram --------------------------------------------------------------------------------
def _bin_edges(ctx: OpContext) -> np.ndarray:
    edges = np.asarray(ctx.floats_arg("bin_edges"), dtype=np.float32)
    if edges.size < 2:
        raise ctx.fail("Number of bin edges must be greater than or equal to 2.")
    if np.any(edges[1:] <= edges[:-1]):
        raise ctx.fail("bin_edges must be a strictly increasing sequence of values.")
    return edges


@register_op("Histogram", inputs=(1, None), outputs=1)
def histogram(ctx: OpContext) -> Outputs:
    """X_1, X_2, ... -> int64 [k]: how many values fall in ``[bin_edges[i], bin_edges[i+1])``."""
    edges = _bin_edges(ctx)
    values = np.concatenate(_float_inputs(ctx))
    slot = np.searchsorted(edges.astype(values.dtype), values, side="right")
    counts = np.bincount(slot, minlength=edges.size + 1)
    return (counts[1:edges.size].astype(np.int64),)


# --- SelfBinningHistogram ---------------------------------------------------------------------
def _self_bin_edges(low: Any, high: Any, num_bins: int, logarithmic: bool,
                    start: Any) -> tuple[np.ndarray, Any]:
    """The ``num_bins + 1`` edges for values in ``[low, high]`` (in their float type) and the
    scaled maximum they reach."""
    dtype = type(low)
    scaling = dtype(1.0001)
    ratio = np.arange(num_bins + 1).astype(dtype) / dtype(num_bins)
    if not logarithmic:
        scaled_max = low + (high - low) * scaling
        return low + ratio * (scaled_max - low), scaled_max
    low, high = max(low, start), max(high, start)
    scaled_max = low + (high - low) * scaling
    step = np.log(scaled_max) - np.log(low)
    return low * np.exp(step * ratio), scaled_max


@register_op("SelfBinningHistogram", inputs=(1, None), outputs=2)
def self_binning_histogram(ctx: OpContext) -> Outputs:
    """X_1, X_2, ... -> [edges [num_bins + 1], counts int64 [num_bins + 1]]: bins spanning
    the values (``bin_spacing`` 'linear' or 'logarithmic' from ``logspace_start``); values
    below the first edge count in bin 0; the last count is 0."""
    num_bins = ctx.int_arg("num_bins", 0)
    if num_bins < 1:
        raise ctx.fail("Number of bins must be greater than or equal to 1.")
    spacing = ctx.str_arg("bin_spacing", "linear")
    if spacing not in ("linear", "logarithmic"):
        raise ctx.fail("Bin spacing can be one of 'linear' or 'logarithmic'.")
    start = np.float32(ctx.float_arg("logspace_start", 1e-24))
    if not start > 0:
        raise ctx.fail(f"logspace_start must be > 0, got {start}")
    values = _all_values(ctx, bool(ctx.arg("abs", False)))
    dtype = values.dtype.type
    counts = np.zeros(num_bins + 1, np.int64)
    if values.size == 0:
        return np.zeros(num_bins + 1, values.dtype), counts
    high = values.max()
    edges, scaled_max = _self_bin_edges(values.min(), high, num_bins,
                                        spacing == "logarithmic", dtype(start))
    edges = edges.astype(values.dtype)
    if edges[-1] <= high:  # no spread (or it rounded away): everything in bin 0
        edges[-1] = scaled_max
        counts[0] = values.size
        return edges, counts
    slot = np.searchsorted(edges, values, side="right")
    slot = slot[slot < edges.size]
    np.add.at(counts, np.maximum(slot - 1, 0), 1)
    return edges, counts


# --- Quantile ---------------------------------------------------------------------------------
def _quantile_args(ctx: OpContext) -> tuple[np.float32, np.float32]:
    quantile = np.float32(ctx.float_arg("quantile", -1.0))
    tol = np.float32(ctx.float_arg("tol", 1e-3))
    if not 0 <= quantile <= 1:
        raise ctx.fail(f"input quantile should be in [0, 1], got {quantile}")
    if not tol > 0:
        raise ctx.fail(f"tolerance should be > 0, got {tol}")
    return quantile, tol


@register_op("Quantile", inputs=(1, None), outputs=1)
def quantile(ctx: OpContext) -> Outputs:
    """X_1, X_2, ... -> [v]: the bisected value with ``ceil(quantile * n)`` values
    ``<= v`` (of ``|x|`` when ``abs``, the default), to relative tolerance ``tol``."""
    q, tol = _quantile_args(ctx)
    values = np.sort(_all_values(ctx, bool(ctx.arg("abs", True))))
    if values.size == 0:
        raise ctx.fail("number of total element in input tensor should be larger than 0")
    dtype = values.dtype.type
    target = int(np.ceil(np.float32(values.size) * q))
    lo, hi = values[0], values[-1]
    result = _bisect(ctx, values, target, lo, hi, tol, dtype)
    return (np.array([result], dtype=values.dtype),)


def _bisect(ctx: OpContext, values: np.ndarray, target: int, lo: Any, hi: Any,
            tol: np.float32, dtype: type) -> Any:
    def count(threshold: Any) -> int:
        return int(np.searchsorted(values, threshold, side="right"))

    if target == 0:
        return lo
    if target == values.size or count(lo) >= target:
        return hi if target == values.size else lo
    while np.abs(hi - lo) > tol * (np.abs(hi) + np.abs(lo)):
        mid = dtype(float(lo) + float(hi - lo) / 2.0)
        found = count(mid)
        if found > target:
            if hi == mid:
                raise ctx.fail("numeric precision at limit, unable to continue bisect")
            hi = mid
        elif found < target:
            if lo == mid:
                raise ctx.fail("numeric precision at limit, unable to continue bisect")
            lo = mid
        else:
            return mid
    return hi
