"""Assorted operators: string predicates and slices, index hashing, top-k selections, CTC decoders,
piecewise-linear calibration, learning-rate adaption and the GRU unit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import BOOL, FLOAT, INT64, host, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


# --- strings ---------------------------------------------------------------------------------
def _string_test(ctx: OpContext, arg: str, method: str) -> Outputs:
    strings = host(ctx.inputs[0])
    affix = ctx.str_arg(arg, "")
    if strings.dtype.kind in "SU":
        needle: Any = affix.encode() if strings.dtype.kind == "S" else affix
        return (getattr(np.char, method)(strings, needle).astype(bool),)
    flat = [getattr(s if isinstance(s, bytes | str) else str(s), method)(
        affix.encode() if isinstance(s, bytes) else affix) for s in strings.reshape(-1)]
    return (np.array(flat, dtype=bool).reshape(strings.shape),)


@register_op("StringStartsWith", inputs=1, outputs=1, shape=same_as_input(0, BOOL))
def string_starts_with(ctx: OpContext) -> Outputs:
    """strings -> bool tensor: which strings start with ``prefix``."""
    return _string_test(ctx, "prefix", "startswith")


@register_op("StringEndsWith", inputs=1, outputs=1, shape=same_as_input(0, BOOL))
def string_ends_with(ctx: OpContext) -> Outputs:
    """strings -> bool tensor: which strings end with ``suffix``."""
    return _string_test(ctx, "suffix", "endswith")


@register_op("StringEquals", inputs=1, outputs=1, shape=same_as_input(0, BOOL))
def string_equals(ctx: OpContext) -> Outputs:
    """strings -> bool tensor: which strings equal ``text``."""
    strings = host(ctx.inputs[0])
    text = ctx.str_arg("text", "")
    flat = [(s == text.encode()) if isinstance(s, bytes) else (str(s) == text)
            for s in strings.reshape(-1)]
    return (np.array(flat, dtype=bool).reshape(strings.shape),)


def _string_slices(ctx: OpContext, pick: Any) -> Outputs:
    strings = host(ctx.inputs[0])
    length = ctx.int_arg("length", 0)
    if length < 0:
        raise ctx.fail(f"length must be >= 0, got {length}")
    out = np.empty(strings.shape, dtype=object)
    for index, value in np.ndenumerate(strings):
        out[index] = pick(value if isinstance(value, bytes | str) else str(value), length)
    return (out,)


@register_op("StringPrefix", inputs=1, outputs=1, shape=same_as_input(0))
def string_prefix(ctx: OpContext) -> Outputs:
    """strings -> their first ``length`` bytes (the whole string when shorter)."""
    return _string_slices(ctx, lambda s, n: s[:n])


@register_op("StringSuffix", inputs=1, outputs=1, shape=same_as_input(0))
def string_suffix(ctx: OpContext) -> Outputs:
    """strings -> their last ``length`` bytes (the whole string when shorter)."""
    return _string_slices(ctx, lambda s, n: s[max(len(s) - n, 0):])


# --- IndexHash -------------------------------------------------------------------------------
@register_op("IndexHash", inputs=1, outputs=1, inplace=[(0, 0)], shape=same_as_input(0))
def index_hash(ctx: OpContext) -> Outputs:
    """indices (int32/int64) -> hashed indices in [0, modulo), Caffe2's byte-wise hash:
    h = seed·0xDEADBEEF; h = h·65537 + byte for each (signed) byte; h mod modulo."""
    indices = host(ctx.inputs[0])
    modulo = ctx.int_arg("modulo", 0)
    if modulo <= 0:
        raise ctx.fail(f"argument modulo must be > 0, got {modulo}")
    if indices.dtype not in (np.int32, np.int64):
        raise ctx.fail(f"indices must be int32 or int64, got {indices.dtype}")
    width = indices.dtype.itemsize
    unsigned = np.dtype(f"u{width}")
    mask = (1 << (8 * width)) - 1
    seed = (ctx.int_arg("seed", 0) * 0xDEADBEEF) & mask
    hashed = np.full(indices.shape, seed, dtype=unsigned)
    raw = np.ascontiguousarray(indices.astype(indices.dtype.newbyteorder("<")))
    byte_view = raw.view(np.int8).reshape(*indices.shape, width)
    with np.errstate(over="ignore"):
        for i in range(width):
            hashed = hashed * unsigned.type(65537) + byte_view[..., i].astype(unsigned)
    signed = hashed.view(indices.dtype).astype(np.int64)
    result = np.fmod(signed, modulo)
    result = np.where(result < 0, result + modulo, result)
    return (result.astype(indices.dtype),)


# --- TopK / FlexibleTopK ---------------------------------------------------------------------
def _descending_order(x: np.ndarray, axis: int) -> np.ndarray:
    """Indices sorting ``x`` by decreasing value along ``axis``; ties keep lower index first."""
    return np.argsort(-x, axis=axis, kind="stable")


def _top_k_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None or not shapes[0]:
        return [None] * len(op.output)
    args = arguments_dict(op.arg)
    axis = int(args.get("axis", -1)) % len(shapes[0])
    k = int(args.get("k", -1))
    out = list(shapes[0])
    out[axis] = out[axis] if k == -1 else k
    result = [(tuple(out), types[0] or FLOAT), (tuple(out), INT64)]
    if len(op.output) == 3:
        result.append(((int(np.prod(out)),), INT64))
    return result


@register_op("TopK", inputs=1, outputs=(2, 3), shape=_top_k_shape)
def top_k(ctx: OpContext) -> Outputs:
    """X -> [values, indices (int64)(, flattened indices)]: the ``k`` largest along ``axis``
    (default last), in decreasing order."""
    x = host(ctx.inputs[0])
    axis = ctx.int_arg("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis < x.ndim:
        raise ctx.fail(f"axis {ctx.int_arg('axis', -1)} is out of range for {x.ndim}-D X")
    k = ctx.int_arg("k", -1)
    k = x.shape[axis] if k == -1 else k
    if k < 1 and x.size:
        raise ctx.fail(f"k = {k} must be >= 1 (or -1 for the whole axis)")
    found = min(k, x.shape[axis])
    order = np.take(_descending_order(x, axis), np.arange(found), axis=axis)
    values = np.take_along_axis(x, order, axis=axis)
    outs = [values, order.astype(np.int64)]
    if ctx.num_outputs == 3:  # positions in X.reshape(-1), in the order of values
        coords: list[Any] = list(np.indices(order.shape))
        coords[axis] = order
        outs.append(np.ravel_multi_index(tuple(coords), x.shape).astype(np.int64))
    if k > found:  # as Caffe2: the missing places hold value 0 and index -1
        outs = [_pad_axis(out, axis, k - found, 0 if i == 0 else -1)
                for i, out in enumerate(outs)]
    if ctx.num_outputs == 3:
        outs[2] = outs[2].reshape(-1)
    return outs


def _pad_axis(a: np.ndarray, axis: int, extra: int, value: int) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return np.pad(a, widths, constant_values=value)


@register_gradient("TopK")
def _top_k_grad(g: GradientBuilder) -> None:
    g.add("TopKGradient", [g.GO(0), g.O(1), g.I(0)], [g.GI(0)])


@register_op("TopKGradient", inputs=3, outputs=1, shape=same_as_input(2))
def top_k_gradient(ctx: OpContext) -> Outputs:
    """[dValues, indices, X] -> dX: dValues written back at the selected positions."""
    dvalues, indices, x = (host(v) for v in ctx.inputs)
    axis = ctx.int_arg("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    dx = np.zeros(x.shape, dtype=dvalues.dtype)
    indices = indices.astype(np.int64)
    found = min(indices.shape[axis], x.shape[axis])  # places past the axis hold index -1
    kept = np.take(indices, np.arange(found), axis=axis)
    np.put_along_axis(dx, kept, np.take(dvalues, np.arange(found), axis=axis), axis=axis)
    return (dx,)


def _flexible_rows(ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
    """(X as rows × D, k per row as int64), validated."""
    x = host(ctx.inputs[0])
    k = host(ctx.inputs[1]).reshape(-1).astype(np.int64)
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    if k.size != rows.shape[0]:
        raise ctx.fail(f"k has {k.size} entries for {rows.shape[0]} rows of X")
    if k.size and (int(k.min()) <= 0 or int(k.max()) > rows.shape[1]):
        raise ctx.fail(f"every k must lie in [1, {rows.shape[1]}]")
    return rows, k


@register_op("FlexibleTopK", inputs=2, outputs=2)
def flexible_top_k(ctx: OpContext) -> Outputs:
    """[X (... × D), k (one per row)] -> [values, indices (int64)]: row i's k[i] largest,
    concatenated over rows."""
    rows, k = _flexible_rows(ctx)
    order = _descending_order(rows, 1)
    keep = np.arange(rows.shape[1])[None, :] < k[:, None]
    values = np.take_along_axis(rows, order, axis=1)
    return values[keep], order[keep].astype(np.int64)


@register_gradient("FlexibleTopK")
def _flexible_top_k_grad(g: GradientBuilder) -> None:
    g.add("FlexibleTopKGradient", [g.I(0), g.I(1), g.GO(0), g.O(1)], [g.GI(0)])


@register_op("FlexibleTopKGradient", inputs=4, outputs=1, shape=same_as_input(0))
def flexible_top_k_gradient(ctx: OpContext) -> Outputs:
    """[X, k, dValues, indices] -> dX: dValues scattered back row by row."""
    x = host(ctx.inputs[0])
    rows, k = _flexible_rows(ctx)
    dvalues = host(ctx.inputs[2]).reshape(-1)
    indices = host(ctx.inputs[3]).reshape(-1).astype(np.int64)
    dx = np.zeros(rows.shape, dtype=dvalues.dtype)
    dx[np.repeat(np.arange(k.size), k), indices] = dvalues
    return (dx.reshape(x.shape),)


# --- CTC decoders ----------------------------------------------------------------------------
def _seq_lengths(ctx: OpContext, inputs: np.ndarray) -> np.ndarray:
    steps, batch = inputs.shape[0], inputs.shape[1]
    if ctx.num_inputs > 1:
        lens = host(ctx.inputs[1]).reshape(-1).astype(np.int64)
        if lens.size != batch or (lens.size and (lens.min() < 0 or lens.max() > steps)):
            raise ctx.fail(f"SEQ_LEN must hold {batch} lengths in [0, {steps}]")
        return lens
    return np.full(batch, steps, np.int64)


@register_op("CTCGreedyDecoder", inputs=(1, 2), outputs=2)
def ctc_greedy_decoder(ctx: OpContext) -> Outputs:
    """[INPUTS (T×N×C), SEQ_LEN?] -> [OUTPUT_LEN (N), VALUES]: per-step argmax, repeats
    merged (``merge_repeated``, default on), blanks (class 0) removed."""
    inputs = host(ctx.inputs[0])
    if inputs.ndim != 3:
        raise ctx.fail(f"INPUTS must be T×N×C, got shape {inputs.shape}")
    lens = _seq_lengths(ctx, inputs)
    ids: np.ndarray = (inputs.argmax(axis=2).T if inputs.size
                       else np.zeros(inputs.shape[1::-1], np.int64))
    prev = np.concatenate([np.zeros((ids.shape[0], 1), ids.dtype), ids[:, :-1]], axis=1)
    keep = (ids != 0) & (np.arange(ids.shape[1])[None, :] < lens[:, None])
    if ctx.int_arg("merge_repeated", 1):
        keep &= ids != prev
    return keep.sum(axis=1).astype(np.int32), ids[keep].astype(np.int32)


def _beam_search(probs: np.ndarray, beam_width: int, prune: float
                 ) -> list[tuple[float, tuple[int, ...]]]:
    """Prefix beam search over (T × C) per-step scores; final (score, prefix) by rank."""
    blank_prob: dict[tuple[int, ...], float] = {(): 1.0}
    other_prob: dict[tuple[int, ...], float] = {(): 0.0}
    beam: list[tuple[int, ...]] = [()]
    ranked: list[tuple[float, tuple[int, ...]]] = []
    for step in probs:
        alphabet = np.flatnonzero(step > prune)
        alphabet = alphabet if alphabet.size else np.arange(step.size)
        beam_set = set(beam)
        nb: dict[tuple[int, ...], float] = {}
        nnb: dict[tuple[int, ...], float] = {}
        for prefix in sorted(beam):
            pb, pnb = blank_prob.get(prefix, 0.0), other_prob.get(prefix, 0.0)
            for c in alphabet.tolist():
                p = float(step[c])
                if c == 0:
                    nb[prefix] = nb.get(prefix, 0.0) + p * (pb + pnb)
                    continue
                extended = (*prefix, c)
                if prefix and c == prefix[-1]:
                    nnb[extended] = nnb.get(extended, 0.0) + p * pb
                    nnb[prefix] = nnb.get(prefix, 0.0) + p * pnb
                else:
                    nnb[extended] = nnb.get(extended, 0.0) + p * (pb + pnb)
                if extended not in beam_set:
                    nb[extended] = nb.get(extended, 0.0) + float(step[0]) * (
                        blank_prob.get(extended, 0.0) + other_prob.get(extended, 0.0))
                    nnb[extended] = nnb.get(extended, 0.0) + p * other_prob.get(extended, 0.0)
        totals = {key: nb.get(key, 0.0) + nnb.get(key, 0.0) for key in nb.keys() | nnb.keys()}
        ranked = sorted(((v, key) for key, v in sorted(totals.items())), key=lambda e: -e[0])
        beam = [key for _, key in ranked[:beam_width]]
        blank_prob, other_prob = nb, nnb
    return ranked


@register_op("CTCBeamSearchDecoder", inputs=(1, 2), outputs=(2, 3))
def ctc_beam_search_decoder(ctx: OpContext) -> Outputs:
    """[INPUTS (T×N×C), SEQ_LEN?] -> [OUTPUT_LEN (N·num_candidates), VALUES(, OUTPUT_PROB)]:
    prefix beam search (blank = class 0) keeping ``beam_width`` prefixes per step."""
    inputs = host(ctx.inputs[0]).astype(np.float64)
    if inputs.ndim != 3:
        raise ctx.fail(f"INPUTS must be T×N×C, got shape {inputs.shape}")
    lens = _seq_lengths(ctx, inputs)
    beam_width = ctx.int_arg("beam_width", 10)
    candidates = ctx.int_arg("num_candidates", 1)
    prune = ctx.float_arg("prune_threshold", 0.001)
    out_len = np.zeros(lens.size * candidates, np.int32)
    out_prob = np.zeros(lens.size * candidates, np.float32)
    values: list[int] = []
    for n, length in enumerate(lens.tolist()):
        ranked = _beam_search(inputs[:length, n, :], beam_width, prune)
        for j, (score, prefix) in enumerate(ranked[:candidates]):
            out_len[n * candidates + j] = len(prefix)
            out_prob[n * candidates + j] = score
            values.extend(prefix)
    outs = [out_len, np.array(values, np.int32), out_prob]
    return outs[:ctx.num_outputs]


# --- PiecewiseLinearTransform ----------------------------------------------------------------
def _piecewise_params(ctx: OpContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if ctx.num_inputs == 4:
        bounds, slopes, intercepts = (host(v).reshape(-1).astype(np.float32)
                                      for v in ctx.inputs[1:])
        return bounds, slopes, intercepts
    return (np.asarray(ctx.floats_arg("bounds"), np.float32),
            np.asarray(ctx.floats_arg("slopes"), np.float32),
            np.asarray(ctx.floats_arg("intercepts"), np.float32))


def _piecewise(x: np.ndarray, bounds: np.ndarray, slopes: np.ndarray,
               intercepts: np.ndarray) -> np.ndarray:
    """One group's transform; values outside the bounds use the edge pieces at the edge."""
    last = bounds.size - 1
    piece = np.clip(np.searchsorted(bounds, x, side="left") - 1, 0, last - 1)
    at = np.where(x <= bounds[0], bounds[0], np.where(x >= bounds[last], bounds[last], x))
    piece = np.where(x <= bounds[0], 0, np.where(x >= bounds[last], last - 1, piece))
    return (slopes[piece] * at + intercepts[piece]).astype(np.float32)


@register_op("PiecewiseLinearTransform", inputs=(1, 4), outputs=1,
             shape=same_as_input(0, FLOAT))
def piecewise_linear_transform(ctx: OpContext) -> Outputs:
    """[X (N×K or N), bounds?, slopes?, intercepts?] -> per-column piecewise-linear map.

    Parameters hold one group of (pieces + 1) bounds, pieces slopes and intercepts per
    column; with ``binary`` only the positive column is mapped and column 0 = 1 - column 1.
    """
    x = host(ctx.inputs[0]).astype(np.float32)
    bounds, slopes, intercepts = _piecewise_params(ctx)
    binary = bool(ctx.int_arg("binary", 0))
    cols = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
    groups = 1 if binary else cols.shape[1]
    pieces, rem = divmod(slopes.size, groups)
    if rem or pieces < 1 or intercepts.size != slopes.size or bounds.size != groups * (
            pieces + 1):
        raise ctx.fail(f"{groups} group(s) need equal numbers of pieces: got {bounds.size} "
                       f"bounds, {slopes.size} slopes, {intercepts.size} intercepts")
    bounds = bounds.reshape(groups, pieces + 1)
    slopes, intercepts = slopes.reshape(groups, pieces), intercepts.reshape(groups, pieces)
    out = np.empty_like(cols)
    if binary:
        positive = cols.shape[1] - 1
        out[:, positive] = _piecewise(cols[:, positive], bounds[0], slopes[0], intercepts[0])
        if cols.shape[1] == 2:
            out[:, 0] = 1 - out[:, 1]
    else:
        for g in range(groups):
            out[:, g] = _piecewise(cols[:, g], bounds[g], slopes[g], intercepts[g])
    return (out.reshape(x.shape),)


# --- LearningRateAdaption --------------------------------------------------------------------
@register_op("LearningRateAdaption", inputs=3, outputs=1, shape=same_as_input(0))
def learning_rate_adaption(ctx: OpContext) -> Outputs:
    """[lr, grad, effgrad] -> new lr: lr·(1 - lr_alpha·cos(grad, effgrad)) when
    ``normalized_lr_adaption`` (default), else lr - lr_alpha·(grad·effgrad)."""
    lr, grad, effgrad = (host(v).astype(np.float32) for v in ctx.inputs)
    if lr.size != 1 or grad.size != effgrad.size:
        raise ctx.fail("lr must hold one value and grad, effgrad the same number of entries")
    alpha = np.float32(ctx.float_arg("lr_alpha", 0.01))
    dot = np.float32(np.dot(grad.reshape(-1), effgrad.reshape(-1)))
    if ctx.int_arg("normalized_lr_adaption", 1):
        eps = np.float32(1e-12)
        norms = (max(np.float32(np.linalg.norm(grad)), eps)
                 * max(np.float32(np.linalg.norm(effgrad)), eps))
        new = lr * (1 - alpha * dot / norms)
    else:
        new = lr - alpha * dot
    return (new.astype(np.float32).reshape(lr.shape),)
