"""The final Caffe2 optimizer operators: Storm (dense and sparse), GFtrl (group-lasso FTRL),
DecayAdagrad, SmartDecaySparseAdam, RowWiseCounter and WeightScale.  (Wngrad and Adadelta
with their sparse forms live in ``ops/optim.py``.)

Like the other optimizer ops they keep Caffe2's input/output order and argument names, are
in place in Caffe2 (outputs alias inputs) and have no gradient.  ``lr`` is the (negative for
descent) output of LearningRate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import like_inputs, scalar_value
from dpgraph.ops._sparse_rows import check_indices, check_rows, occurrence_layers, writable
from dpgraph.ops.context import OpContext, Outputs


def _same_shape(ctx: OpContext, *indices: int) -> None:
    shapes = [np.shape(ctx.inputs[i]) for i in indices]
    if any(s != shapes[0] for s in shapes[1:]):
        names = [ctx.input_name(i) for i in indices]
        raise ctx.fail(f"inputs {names} must have the same shape, got {shapes}")


def _as(x: Any, like: Any) -> Any:
    """``x`` in ``like``'s dtype (numpy or CuPy arrays alike; Python scalars too)."""
    dtype = like.dtype if hasattr(like, "dtype") else np.asarray(like).dtype
    return x.astype(dtype, copy=False) if hasattr(x, "astype") else np.asarray(x, dtype)


# --- Storm -----------------------------------------------------------------------------------
def _storm_rate(ctx: OpContext, grad_sq_sum: Any, grad: Any, lr: Any) -> tuple[float, float,
                                                                                  float]:
    """(new G, normalised lr, momentum coefficient a) of one STORM step."""
    momentum, beta = ctx.float_arg("momentum", 10.0), ctx.float_arg("beta", 0.1)
    new_g = scalar_value(grad_sq_sum) + float((grad.astype(np.float64) ** 2).sum())
    nlr = scalar_value(lr) * (beta + new_g) ** (-1.0 / 3.0)
    return new_g, nlr, momentum * nlr * nlr


@register_op("Storm", inputs=5, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def storm(ctx: OpContext) -> Outputs:
    """[param, moment, grad_sq_sum, grad, lr] -> [param, moment, grad_sq_sum].

    G' = G + Σg², nlr = lr·(beta + G')^(-1/3), a = momentum·nlr²,
    m' = g + (1 - a)(m - g), w' = w + nlr·m'.
    """
    _same_shape(ctx, 0, 1, 3)
    w, m, gsq, g, lr = ctx.inputs
    new_g, nlr, a = _storm_rate(ctx, gsq, g, lr)
    new_m = _as(g + (1 - a) * (m - g), m)
    return _as(w + nlr * new_m, w), new_m, _as(ctx.xp.full(np.shape(gsq), new_g), gsq)


@register_op("SparseStorm", inputs=6, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def sparse_storm(ctx: OpContext) -> Outputs:
    """[param, moment, grad_sq_sum, grad values, indices, lr] -> [param, moment,
    grad_sq_sum]; G sums over every value, moment and param change on the indexed rows."""
    w, m, gsq, g, indices, lr = ctx.inputs
    _same_shape(ctx, 0, 1)
    idx = check_indices(ctx, indices, np.shape(w)[0])
    rows = check_rows(ctx, w, idx, g)
    new_g, nlr, a = _storm_rate(ctx, gsq, rows, lr)
    new_w, new_m = writable(ctx, w, 0, 0), writable(ctx, m, 1, 1)
    for layer in occurrence_layers(idx):
        r, gr = idx[layer], rows[layer]
        new_m[r] = _as(gr + (1 - a) * (new_m[r] - gr), m)
        new_w[r] = _as(new_w[r] + nlr * new_m[r], w)
    return new_w, new_m, _as(ctx.xp.full(np.shape(gsq), new_g), gsq)


# --- GFtrl -----------------------------------------------------------------------------------
def _gftrl_args(ctx: OpContext) -> tuple[float, float, float, float]:
    return (ctx.float_arg("alpha", 0.005), ctx.float_arg("beta", 1.0),
            ctx.float_arg("lambda1", 0.001), ctx.float_arg("lambda2", 0.001))


@register_op("GFtrl", inputs=(3, 4), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def gftrl(ctx: OpContext) -> Outputs:
    """[var, n_z (var.shape + [2]), grad(, alpha)] -> [var, n_z]: group-lasso FTRL.

    With the gradient viewed as O x I (O = dim 0): z' and n' per element as in Ftrl, then
    per column j, z_norm_j = |z'_:j|, and w' = z'·(λ1√O / z_norm_j - 1) /
    ((β + √n')/α + λ2) where z_norm_j > λ1√O, else 0.
    """
    w, nz, g = ctx.inputs[:3]
    _same_shape(ctx, 0, 2)
    if np.size(nz) != 2 * np.size(w):
        raise ctx.fail(f"n_z must hold 2 values per element of var {np.shape(w)}, got "
                       f"{np.shape(nz)}")
    alpha, beta, l1, l2 = _gftrl_args(ctx)
    if len(ctx.inputs) > 3:
        alpha = scalar_value(ctx.inputs[3])
    rows = np.shape(w)[0] if np.ndim(w) else 1
    w2, g2 = np.reshape(w, (rows, -1)), np.reshape(g, (rows, -1))
    pairs = np.reshape(nz, (rows, -1, 2))
    n, z = pairs[..., 0], pairs[..., 1]
    new_n = n + g2 * g2
    new_z = z + g2 - (np.sqrt(new_n) - np.sqrt(n)) / alpha * w2
    z_norm = np.sqrt((new_z * new_z).sum(axis=0, keepdims=True))
    threshold = l1 * np.sqrt(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        shrunk = new_z * (threshold / z_norm - 1) / ((beta + np.sqrt(new_n)) / alpha + l2)
    new_w = np.where(z_norm > threshold, shrunk, 0.0)
    new_nz = np.stack([new_n, new_z], axis=-1)
    return _as(np.reshape(new_w, np.shape(w)), w), _as(np.reshape(new_nz, np.shape(nz)), nz)


# --- DecayAdagrad ----------------------------------------------------------------------------
@register_op("DecayAdagrad", inputs=6, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def decay_adagrad(ctx: OpContext) -> Outputs:
    """[param, moment_1, moment_2, grad, lr, iter] -> [param, moment_1, moment_2].

    t = iter + 1, c = 1 - β1^t (1 without bias_correction_first), m' = β1·m + (1-β1)·g,
    v' = v + g², w' = w + lr·(m'/c/(√v' + ε) + weight_decay·w).  beta2 is unused.
    """
    _same_shape(ctx, 0, 1, 2, 3)
    w, m, v, g, lr, iteration = ctx.inputs
    beta1, eps = ctx.float_arg("beta1", 0.9), ctx.float_arg("epsilon", 1e-5)
    wd = ctx.float_arg("weight_decay", 0.0)
    t = int(scalar_value(iteration)) + 1
    c = 1.0 - beta1 ** t if ctx.int_arg("bias_correction_first", 1) else 1.0
    new_m = _as(beta1 * m + (1 - beta1) * g, m)
    new_v = _as(v + g * g, v)
    step = new_m / c / (np.sqrt(new_v) + eps) + wd * w
    return _as(w + scalar_value(lr) * step, w), new_m, new_v


# --- RowWiseCounter --------------------------------------------------------------------------
@register_op("RowWiseCounter", inputs=4, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def row_wise_counter(ctx: OpContext) -> Outputs:
    """[prev_iter (int64, rows or rows x 1), counter (double, rows), indices, iter] ->
    [prev_iter, counter]: for each touched row,
    counter = 1 + 2^(-Δiter / counter_halflife)·counter (Δiter = iter - prev_iter, at
    least 0; no decay without a positive halflife), then prev_iter = iter."""
    prev, counter, indices, iteration = ctx.inputs
    if np.size(prev) != np.size(counter):  # [rows] or [rows, 1] alike, as Caffe2's flat view
        raise ctx.fail(f"prev_iter and update_counter must hold one entry per row each, got "
                       f"shapes {np.shape(prev)} and {np.shape(counter)}")
    idx = check_indices(ctx, indices, np.size(prev))
    halflife = ctx.float_arg("counter_halflife", -1.0)
    neg_log_rho = np.log(2.0) / halflife if halflife > 0 else 0.0
    current = int(scalar_value(iteration))
    new_prev, new_counter = writable(ctx, prev, 0, 0), writable(ctx, counter, 1, 1)
    flat_prev, flat_counter = new_prev.reshape(-1), new_counter.reshape(-1)
    for row in idx:  # repeated rows see the update of the earlier occurrence
        delta = max(0, current - int(flat_prev[row]))
        flat_prev[row] = current
        flat_counter[row] = 1.0 + np.exp(-delta * neg_log_rho) * flat_counter[row]
    return flat_prev.reshape(np.shape(prev)), flat_counter.reshape(np.shape(counter))


# --- SmartDecaySparseAdam --------------------------------------------------------------------
def _catch_up_sum(beta1: float, k: Any) -> Any:
    """Σ_{i=1..k} β1^i per row (the decayed first moments applied while a row was unseen)."""
    k = np.asarray(k, dtype=np.float64)
    if beta1 == 1.0:
        return k
    return beta1 * (1.0 - beta1 ** k) / (1.0 - beta1)


@register_op("SmartDecaySparseAdam", inputs=8, outputs=4,
             inplace=[(0, 0), (1, 1), (2, 2), (3, 3)], shape=like_inputs(0, 1, 2, 3))
def smart_decay_sparse_adam(ctx: OpContext) -> Outputs:
    """[param, moment_1, moment_2, last_seen (int64, rows), indices, grad, lr, iter] ->
    [param, moment_1, moment_2, last_seen]: sparse Adam that catches up on the steps a row
    missed.

    For each indexed row (t = iter + 1, k = t - last_seen): v' = β2^k·v + (1-β2)·g²; the k
    missed steps are replayed, m decaying by β1 each step and taking (1-β1)·g at the last,
    each step adding lr·m/(√v' + ε) to the row (no bias correction); last_seen' = t.
    A repeated index in the same call has k = 0: only v takes its g².
    """
    w, m, v, seen, indices, g, lr, iteration = ctx.inputs
    _same_shape(ctx, 0, 1, 2)
    if np.shape(seen) != np.shape(w)[:1]:
        raise ctx.fail(f"last_seen must hold one entry per row of param {np.shape(w)}, got "
                       f"{np.shape(seen)}")
    beta1, beta2 = ctx.float_arg("beta1", 0.9), ctx.float_arg("beta2", 0.999)
    eps = ctx.float_arg("epsilon", 1e-5)
    idx = check_indices(ctx, indices, np.shape(w)[0])
    rows = check_rows(ctx, w, idx, g)
    t = int(scalar_value(iteration)) + 1
    step_lr = scalar_value(lr)
    new_w, new_m = writable(ctx, w, 0, 0), writable(ctx, m, 1, 1)
    new_v, new_seen = writable(ctx, v, 2, 2), writable(ctx, seen, 3, 3)
    block = (-1,) + (1,) * (np.ndim(w) - 1)
    for layer in occurrence_layers(idx):
        r, gr = idx[layer], rows[layer]
        k = np.reshape(np.maximum(t - new_seen[r], 0), block)
        new_v[r] = _as(beta2 ** k * new_v[r] + (1 - beta2) * gr * gr, v)
        denom = np.sqrt(new_v[r]) + eps
        replay = k >= 1
        fresh = (1 - beta1) * gr
        update = step_lr * (_catch_up_sum(beta1, k) * new_m[r] + fresh) / denom
        new_w[r] = _as(np.where(replay, new_w[r] + update, new_w[r]), w)
        new_m[r] = _as(np.where(replay, beta1 ** k * new_m[r] + fresh, new_m[r]), m)
        new_seen[r] = t
    return new_w, new_m, new_v, new_seen


# --- WeightScale -----------------------------------------------------------------------------
_INT64_MAX = 2 ** 63 - 1


@register_op("WeightScale", inputs=2, outputs=1, inplace=[(0, 0)], shape=like_inputs(0))
def weight_scale(ctx: OpContext) -> Outputs:
    """[w, iter (int64, CPU)] -> [w']: with t = iter + 1, w' = scale·w when t is a multiple
    of ``stepsize`` and t < ``upper_bound_iter``, else w (both default to int64 max, scale
    to 1)."""
    w, iteration = ctx.inputs
    stepsize = ctx.int_arg("stepsize", _INT64_MAX)
    upper = ctx.int_arg("upper_bound_iter", _INT64_MAX)
    if stepsize <= 0:
        raise ctx.fail(f"stepsize must be positive, got {stepsize}")
    t = int(scalar_value(iteration)) + 1
    if t % stepsize != 0 or t >= upper:
        return (w.copy() if ctx.input_name(0) != ctx.output_name(0) else w,)
    return (_as(w * ctx.float_arg("scale", 1.0), w),)
