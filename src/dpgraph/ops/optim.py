"""Optimizer operators: iteration counters, weighted sums and parameter updates.

The LearningRate op and its policies live in ``ops/learning_rate.py``.

The ops the optimizer builders emit keep Caffe2's exact input/output order and argument names.
Updates are in place in Caffe2 (outputs alias inputs); dense kernels return new arrays, while
sparse updates of big tables write the rows in place when the op is in place (all checks run
before anything is written, so a failing op changes nothing).  Sparse updates with repeated
indices apply the rows one after the other, as Caffe2 does.  No optimizer op has a gradient.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import (
    FLOAT,
    FLOAT16,
    INT64,
    host,
    inplace_target,
    like_inputs,
    out_buffer,
    reads_apart,
    same_as_input,
    same_float_arrays,
    scalar_value,
)
from dpgraph.ops._sparse_rows import check_indices, check_rows, occurrence_layers, writable
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.stats import GLOBAL_REGISTRY


# --- iteration counters and mutexes ----------------------------------------------------------
class Mutex:
    """The opaque blob ``CreateMutex`` makes; ``AtomicIter`` holds its lock.  Reentrant: the
    runtime holds it around ops that name it as their ``mutex_input`` while their kernels
    take it too."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.RLock()

    def __repr__(self) -> str:
        return "Mutex()"

    # A lock cannot be copied or pickled; a copy is a fresh, unlocked mutex.
    def __deepcopy__(self, memo: dict) -> Mutex:
        return Mutex()

    def __reduce__(self) -> tuple:
        return (Mutex, ())


@register_op("CreateMutex", inputs=0, outputs=1)
def create_mutex(ctx: OpContext) -> Outputs:
    """No inputs -> a new mutex object."""
    return (Mutex(),)


def _counter(ctx: OpContext, value: Any) -> Any:
    if value is None:
        return np.zeros(1, dtype=np.int64)
    value = host(value)
    if value.size != 1:
        raise ctx.fail(f"the iteration counter must have 1 element, got shape {value.shape}")
    return value


@register_op("Iter", inputs=(0, 1), outputs=1, inplace=[(0, 0)], side_effects=True,
             shape=lambda op, s, t: [((1,), INT64)])
def iter_op(ctx: OpContext) -> Outputs:
    """Increment an int64 [1] counter (in place; a missing counter starts at 0)."""
    value = ctx.inputs[0] if ctx.inputs else ctx.prev_output(0)
    counter = _counter(ctx, value)
    return ((counter + 1).astype(np.int64),)


@register_op("AtomicIter", inputs=2, outputs=1, inplace=[(1, 0)], side_effects=True,
             shape=lambda op, s, t: [((1,), INT64)])
def atomic_iter(ctx: OpContext) -> Outputs:
    """[mutex, iter] -> iter + 1, incremented under the mutex's lock.

    When the op is in place (the usual case) the counter array is bumped in place under the
    lock, so concurrent AtomicIters on one counter never lose an increment.
    """
    mutex, value = ctx.inputs
    if not isinstance(mutex, Mutex):
        raise ctx.fail(f"input 0 must be a mutex made by CreateMutex, got {type(mutex).__name__}")
    counter = _counter(ctx, value)
    with mutex.lock:
        # Caffe2's exported stat atomic_iter/stats/<iter blob>/num_iter counts the runs
        GLOBAL_REGISTRY.increment(f"atomic_iter/stats/{ctx.input_name(1)}/num_iter".encode(), 1)
        if ctx.input_name(1) == ctx.output_name(0) and counter.dtype == np.int64:
            counter += 1
            return (counter,)
        return ((counter + 1).astype(np.int64),)


# --- weighted sums ---------------------------------------------------------------------------
@register_op("WeightedSum", inputs=(2, None), outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def weighted_sum(ctx: OpContext) -> Outputs:
    """[X0, w0, X1, w1, ...] -> Σ wᵢ·Xᵢ (each wᵢ has one element; output may be X0)."""
    if len(ctx.inputs) % 2:
        raise ctx.fail("inputs must come in (X, weight) pairs")
    x0, xs = ctx.inputs[0], ctx.inputs[::2]
    for x, w in zip(xs, ctx.inputs[1::2]):
        if x.shape != x0.shape:
            raise ctx.fail(f"all X must have the shape of X0 {x0.shape}, got {x.shape}")
        if w.size != 1:
            raise ctx.fail(f"weights must have one element, got shape {w.shape}")
    weights = [ctx.xp.asarray(w, dtype=x0.dtype).reshape(()) for w in ctx.inputs[1::2]]
    if same_float_arrays(*xs) and reads_apart(inplace_target(ctx, 0, 0), xs[1:]):
        # in place into X0 when the op is (SGD's param update); X1... are read after
        out = np.multiply(x0, weights[0], out=out_buffer(ctx, 0, 0))
        scratch = None
        for x, w in zip(xs[1:], weights[1:]):
            scratch = np.multiply(x, w, out=scratch)
            np.add(out, scratch, out=out)
        return (out,)
    total = None
    for x, w in zip(xs, weights):
        term = x * w
        total = term if total is None else total + term
    return (ctx.xp.asarray(total, dtype=x0.dtype),)


@register_gradient("WeightedSum")
def _weighted_sum_grad(g: GradientBuilder) -> None:
    inputs, outputs = [g.GO(0)], []
    for i in range(0, len(g.op.input), 2):
        inputs += [g.I(i), g.I(i + 1)]
        outputs.append(g.GI(i))
    if g.arg("grad_on_w", 0):
        outputs += [g.GI(i + 1) for i in range(0, len(g.op.input), 2)]
    g.add("WeightedSumGradient", inputs, outputs)


@register_op("WeightedSumGradient", inputs=(3, None), outputs=(1, None))
def weighted_sum_gradient(ctx: OpContext) -> Outputs:
    """[dY, X0, w0, X1, w1, ...] -> [dX0, dX1, ...(, dw0, dw1, ... with grad_on_w)]."""
    dy, pairs = ctx.inputs[0], ctx.inputs[1:]
    xs, ws = pairs[::2], pairs[1::2]
    dxs = [(dy * ctx.xp.asarray(w, dtype=dy.dtype).reshape(())).astype(dy.dtype) for w in ws]
    if ctx.num_outputs == len(xs):
        return dxs
    dws = [ctx.xp.asarray((dy * x).sum(), dtype=dy.dtype).reshape(w.shape)
           for x, w in zip(xs, ws)]
    return [*dxs, *dws]


@register_op("ScatterWeightedSum", inputs=(5, None), outputs=1, inplace=[(0, 0)],
             shape=like_inputs(0))
def scatter_weighted_sum(ctx: OpContext) -> Outputs:
    """[X0, w0, indices, slices1, w1, ...] -> X0 with X0[idx] = w0·X0[idx] + Σ wᵢ·slicesᵢ.

    Repeated indices scale their row once per occurrence and add every slice (as Caffe2).
    """
    x0, w0, indices = ctx.inputs[0], scalar_value(ctx.inputs[1]), ctx.inputs[2]
    if (len(ctx.inputs) - 3) % 2:
        raise ctx.fail("inputs after the indices must come in (slices, weight) pairs")
    idx = check_indices(ctx, indices, x0.shape[0])
    update = None
    for slices, w in zip(ctx.inputs[3::2], ctx.inputs[4::2]):
        term = check_rows(ctx, x0, idx, slices, "slices") * np.asarray(w, x0.dtype).reshape(())
        update = term if update is None else update + term
    out = writable(ctx, x0, 0, 0)
    if idx.size == 0:
        return (out,)
    # Caffe2 first scales every listed row by w0 (a row listed k times gets w0**k), then
    # adds every weighted slice.
    if w0 != 1.0:
        np.multiply.at(out, idx, np.asarray(w0, x0.dtype))
    if update is not None:
        np.add.at(out, idx, update.astype(x0.dtype))
    return (out,)


# --- momentum SGD ----------------------------------------------------------------------------
def check_same_shape(ctx: OpContext, *indices: int) -> None:
    """Raise a ShapeError naming the blobs unless inputs ``indices`` all have one shape
    (a dense update would otherwise broadcast silently or fail inside numpy)."""
    shapes = [np.shape(ctx.inputs[i]) for i in indices]
    if any(shape != shapes[0] for shape in shapes[1:]):
        listed = ", ".join(f"{ctx.input_name(i)!r} {shape}" for i, shape in zip(indices, shapes))
        raise ctx.fail(f"inputs {listed} must all have the same shape; the gradient and the "
                       f"optimizer state must match the parameter (re-create the state blobs "
                       f"with the parameter's shape)")


def _momentum_step(g: Any, m: Any, lr: float, mom: float, nesterov: bool) -> tuple[Any, Any]:
    """(adjusted grad, new momentum) of one momentum SGD step, as new arrays."""
    new_m = mom * m + lr * g
    if nesterov:
        adjusted = (1 + mom) * new_m - mom * m
        return adjusted.astype(g.dtype, copy=False), new_m.astype(m.dtype, copy=False)
    return new_m.astype(g.dtype, copy=False), new_m.astype(m.dtype, copy=True)


def _momentum_into(ctx: OpContext, lr: float, mom: float, nesterov: bool) -> tuple[Any, Any]:
    """One momentum SGD step written into (adjusted grad, moment) buffers, in place where
    the op is (grad and moment blobs in = out), as Caffe2's kernel updates them.  The same
    float operations in the same order as :func:`_momentum_step`, so the same values."""
    g, m = ctx.inputs[0], ctx.inputs[1]
    out_g, out_m = out_buffer(ctx, 0, 0), out_buffer(ctx, 1, 1)
    mom_m = np.multiply(m, mom, out=None if nesterov else out_m)
    np.multiply(g, lr, out=out_g)
    np.add(mom_m, out_g, out=out_g)          # new moment = mom * m + lr * g
    np.copyto(out_m, out_g)
    if nesterov:                              # adjusted = (1 + mom) * new_m - mom * m
        np.multiply(out_g, 1 + mom, out=out_g)
        np.subtract(out_g, mom_m, out=out_g)
    return out_g, out_m


def _momentum_args(ctx: OpContext) -> tuple[float, bool]:
    return ctx.float_arg("momentum", 0.0), bool(ctx.int_arg("nesterov", 0))


@register_op("MomentumSGD", inputs=3, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def momentum_sgd(ctx: OpContext) -> Outputs:
    """[grad, moment, lr] -> [adjusted grad, moment]."""
    check_same_shape(ctx, 0, 1)
    g, m, lr = ctx.inputs
    if same_float_arrays(g, m) and reads_apart(g, [m]):
        return _momentum_into(ctx, scalar_value(lr), *_momentum_args(ctx))
    return _momentum_step(g, m, scalar_value(lr), *_momentum_args(ctx))


def _owned_float_arrays(g: Any, m: Any, p: Any) -> bool:
    """Three distinct writable numpy arrays of one float dtype and shape, each owning its
    memory (so no two of them overlap and none is a view of another blob)."""
    if type(g) is not np.ndarray or type(m) is not np.ndarray or type(p) is not np.ndarray \
            or g is m or g is p or m is p:
        return False
    dtype = g.dtype
    if dtype.kind != "f" or m.dtype != dtype or p.dtype != dtype or \
            g.shape != m.shape or g.shape != p.shape:
        return False
    fg, fm, fp = g.flags, m.flags, p.flags
    return fg.owndata and fm.owndata and fp.owndata and fg.writeable and fm.writeable and \
        fp.writeable


_UPDATE_PLAN = "\0momentum_update_plan"


def _momentum_update_plan(ctx: OpContext) -> tuple[float, bool]:
    """(momentum, whether the plain in-place update applies): not nesterov, and grad,
    moment and param written in place (input names = output names), Caffe2's usual form.
    Derived once per op instance and kept in its decoded arguments."""
    plan = ctx.args.get(_UPDATE_PLAN)
    if plan is None:
        mom, nesterov = _momentum_args(ctx)
        names_in, names_out = ctx.op.input, ctx.op.output
        inplace = names_in[0] == names_out[0] and names_in[1] == names_out[1] and \
            names_in[3] == names_out[2]
        plan = ctx.args[_UPDATE_PLAN] = (mom, not nesterov and inplace)
    return plan


@register_op("MomentumSGDUpdate", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)],
             shape=like_inputs(0, 1, 3))
def momentum_sgd_update(ctx: OpContext) -> Outputs:
    """[grad, moment, lr, param] -> [adjusted grad, moment, param - adjusted grad]; grad,
    moment and param are updated in place when the op names them as its outputs."""
    g, m, lr, p = ctx.inputs
    mom, plain = _momentum_update_plan(ctx)
    if plain and _owned_float_arrays(g, m, p):
        # Caffe2's in-place update, written into the three blobs with no temporary: the
        # float operations of _momentum_step in the same order, so the same values
        rate = scalar_value(lr)
        np.multiply(m, mom, out=m)
        np.multiply(g, rate, out=g)
        np.add(m, g, out=g)                   # new moment = mom * m + lr * g
        np.copyto(m, g)
        np.subtract(p, g, out=p)
        return g, m, p
    check_same_shape(ctx, 0, 1, 3)
    if same_float_arrays(g, m, p) and reads_apart(g, [m, p]) and reads_apart(m, [p]):
        adjusted, new_m = _momentum_into(ctx, scalar_value(lr), *_momentum_args(ctx))
        return adjusted, new_m, np.subtract(p, adjusted, out=out_buffer(ctx, 3, 2))
    adjusted, new_m = _momentum_step(g, m, scalar_value(lr), *_momentum_args(ctx))
    return adjusted, new_m, (p - adjusted).astype(p.dtype, copy=False)


def _decayed_momentum_update(ctx: OpContext) -> Outputs:
    """[grad, moment, lr, param] -> [adjusted grad, moment, param] with weight decay.

    The gradient becomes ``grad + weight_decay·param``; the math runs in float32 and each
    output keeps its input's dtype (float16 for FP16MomentumSGDUpdate).
    """
    check_same_shape(ctx, 0, 1, 3)
    g, m, lr, p = ctx.inputs
    wd = ctx.float_arg("weight_decay", 0.0)
    g32, m32, p32 = (v.astype(np.float32) for v in (g, m, p))
    adjusted, new_m = _momentum_step(g32 + wd * p32, m32, scalar_value(lr), *_momentum_args(ctx))
    return adjusted.astype(g.dtype), new_m.astype(m.dtype), (p32 - adjusted).astype(p.dtype)


for _type in ("FP16MomentumSGDUpdate", "FP32MomentumSGDUpdate"):
    register_op(_type, inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)],
                shape=like_inputs(0, 1, 3))(_decayed_momentum_update)


@register_op("SparseMomentumSGDUpdate", inputs=5, outputs=3,
             inplace=[(0, 0), (1, 1), (3, 2)], shape=like_inputs(0, 1, 3))
def sparse_momentum_sgd_update(ctx: OpContext) -> Outputs:
    """[grad, moment, lr, param, indices] -> [adjusted grad, moment, param] on the rows."""
    g, m, lr, p, indices = ctx.inputs
    idx = check_indices(ctx, indices, p.shape[0])
    grad = check_rows(ctx, p, idx, g)
    mom, nesterov = _momentum_args(ctx)
    new_m, new_p = writable(ctx, m, 1, 1), writable(ctx, p, 3, 2)
    adjusted = np.empty_like(grad)
    for layer in occurrence_layers(idx):
        rows = idx[layer]
        adjusted[layer], new_m[rows] = _momentum_step(grad[layer], new_m[rows], scalar_value(lr),
                                                      mom, nesterov)
        new_p[rows] -= adjusted[layer]
    return adjusted.reshape(np.shape(g)), new_m, new_p


# --- float16 conversions ---------------------------------------------------------------------
@register_op("FloatToHalf", inputs=1, outputs=1, shape=same_as_input(0, FLOAT16))
def float_to_half(ctx: OpContext) -> Outputs:
    """float32 -> float16."""
    return (ctx.xp.asarray(ctx.inputs[0]).astype(np.float16),)


@register_gradient("FloatToHalf")
def _float_to_half_grad(g: GradientBuilder) -> None:
    g.add("HalfToFloat", [g.GO(0)], [g.GI(0)])


@register_op("HalfToFloat", inputs=1, outputs=1, shape=same_as_input(0, FLOAT))
def half_to_float(ctx: OpContext) -> Outputs:
    """float16 -> float32."""
    return (ctx.xp.asarray(ctx.inputs[0]).astype(np.float32),)


@register_gradient("HalfToFloat")
def _half_to_float_grad(g: GradientBuilder) -> None:
    g.add("FloatToHalf", [g.GO(0)], [g.GI(0)])


# --- adaptive optimizers ---------------------------------------------------------------------
def _rows_of(ctx: OpContext, param: Any, indices: Any, grad: Any) -> tuple[Any, Any]:
    """(checked flat indices, grad as rows of param)."""
    idx = check_indices(ctx, indices, param.shape[0])
    return idx, check_rows(ctx, param, idx, grad)


def _f32(x: Any, like: Any) -> Any:
    return x.astype(like.dtype, copy=False) if hasattr(x, "astype") else np.asarray(x, like.dtype)


@register_op("Adagrad", inputs=4, outputs=(2, 4), inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def adagrad(ctx: OpContext) -> Outputs:
    """[param, moment, grad, lr] -> [param, moment(, effective_lr, update)].

    g' = g + weight_decay·w, h' = decay·h + g'², w' = w + lr·g' / (sqrt(h') + epsilon).
    """
    check_same_shape(ctx, 0, 1, 2)
    w, h, g, lr = ctx.inputs
    eps, decay = ctx.float_arg("epsilon", 1e-5), ctx.float_arg("decay", 1.0)
    g = g + ctx.float_arg("weight_decay", 0.0) * w
    new_h = _f32(decay * h + g * g, h)
    effective = scalar_value(lr) / (np.sqrt(new_h) + eps)
    update = _f32(effective * g, w)
    outs = [_f32(w + update, w), new_h, _f32(effective, w), update]
    return outs[:ctx.num_outputs]


def _row_weight_decay(ctx: OpContext, idx: Any, rows: Any) -> Any:
    """Per indexed position, the weight decay shaped to broadcast over a row:
    ``weight_decay``, scaled by ``counter_halflife / count[row]`` where the optional
    ``count`` input (6th) is positive and ``counter_halflife`` > 0."""
    wd = ctx.float_arg("weight_decay", 0.0)
    per_row = np.full(idx.size, wd, dtype=np.float64)
    halflife = ctx.float_arg("counter_halflife", -1.0)
    if len(ctx.inputs) > 5 and halflife > 0 and idx.size:
        count = np.asarray(host(ctx.inputs[5]), dtype=np.float64).reshape(-1)
        if count.size != ctx.inputs[0].shape[0]:
            raise ctx.fail(f"count must hold one entry per row ({ctx.inputs[0].shape[0]}), "
                           f"got {count.size}")
        seen = count[idx]
        scaled = np.divide(wd * halflife, seen, out=per_row.copy(), where=seen > 0)
        per_row = np.where(seen > 0, scaled, per_row)
    return per_row.reshape((-1,) + (1,) * (np.ndim(rows) - 1))


@register_op("SparseAdagrad", inputs=(5, 6), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def sparse_adagrad(ctx: OpContext) -> Outputs:
    """[param, moment, indices, grad, lr(, count)] -> [param, moment], rows only (no
    decay); g' = g + weight_decay·w per indexed row (see :func:`_row_weight_decay`)."""
    w, h, indices, g, lr = ctx.inputs[:5]
    idx, rows = _rows_of(ctx, w, indices, g)
    eps, rate = ctx.float_arg("epsilon", 1e-5), scalar_value(lr)
    new_w, new_h = writable(ctx, w, 0, 0), writable(ctx, h, 1, 1)
    wd = _row_weight_decay(ctx, idx, rows)
    for layer in occurrence_layers(idx):
        r = idx[layer]
        gi = rows[layer] + wd[layer] * new_w[r]
        hi = _f32(new_h[r] + gi * gi, h)
        new_h[r] = hi
        new_w[r] += _f32(rate * gi / (np.sqrt(hi) + eps), w)
    return new_w, new_h


@register_op("RowWiseSparseAdagrad", inputs=(5, 6), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def row_wise_sparse_adagrad(ctx: OpContext) -> Outputs:
    """[param, moment (one per row), indices, grad, lr(, count)] -> [param, moment].

    g'_r = g_r + wd·w_r (see :func:`_row_weight_decay`), h[r] += mean(g'_r²),
    w[r] += lr·g'_r / (sqrt(h[r]) + epsilon).
    """
    w, h, indices, g, lr = ctx.inputs[:5]
    idx, rows = _rows_of(ctx, w, indices, g)
    if np.shape(h)[:1] != w.shape[:1]:
        raise ctx.fail(f"moment must have one entry per row ({w.shape[0]}), got {np.shape(h)}")
    eps, rate = ctx.float_arg("epsilon", 1e-5), scalar_value(lr)
    new_w, new_h = writable(ctx, w, 0, 0), writable(ctx, h, 1, 1)
    wd = _row_weight_decay(ctx, idx, rows)
    for layer in occurrence_layers(idx):
        r = idx[layer]
        gi = rows[layer] + wd[layer] * new_w[r]
        flat = gi.reshape(gi.shape[0], -1)
        hi = _f32(new_h[r] + (flat ** 2).mean(axis=1), h)
        new_h[r] = hi
        step = (rate / (np.sqrt(hi) + eps)).reshape((-1,) + (1,) * (rows.ndim - 1))
        new_w[r] += _f32(gi * step, w)
    return new_w, new_h


def _adam_args(ctx: OpContext, iteration: Any) -> tuple[float, float, float, float]:
    """(beta1, beta2, epsilon, bias correction) with t = iter."""
    beta1, beta2 = ctx.float_arg("beta1", 0.9), ctx.float_arg("beta2", 0.999)
    t = int(scalar_value(iteration)) + 1
    correction = np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return beta1, beta2, ctx.float_arg("epsilon", 1e-5), float(correction)


def _radam_step(ctx: OpContext, iteration: Any) -> tuple[bool, float]:
    """RAdam at t = iter + 1: ``(True, r)`` when rho_t >= 5 (step r·c·m'/(sqrt(v')+eps)),
    else ``(False, 1/(1-beta1^t))`` (step m'/(1-beta1^t))."""
    beta1, beta2 = ctx.float_arg("beta1", 0.9), ctx.float_arg("beta2", 0.999)
    t = int(scalar_value(iteration)) + 1
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * t * beta2 ** t / (1.0 - beta2 ** t)
    if rho_t >= 5.0:
        r = np.sqrt((rho_t - 4) * (rho_t - 2) / rho_t) * np.sqrt(
            rho_inf / ((rho_inf - 4) * (rho_inf - 2)))
        return True, float(r)
    return False, 1.0 / (1.0 - beta1 ** t)


@register_op("Adam", inputs=6, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def adam(ctx: OpContext) -> Outputs:
    """[param, m1, m2, grad, lr, iter] -> [param, m1, m2(, effective grad)]."""
    check_same_shape(ctx, 0, 1, 2, 3)
    w, m1, m2, g, lr, iteration = ctx.inputs
    beta1, beta2, eps, corr = _adam_args(ctx, iteration)
    new_m1 = _f32(m1 * beta1 + g * (1 - beta1), m1)
    new_m2 = _f32(m2 * beta2 + g * g * (1 - beta2), m2)
    step = corr * new_m1 / (np.sqrt(new_m2) + eps)
    outs = [_f32(w + scalar_value(lr) * step, w), new_m1, new_m2, _f32(step, w)]
    return outs[:ctx.num_outputs]


@register_op("SparseAdam", inputs=7, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def sparse_adam(ctx: OpContext) -> Outputs:
    """[param, m1, m2, indices, grad, lr, iter] -> [param, m1, m2], rows only.

    With ``enableRAdam`` the step is rectified (:func:`_radam_step`)."""
    w, m1, m2, indices, g, lr, iteration = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    beta1, beta2, eps, corr = _adam_args(ctx, iteration)
    radam = _radam_step(ctx, iteration) if ctx.int_arg("enableRAdam", 0) else None
    new_w, new_m1, new_m2 = (writable(ctx, v, i, i) for i, v in enumerate((w, m1, m2)))
    steps = np.zeros_like(rows)
    for layer in occurrence_layers(idx):
        r, gi = idx[layer], rows[layer]
        mi = _f32(new_m1[r] * beta1 + gi * (1 - beta1), m1)
        vi = _f32(new_m2[r] * beta2 + gi * gi * (1 - beta2), m2)
        new_m1[r], new_m2[r] = mi, vi
        if radam is None:
            steps[layer] = corr * mi / (np.sqrt(vi) + eps)
        elif radam[0]:
            steps[layer] = radam[1] * corr * mi / (np.sqrt(vi) + eps)
        else:
            steps[layer] = radam[1] * mi
        new_w[r] += _f32(scalar_value(lr) * steps[layer], w)
    return [new_w, new_m1, new_m2, steps][:ctx.num_outputs]


@register_op("RowWiseSparseAdam", inputs=7, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def row_wise_sparse_adam(ctx: OpContext) -> Outputs:
    """[param, m1, m2 (one per row), indices, grad, lr, iter] -> [param, m1, m2]."""
    w, m1, m2, indices, g, lr, iteration = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    beta1, beta2, eps, corr = _adam_args(ctx, iteration)
    new_w, new_m1, new_m2 = (writable(ctx, v, i, i) for i, v in enumerate((w, m1, m2)))
    flat = rows.reshape(idx.size, int(np.prod(rows.shape[1:], dtype=np.int64)))
    steps = np.zeros_like(rows)
    for layer in occurrence_layers(idx):
        r, gi = idx[layer], rows[layer]
        mi = _f32(new_m1[r] * beta1 + gi * (1 - beta1), m1)
        vi = _f32(new_m2[r] * beta2 + (flat[layer] ** 2).mean(axis=1) * (1 - beta2), m2)
        new_m1[r], new_m2[r] = mi, vi
        steps[layer] = corr * mi / (np.sqrt(vi).reshape((-1,) + (1,) * (rows.ndim - 1)) + eps)
        new_w[r] += _f32(scalar_value(lr) * steps[layer], w)
    return [new_w, new_m1, new_m2, steps][:ctx.num_outputs]


def _adadelta_args(ctx: OpContext) -> None:
    """Caffe2's checks: 0 < decay < 1 and epsilon >= 0."""
    eps, decay = ctx.float_arg("epsilon", 1e-5), ctx.float_arg("decay", 0.95)
    if not 0.0 < decay < 1.0:
        raise ctx.fail(f"decay must be in (0, 1), got {decay}")
    if eps < 0.0:
        raise ctx.fail(f"epsilon must be >= 0, got {eps}")


def _adadelta_step(w: Any, h: Any, d: Any, g: Any, ctx: OpContext, lr: float) -> tuple:
    eps, decay = ctx.float_arg("epsilon", 1e-5), ctx.float_arg("decay", 0.95)
    new_h = _f32(decay * h + (1 - decay) * g * g, h)
    ng = np.sqrt(d + eps) / np.sqrt(new_h + eps) * g
    return _f32(w + lr * ng, w), new_h, _f32(decay * d + (1 - decay) * ng * ng, d)


@register_op("Adadelta", inputs=5, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def adadelta(ctx: OpContext) -> Outputs:
    """[param, moment, moment_delta, grad, lr] -> [param, moment, moment_delta]."""
    check_same_shape(ctx, 0, 1, 2, 3)
    _adadelta_args(ctx)
    w, h, d, g, lr = ctx.inputs
    return _adadelta_step(w, h, d, g, ctx, scalar_value(lr))


@register_op("SparseAdadelta", inputs=6, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def sparse_adadelta(ctx: OpContext) -> Outputs:
    """[param, moment, moment_delta, indices, grad, lr] -> the same three, rows only."""
    _adadelta_args(ctx)
    w, h, d, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    new = [writable(ctx, v, i, i) for i, v in enumerate((w, h, d))]
    for layer in occurrence_layers(idx):
        r = idx[layer]
        new[0][r], new[1][r], new[2][r] = _adadelta_step(
            new[0][r], new[1][r], new[2][r], rows[layer], ctx, scalar_value(lr))
    return new


@register_op("Wngrad", inputs=4, outputs=(2, 4), inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def wngrad(ctx: OpContext) -> Outputs:
    """[param, seq_b, grad, lr] -> [param, seq_b(, effective_lr, update)].

    w' = w + lr·g / (b + epsilon), b' = b + Σg² / (b + epsilon).
    """
    check_same_shape(ctx, 0, 2)
    w, b, g, lr = ctx.inputs
    eps, b0 = ctx.float_arg("epsilon", 1e-5), scalar_value(b)
    effective = scalar_value(lr) / (b0 + eps)
    update = _f32(effective * g, w)
    new_b = _f32(np.reshape(b0 + float((g.astype(np.float64) ** 2).sum()) / (b0 + eps),
                            np.shape(b)), b)
    outs = [_f32(w + update, w), new_b, _f32(np.reshape(effective, np.shape(b)), b), update]
    return outs[:ctx.num_outputs]


@register_op("SparseWngrad", inputs=5, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def sparse_wngrad(ctx: OpContext) -> Outputs:
    """[param, seq_b, indices, grad, lr] -> [param, seq_b]; seq_b is one global scalar.

    w[r] += lr·g_r / (b + epsilon), b' = b + Σg² / b (no epsilon there, as Caffe2)."""
    w, b, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    eps, b0 = ctx.float_arg("epsilon", 1e-5), scalar_value(b)
    new_w = writable(ctx, w, 0, 0)
    if idx.size:
        np.add.at(new_w, idx, _f32(scalar_value(lr) * rows / (b0 + eps), w))
    new_b = b0 + float((rows.astype(np.float64) ** 2).sum()) / b0
    return new_w, _f32(np.full(np.shape(b), new_b), b)


@register_op("RmsProp", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=like_inputs(0, 1, 2))
def rms_prop(ctx: OpContext) -> Outputs:
    """[grad, mean_squares, mom, lr] -> [grad', mean_squares', mom'] (grad' = mom')."""
    check_same_shape(ctx, 0, 1, 2)
    g, ms, mom, lr = ctx.inputs
    decay, momentum = ctx.float_arg("decay", 0.9), ctx.float_arg("momentum", 0.0)
    eps = ctx.float_arg("epsilon", 1e-5)
    new_ms = _f32(ms + (1 - decay) * (g * g - ms), ms)
    new_mom = _f32(mom * momentum + scalar_value(lr) * g / np.sqrt(eps + new_ms), mom)
    return new_mom.astype(g.dtype, copy=True), new_ms, new_mom  # two blobs, two arrays


def _ftrl_step(ctx: OpContext, w: Any, n: Any, z: Any, g: Any, alpha: float) -> tuple:
    """(new w, new n, new z) of one FTRL-proximal step."""
    beta = ctx.float_arg("beta", 1.0)
    l1, l2 = ctx.float_arg("lambda1", 0.001), ctx.float_arg("lambda2", 0.001)
    new_n = n + g * g
    new_z = z + g - (np.sqrt(new_n) - np.sqrt(n)) / alpha * w
    shrink = (l1 * np.sign(new_z) - new_z) / ((beta + np.sqrt(new_n)) / alpha + l2)
    return np.where(np.abs(new_z) > l1, shrink, 0), new_n, new_z


def _ftrl_alpha(ctx: OpContext, index: int) -> float:
    if len(ctx.inputs) > index:
        return scalar_value(ctx.inputs[index])
    return ctx.float_arg("alpha", 0.005)


@register_op("Ftrl", inputs=(3, 4), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def ftrl(ctx: OpContext) -> Outputs:
    """[var, n_z (var.shape + [2]), grad(, alpha)] -> [var, n_z] (FTRL-proximal)."""
    w, nz, g = ctx.inputs[:3]
    pairs = nz.reshape(-1, 2)
    new_w, new_n, new_z = _ftrl_step(ctx, w, pairs[:, 0].reshape(w.shape),
                                     pairs[:, 1].reshape(w.shape), g, _ftrl_alpha(ctx, 3))
    new_nz = np.stack([new_n, new_z], axis=-1).reshape(nz.shape)
    return _f32(new_w, w), _f32(new_nz, nz)


@register_op("SparseFtrl", inputs=(4, 5), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=like_inputs(0, 1))
def sparse_ftrl(ctx: OpContext) -> Outputs:
    """[var, n_z, indices, grad(, alpha)] -> [var, n_z], rows only."""
    w, nz, indices, g = ctx.inputs[:4]
    idx, rows = _rows_of(ctx, w, indices, g)
    if nz.size != 2 * w.size:
        raise ctx.fail(f"n_z must hold 2 values per element of var {w.shape}, got {nz.shape}")
    new_w, new_nz = writable(ctx, w, 0, 0), writable(ctx, nz, 1, 1)
    pairs = new_nz.reshape(w.shape[0], -1, 2)
    alpha = _ftrl_alpha(ctx, 4)
    for layer in occurrence_layers(idx):
        r = idx[layer]
        gi = rows[layer].reshape(r.size, -1)
        wi, ni, zi = _ftrl_step(ctx, new_w[r].reshape(r.size, -1), pairs[r, :, 0],
                                pairs[r, :, 1], gi, alpha)
        new_w[r] = _f32(wi, w).reshape(new_w[r].shape)
        pairs[r, :, 0], pairs[r, :, 1] = ni, zi
    return new_w, pairs.reshape(nz.shape)


# --- LARS and YellowFin ----------------------------------------------------------------------
@register_op("Lars", inputs=5, outputs=1, shape=lambda op, s, t: [((1,), FLOAT)])
def lars(ctx: OpContext) -> Outputs:
    """[X, dX, wd, trust, lr_max] -> [1] local lr: trust / (|dX|/|X| + wd + offset) (1 if
    |X| = 0), clipped to [lr_min, lr_max] (args offset=0.5, lr_min=0.02)."""
    x, dx, wd, trust, lr_max = ctx.inputs
    offset, lr_min = ctx.float_arg("offset", 0.5), ctx.float_arg("lr_min", 0.02)
    if dx.size != x.size:
        raise ctx.fail(f"gradient size {dx.size} doesn't match parameter size {x.size}")
    if offset < 0 or lr_min < 0:
        raise ctx.fail(f"offset ({offset}) and lr_min ({lr_min}) must be >= 0")
    x_norm = float(ctx.xp.sqrt(ctx.xp.sum(ctx.xp.square(x, dtype=np.float32))))
    value = 1.0
    if x_norm > 0:
        dx_norm = float(ctx.xp.sqrt(ctx.xp.sum(ctx.xp.square(dx, dtype=np.float32))))
        value = scalar_value(trust) / (dx_norm / x_norm + scalar_value(wd) + offset)
    value = max(min(value, scalar_value(lr_max)), lr_min)
    return (ctx.xp.asarray([value], dtype=np.float32),)


class _YellowFinState:
    """The scalar memory of one YellowFin op: [g_norm_avg, g_norm2_avg, g_norm2_min_avg,
    g_norm2_max_avg, distance_avg] (Caffe2's scalars_memory layout)."""

    def __init__(self, beta: float, debias: float, memory: Any) -> None:
        self.beta, self.debias = beta, debias
        self.memory = [float(v) for v in host(memory).reshape(-1)[:5]]

    def average(self, slot: int, value: float) -> tuple[float, float]:
        """Update moving average ``slot`` with ``value``: (new average, debiased)."""
        new = self.beta * self.memory[slot] + (1 - self.beta) * value
        self.memory[slot] = new
        return new, new * self.debias


def _yellowfin_lr_mu(g_norm2_min: float, g_norm2_max: float, distance: float,
                     variance: float) -> tuple[float, float]:
    """YellowFin's closed-form tuning: the momentum from the cubic root and curvature range,
    then lr = (1 - sqrt(mu))² / h_min (degenerate inputs give NaN, as in Caffe2)."""
    h_min = np.float64(g_norm2_min)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        curv_ratio = np.sqrt(np.float64(g_norm2_max) / h_min)
        mu_limit = (curv_ratio - 1.0) / (curv_ratio + 1.0)
        pre_p = np.float64(distance) * h_min
        p = pre_p * pre_p / (2.0 * np.float64(variance))
        w3 = (-np.sqrt(p * p + 4.0 / 27.0 * p * p * p) - p) / 2.0
        w = (1.0 if w3 > 0 else -1.0) * np.abs(w3) ** (1.0 / 3.0)
        root = w - p / 3.0 / w + 1.0
        mu = max(root * root, mu_limit * mu_limit)
        lr = (1.0 - np.sqrt(mu)) ** 2 / h_min
    return float(lr), float(mu)


@register_op("YellowFin", inputs=10, outputs=8,
             inplace=[(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7)],
             shape=like_inputs(0, 1, 2, 3, 4, 5, 6, 7))
def yellowfin(ctx: OpContext) -> Outputs:
    """[param, moment, lr, mu, curv_win, g_avg, g2_avg, scalars_memory, grad, iter] -> the
    first eight, updated: a momentum step with the current lr/mu, then Caffe2's YellowFin
    statistics (args beta=0.999, curv_win_width=20, epsilon=1e-6, nesterov=0,
    zero_debias=1); lr and mu are re-tuned from the second iteration on."""
    param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, memory, grad = ctx.inputs[:9]
    xp = ctx.xp
    it = int(scalar_value(ctx.inputs[9]))
    beta, eps = ctx.float_arg("beta", 0.999), ctx.float_arg("epsilon", 1e-6)
    width = ctx.int_arg("curv_win_width", 20)
    if lr_avg.size != 1 or mu_avg.size != 1 or memory.size < 5 or curv_win.size < width:
        raise ctx.fail("lr and mu need 1 element, scalars_memory 5 and curv_win "
                       f"curv_win_width={width}")
    for name, value in (("moment", moment), ("g_avg", g_avg), ("g2_avg", g2_avg),
                        ("grad", grad)):
        if value.shape != param.shape:
            raise ctx.fail(f"{name} {value.shape} must have the shape of param {param.shape}")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        debias = (1.0 / (1.0 - np.float64(beta) ** it)) if ctx.arg("zero_debias", 1) else 1.0
    lr, mu = scalar_value(lr_avg), scalar_value(mu_avg)
    dtype = param.dtype.type
    new_moment = dtype(mu) * moment + dtype(lr) * grad
    if ctx.int_arg("nesterov", 0):
        new_param = param - dtype(1 + mu) * new_moment + dtype(mu) * moment
    else:
        new_param = param - new_moment
    b = dtype(beta)
    new_g_avg = b * g_avg + (1 - b) * grad
    new_g2_avg = b * g2_avg + (1 - b) * grad * grad
    g_deb = new_g_avg * dtype(debias)
    state = _YellowFinState(beta, float(debias), memory)
    g_norm2 = max(eps, float(xp.sum(xp.square(grad, dtype=np.float32))))
    g_norm2_deb = state.average(1, g_norm2)[1]
    state.average(0, math.sqrt(g_norm2))
    window = host(curv_win).astype(np.float32, copy=True).reshape(-1)
    window[(it - 1) % width] = math.log(g_norm2)
    valid = window[:max(1, min(width, it))]
    h_min = max(eps, math.exp(state.average(2, float(valid.min()))[1]))
    h_max = max(eps, math.exp(state.average(3, float(valid.max()))[1]))
    variance = max(eps, g_norm2_deb - float(xp.sum(xp.square(g_deb, dtype=np.float32))))
    distance_deb = state.average(4, state.memory[0] / state.memory[1])[1]
    if it > 1:
        new_lr, new_mu = _yellowfin_lr_mu(h_min, h_max, distance_deb, variance)
        mu = beta * mu + (1 - beta) * new_mu
        lr = beta * lr + (1 - beta) * new_lr
    return (new_param.astype(param.dtype, copy=False), new_moment.astype(param.dtype, copy=False),
            xp.full(lr_avg.shape, lr, dtype=lr_avg.dtype),
            xp.full(mu_avg.shape, mu, dtype=mu_avg.dtype),
            xp.asarray(window.reshape(curv_win.shape), dtype=curv_win.dtype),
            new_g_avg.astype(g_avg.dtype, copy=False), new_g2_avg.astype(g2_avg.dtype, copy=False),
            _memory_out(xp, memory, state.memory))


def _memory_out(xp: Any, memory: Any, values: list[float]) -> Any:
    """scalars_memory with its first five slots replaced by ``values``."""
    out = host(memory).copy().reshape(-1)
    out[:5] = values
    return xp.asarray(out.reshape(memory.shape))
