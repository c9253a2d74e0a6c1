"""Optimizer operators: iteration counters, learning rates and parameter updates.

The ops the optimizer builders emit keep Caffe2's exact input/output order and argument names.
Updates are in place in Caffe2 (outputs alias inputs); dense kernels return new arrays, while
sparse updates of big tables write the rows in place when the op is in place (all checks run
before anything is written, so a failing op changes nothing).  Sparse updates with repeated
indices apply the rows one after the other, as Caffe2 does.  No optimizer op has a gradient.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

FLOAT, INT64, FLOAT16 = 1, 10, 12  # caffe2 TensorProto data types


def _like_inputs(*pairs: int) -> Callable[..., list]:
    """Shape function: output k has the shape and type of input ``pairs[k]``."""

    def shape_fn(op: Any, shapes: list, types: list) -> list:
        return [None if shapes[i] is None else (tuple(shapes[i]), types[i] or FLOAT)
                for i in pairs]

    return shape_fn


def host(x: Any) -> Any:
    """``x`` as a numpy array (copied off the GPU for CuPy arrays)."""
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


def _scalar(x: Any) -> float:
    """The single value of a 1-element blob (lr, weights); works for numpy and CuPy."""
    return float(x.reshape(-1)[0]) if hasattr(x, "reshape") else float(x)


# --- iteration counters and mutexes ----------------------------------------------------------
class Mutex:
    """The opaque blob ``CreateMutex`` makes; ``AtomicIter`` holds its lock."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()

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
        if ctx.input_name(1) == ctx.output_name(0) and counter.dtype == np.int64:
            counter += 1
            return (counter,)
        return ((counter + 1).astype(np.int64),)


# --- learning rate policies ------------------------------------------------------------------
Policy = Callable[[int], float]


def _policy(kind: str, get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    """The multiplier function of one policy; ``get(name, default)`` reads its arguments."""
    if kind == "fixed":
        return lambda it: 1.0
    if kind == "step":
        stepsize, gamma = int(get("stepsize", 0)), float(get("gamma", 0.0))
        if stepsize <= 0:
            raise ctx.fail("policy 'step' needs a positive 'stepsize' argument")
        return lambda it: gamma ** (it // stepsize)
    if kind == "multistep":
        steps = [int(s) for s in (get("stepsizes", []) or [])]
        gamma = float(get("gamma", 0.0))
        return lambda it: gamma ** sum(1 for s in steps if it >= s)
    if kind == "exp":
        gamma = float(get("gamma", 0.0))
        return lambda it: gamma ** it
    if kind == "inv":
        gamma, power = float(get("gamma", 0.0)), float(get("power", 0.0))
        return lambda it: (1 + gamma * it) ** (-power)
    if kind == "poly":
        power, max_iter = float(get("power", 0.0)), int(get("max_iter", -1))
        if max_iter <= 0:
            raise ctx.fail("policy 'poly' needs a positive 'max_iter' argument")
        # As Caffe2: past max_iter the base goes negative (NaN for fractional powers).
        return lambda it: float(np.power(np.float64(1 - it / max_iter), power))
    if kind == "linearWarmup":
        start, num = float(get("start_multiplier", 0.0)), int(get("num_iter", 0))
        return lambda it: 1.0 if it >= num else start + (1 - start) * it / num
    if kind == "constantWarmup":
        mult, num = float(get("multiplier", 0.5)), int(get("num_iter", 0))
        return lambda it: 1.0 if it >= num else mult
    return _policy_more(kind, get, ctx)


def _policy_more(kind: str, get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    if kind == "alter":
        first = bool(int(get("active_first", 1)))
        active, inactive = int(get("active_period", -1)), int(get("inactive_period", -1))
        if active < 0 or inactive < 0:
            raise ctx.fail("policy 'alter' needs 'active_period' and 'inactive_period' >= 0")

        def alter(it: int) -> float:
            in_first = it % (active + inactive) < (active if first else inactive)
            return float(in_first == first)

        return alter
    if kind == "hill":
        return _hill(get)
    if kind == "cyclical":
        return _cyclical(get, ctx)
    if kind == "composite":
        return _composite(get, ctx)
    return _policy_late(kind, get, ctx)


def _policy_late(kind: str, get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    """Policies of later Caffe2 releases: gate, pieceWarmup, cosine and the warmup composites."""
    if kind == "gate":
        m1, m2 = float(get("multiplier_1", 1.0)), float(get("multiplier_2", 1.0))
        num = int(get("num_iter", 0))
        return lambda it: m2 if it >= num else m1
    if kind == "pieceWarmup":
        m1, m2, m3 = (float(get(name, 0.5)) for name in ("m1", "m2", "m3"))
        n1, n2 = int(get("n1", 0)), int(get("n2", 0))
        return lambda it: m1 if it < n1 else (m2 if it < n2 else m3)
    if kind == "cosine":
        return _cosine(float(get("min_lr", 0.1)), float(get("max_lr", 0.5)),
                       int(get("period", 50)), float(get("t_mult", 1.0)),
                       float(get("lr_shrink", 0.99)), ctx)
    if kind in ("constantThenLinearWarmup", "compositeCyclical", "compositeCosine"):
        return _warmup_then(kind, get, ctx)
    raise ctx.fail(
        f"unknown learning rate policy {kind!r}; use one of fixed, step, multistep, exp, inv, "
        "poly, linearWarmup, constantWarmup, alter, hill, cyclical, composite, gate, "
        "pieceWarmup, cosine, constantThenLinearWarmup, compositeCyclical, compositeCosine")


def _cosine(min_lr: float, max_lr: float, period: int, t_mult: float, lr_shrink: float,
            ctx: OpContext) -> Policy:
    """SGDR: cosine from max_lr down to min_lr over periods growing by t_mult, both bounds
    shrinking by lr_shrink per period (Caffe2's CosineLearningRate)."""
    if period <= 0:
        raise ctx.fail(f"policy 'cosine' needs a positive 'period', got {period}")

    def cosine(it: int) -> float:
        if t_mult != 1.0:
            i = math.floor(math.log(1 - it / period * (1.0 - t_mult)) / math.log(t_mult))
            t_i = t_mult ** i * period
            t_curr = it - (1.0 - t_mult ** i) / (1.0 - t_mult) * period
        else:
            i = math.floor(it / period)
            t_i = period
            t_curr = it - t_i * i
        shrink = lr_shrink ** i
        low, high = min_lr * shrink, max_lr * shrink
        return low + 0.5 * (high - low) * (1 + math.cos(math.pi * t_curr / t_i))

    return cosine


def _warmup_then(kind: str, get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    """A constant then a linear warmup (start_warmup_multiplier, constant_warmup_num_iter,
    linear_warmup_num_iter), then 1 / a cyclical policy / a cosine policy."""
    start = float(get("start_warmup_multiplier", 0.1))
    n_const = int(get("constant_warmup_num_iter", 10000000))
    n_linear = int(get("linear_warmup_num_iter", 10000000))

    def warmup(it: int) -> float:
        if it < n_const:
            return start
        return start + (1.0 - start) * (it - n_const) / n_linear if it < n_const + n_linear \
            else 1.0

    if kind == "constantThenLinearWarmup":
        return warmup
    if kind == "compositeCyclical":
        base_lr = ctx.float_arg("base_lr")  # the op's own base_lr, as Caffe2
        after = _cycle(base_lr, float(get("cyclical_max_lr", 0.05)),
                       int(get("cyclical_step_size", 1000000)),
                       float(get("cyclical_decay", 1.0)), ctx)
    else:
        after = _cosine(float(get("cosine_min_lr", 0.1)), float(get("cosine_max_lr", 0.5)),
                        int(get("cosine_period", 50)), float(get("cosine_t_mult", 1.0)),
                        float(get("cosine_lr_shrink", 0.99)), ctx)
    total = n_const + n_linear
    return lambda it: warmup(it) if it < total else after(it - total)


def _hill(get: Callable[[str, Any], Any]) -> Policy:
    num = int(get("num_iter", 0))
    start = float(get("start_multiplier", 0.0))
    gamma, power = float(get("gamma", 0.0)), float(get("power", 0.0))
    end = float(get("end_multiplier", 0.0))

    def hill(it: int) -> float:
        if it < num:
            return start + (1 - start) * it / num
        return max(end, (1 + gamma * (it - num)) ** (-power))

    return hill


def _cyclical(get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    base_lr = float(get("base_lr", 0.0))
    max_lr, stepsize = float(get("max_lr", 0.005)), int(get("stepsize", 0))
    decay = float(get("decay", 1.0))
    return _cycle(base_lr, max_lr, stepsize, decay, ctx)


def _cycle(base_lr: float, max_lr: float, stepsize: int, decay: float,
           ctx: OpContext) -> Policy:
    """Caffe2's CyclicalLearningRate multiplier (triangle between base_lr and max_lr)."""
    if stepsize <= 0 or base_lr == 0:
        raise ctx.fail("policy 'cyclical' needs a positive 'stepsize' and a nonzero 'base_lr'")

    def cyclical(it: int) -> float:
        cycle = it // (2 * stepsize) + 1
        x = abs(it / stepsize - 2 * cycle + 1)
        return 1 + (abs(max_lr) / abs(base_lr) - 1) * max(0.0, 1 - x) * decay ** (
            it // (2 * stepsize))

    return cyclical


def _composite(get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    """Sub-policies ``sub_policy_{i}_*`` running for ``sub_policy_num_iters[i]`` iterations."""
    num_iters = [int(n) for n in (get("sub_policy_num_iters", []) or [])]
    if not num_iters or any(n <= 0 for n in num_iters):
        raise ctx.fail("policy 'composite' needs positive 'sub_policy_num_iters'")
    starts, subs, scales = [], [], []
    begin = 1  # Caffe2 starts counting the first sub-policy at iteration 1
    for i, n in enumerate(num_iters):
        prefix = f"sub_policy_{i}_"

        def sub_get(name: str, default: Any, prefix: str = prefix) -> Any:
            return get(prefix + name, default)

        kind = str(sub_get("policy", ""))
        if kind == "composite":
            raise ctx.fail("a composite learning rate cannot nest another composite policy")
        starts.append(begin)
        subs.append(_policy(kind, sub_get, ctx))
        scales.append(float(sub_get("lr_scale", 1.0)))
        begin += n

    def composite(it: int) -> float:
        k = max(0, int(np.searchsorted(starts, it, side="right")) - 1)
        return subs[k](it) * scales[k]

    return composite


@register_op("LearningRate", inputs=1, outputs=1, shape=lambda op, s, t: [((), FLOAT)])
def learning_rate(ctx: OpContext) -> Outputs:
    """iter (int64) -> base_lr × policy multiplier(iter), a float32 0-d array (as Caffe2)."""
    if not ctx.has_arg("base_lr"):
        raise ctx.fail("argument 'base_lr' is required")
    it = int(_scalar(ctx.inputs[0]))
    kind = ctx.str_arg("policy", "fixed")
    policy = _policy(kind, ctx.arg, ctx)
    scale = 1.0 if kind == "composite" else ctx.float_arg("lr_scale", 1.0)
    with np.errstate(invalid="ignore"):
        value = ctx.float_arg("base_lr") * scale * policy(it)
    return (ctx.xp.asarray(np.float32(value)),)


# --- weighted sums ---------------------------------------------------------------------------
@register_op("WeightedSum", inputs=(2, None), outputs=1, inplace=[(0, 0)],
             shape=_like_inputs(0))
def weighted_sum(ctx: OpContext) -> Outputs:
    """[X0, w0, X1, w1, ...] -> Σ wᵢ·Xᵢ (each wᵢ has one element; output may be X0)."""
    if len(ctx.inputs) % 2:
        raise ctx.fail("inputs must come in (X, weight) pairs")
    x0 = ctx.inputs[0]
    out = None
    for x, w in zip(ctx.inputs[::2], ctx.inputs[1::2]):
        if x.shape != x0.shape:
            raise ctx.fail(f"all X must have the shape of X0 {x0.shape}, got {x.shape}")
        if w.size != 1:
            raise ctx.fail(f"weights must have one element, got shape {w.shape}")
        term = x * ctx.xp.asarray(w, dtype=x0.dtype).reshape(())
        out = term if out is None else out + term
    return (ctx.xp.asarray(out, dtype=x0.dtype),)


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


# --- sequential sparse row updates -----------------------------------------------------------
def occurrence_layers(indices: Any) -> list[Any]:
    """Split positions of ``indices`` into layers without repeats, preserving order.

    Layer k holds, for every distinct index, its k-th occurrence; applying the layers in turn
    reproduces Caffe2's one-row-after-the-other semantics with vectorised updates.
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.size == 0:
        return []
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.r_[0, np.flatnonzero(sorted_idx[1:] != sorted_idx[:-1]) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, idx.size]))
    rank = np.empty(idx.size, dtype=np.int64)
    rank[order] = np.arange(idx.size) - group_start
    if rank.max() == 0:
        return [np.arange(idx.size)]
    return [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]


def check_indices(ctx: OpContext, indices: Any, rows: int, what: str = "indices") -> Any:
    """``indices`` as a flat int64 array, each in [0, rows)."""
    idx = host(indices).reshape(-1).astype(np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= rows):
        raise ctx.fail(f"{what} must lie in [0, {rows}), got [{int(idx.min())}, "
                       f"{int(idx.max())}]")
    return idx


def writable(ctx: OpContext, value: Any, input_index: int, output_index: int) -> Any:
    """``value`` itself when the op writes it in place, else a copy to update."""
    if ctx.input_name(input_index) == ctx.output_name(output_index):
        return value
    return value.copy()


def check_rows(ctx: OpContext, table: Any, idx: Any, rows: Any, what: str = "grad") -> Any:
    """``rows`` reshaped to ``(len(idx),) + table.shape[1:]``, or a clear error."""
    block = tuple(table.shape[1:])
    expected = idx.size * int(np.prod(block, dtype=np.int64))
    if np.size(rows) != expected:
        raise ctx.fail(f"{what} has shape {np.shape(rows)}, expected {idx.size} rows of "
                       f"shape {block}")
    return np.asarray(rows).reshape((idx.size, *block))


@register_op("ScatterWeightedSum", inputs=(5, None), outputs=1, inplace=[(0, 0)],
             shape=_like_inputs(0))
def scatter_weighted_sum(ctx: OpContext) -> Outputs:
    """[X0, w0, indices, slices1, w1, ...] -> X0 with X0[idx] = w0·X0[idx] + Σ wᵢ·slicesᵢ.

    Repeated indices scale their row once per occurrence and add every slice (as Caffe2).
    """
    x0, w0, indices = ctx.inputs[0], _scalar(ctx.inputs[1]), ctx.inputs[2]
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
def _momentum_step(g: Any, m: Any, lr: float, mom: float, nesterov: bool) -> tuple[Any, Any]:
    """(adjusted grad, new momentum) of one momentum SGD step."""
    new_m = mom * m + lr * g
    if nesterov:
        return ((1 + mom) * new_m - mom * m).astype(g.dtype), new_m.astype(m.dtype)
    return new_m.astype(g.dtype), new_m.astype(m.dtype)


def _momentum_args(ctx: OpContext) -> tuple[float, bool]:
    return ctx.float_arg("momentum", 0.0), bool(ctx.int_arg("nesterov", 0))


@register_op("MomentumSGD", inputs=3, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def momentum_sgd(ctx: OpContext) -> Outputs:
    """[grad, moment, lr] -> [adjusted grad, moment]."""
    g, m, lr = ctx.inputs
    return _momentum_step(g, m, _scalar(lr), *_momentum_args(ctx))


@register_op("MomentumSGDUpdate", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)],
             shape=_like_inputs(0, 1, 3))
def momentum_sgd_update(ctx: OpContext) -> Outputs:
    """[grad, moment, lr, param] -> [adjusted grad, moment, param - adjusted grad]."""
    g, m, lr, p = ctx.inputs
    adjusted, new_m = _momentum_step(g, m, _scalar(lr), *_momentum_args(ctx))
    return adjusted, new_m, (p - adjusted).astype(p.dtype)


def _decayed_momentum_update(ctx: OpContext) -> Outputs:
    """[grad, moment, lr, param] -> [adjusted grad, moment, param] with weight decay.

    The gradient becomes ``grad + weight_decay·param``; the math runs in float32 and each
    output keeps its input's dtype (float16 for FP16MomentumSGDUpdate).
    """
    g, m, lr, p = ctx.inputs
    wd = ctx.float_arg("weight_decay", 0.0)
    g32, m32, p32 = (v.astype(np.float32) for v in (g, m, p))
    adjusted, new_m = _momentum_step(g32 + wd * p32, m32, _scalar(lr), *_momentum_args(ctx))
    return adjusted.astype(g.dtype), new_m.astype(m.dtype), (p32 - adjusted).astype(p.dtype)


for _type in ("FP16MomentumSGDUpdate", "FP32MomentumSGDUpdate"):
    register_op(_type, inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)],
                shape=_like_inputs(0, 1, 3))(_decayed_momentum_update)


@register_op("SparseMomentumSGDUpdate", inputs=5, outputs=3,
             inplace=[(0, 0), (1, 1), (3, 2)], shape=_like_inputs(0, 1, 3))
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
        adjusted[layer], new_m[rows] = _momentum_step(grad[layer], new_m[rows], _scalar(lr),
                                                      mom, nesterov)
        new_p[rows] -= adjusted[layer]
    return adjusted.reshape(np.shape(g)), new_m, new_p


# --- float16 conversions ---------------------------------------------------------------------
@register_op("FloatToHalf", inputs=1, outputs=1,
             shape=lambda op, s, t: [None if s[0] is None else (tuple(s[0]), FLOAT16)])
def float_to_half(ctx: OpContext) -> Outputs:
    """float32 -> float16."""
    return (ctx.xp.asarray(ctx.inputs[0]).astype(np.float16),)


@register_gradient("FloatToHalf")
def _float_to_half_grad(g: GradientBuilder) -> None:
    g.add("HalfToFloat", [g.GO(0)], [g.GI(0)])


@register_op("HalfToFloat", inputs=1, outputs=1,
             shape=lambda op, s, t: [None if s[0] is None else (tuple(s[0]), FLOAT)])
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
             shape=_like_inputs(0, 1))
def adagrad(ctx: OpContext) -> Outputs:
    """[param, moment, grad, lr] -> [param, moment(, effective_lr, update)].

    h' = decay·h + g², w' = w + lr·g / (sqrt(h') + epsilon).
    """
    w, h, g, lr = ctx.inputs
    eps, decay = ctx.float_arg("epsilon", 1e-5), ctx.float_arg("decay", 1.0)
    new_h = _f32(decay * h + g * g, h)
    effective = _scalar(lr) / (np.sqrt(new_h) + eps)
    update = _f32(effective * g, w)
    outs = [_f32(w + update, w), new_h, _f32(effective, w), update]
    return outs[:ctx.num_outputs]


@register_op("SparseAdagrad", inputs=5, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def sparse_adagrad(ctx: OpContext) -> Outputs:
    """[param, moment, indices, grad, lr] -> [param, moment], rows only (no decay)."""
    w, h, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    eps, rate = ctx.float_arg("epsilon", 1e-5), _scalar(lr)
    new_w, new_h = writable(ctx, w, 0, 0), writable(ctx, h, 1, 1)
    for layer in occurrence_layers(idx):
        r, gi = idx[layer], rows[layer]
        hi = _f32(new_h[r] + gi * gi, h)
        new_h[r] = hi
        new_w[r] += _f32(rate * gi / (np.sqrt(hi) + eps), w)
    return new_w, new_h


@register_op("RowWiseSparseAdagrad", inputs=5, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def row_wise_sparse_adagrad(ctx: OpContext) -> Outputs:
    """[param, moment (one per row), indices, grad, lr] -> [param, moment].

    h[r] += mean(g_r²), w[r] += lr·g_r / (sqrt(h[r]) + epsilon).
    """
    w, h, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    if np.shape(h)[:1] != w.shape[:1]:
        raise ctx.fail(f"moment must have one entry per row ({w.shape[0]}), got {np.shape(h)}")
    eps, rate = ctx.float_arg("epsilon", 1e-5), _scalar(lr)
    new_w, new_h = writable(ctx, w, 0, 0), writable(ctx, h, 1, 1)
    flat = rows.reshape(idx.size, int(np.prod(rows.shape[1:], dtype=np.int64)))
    for layer in occurrence_layers(idx):
        r = idx[layer]
        hi = _f32(new_h[r] + (flat[layer] ** 2).mean(axis=1), h)
        new_h[r] = hi
        step = (rate / (np.sqrt(hi) + eps)).reshape((-1,) + (1,) * (rows.ndim - 1))
        new_w[r] += _f32(rows[layer] * step, w)
    return new_w, new_h


def _adam_args(ctx: OpContext, iteration: Any) -> tuple[float, float, float, float]:
    """(beta1, beta2, epsilon, bias correction) with t = iter."""
    beta1, beta2 = ctx.float_arg("beta1", 0.9), ctx.float_arg("beta2", 0.999)
    t = int(_scalar(iteration)) + 1
    correction = np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return beta1, beta2, ctx.float_arg("epsilon", 1e-5), float(correction)


@register_op("Adam", inputs=6, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
def adam(ctx: OpContext) -> Outputs:
    """[param, m1, m2, grad, lr, iter] -> [param, m1, m2(, effective grad)]."""
    w, m1, m2, g, lr, iteration = ctx.inputs
    beta1, beta2, eps, corr = _adam_args(ctx, iteration)
    new_m1 = _f32(m1 * beta1 + g * (1 - beta1), m1)
    new_m2 = _f32(m2 * beta2 + g * g * (1 - beta2), m2)
    step = corr * new_m1 / (np.sqrt(new_m2) + eps)
    outs = [_f32(w + _scalar(lr) * step, w), new_m1, new_m2, _f32(step, w)]
    return outs[:ctx.num_outputs]


@register_op("SparseAdam", inputs=7, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
def sparse_adam(ctx: OpContext) -> Outputs:
    """[param, m1, m2, indices, grad, lr, iter] -> [param, m1, m2], rows only."""
    w, m1, m2, indices, g, lr, iteration = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    beta1, beta2, eps, corr = _adam_args(ctx, iteration)
    new_w, new_m1, new_m2 = (writable(ctx, v, i, i) for i, v in enumerate((w, m1, m2)))
    steps = np.zeros_like(rows)
    for layer in occurrence_layers(idx):
        r, gi = idx[layer], rows[layer]
        mi = _f32(new_m1[r] * beta1 + gi * (1 - beta1), m1)
        vi = _f32(new_m2[r] * beta2 + gi * gi * (1 - beta2), m2)
        new_m1[r], new_m2[r] = mi, vi
        steps[layer] = corr * mi / (np.sqrt(vi) + eps)
        new_w[r] += _f32(_scalar(lr) * steps[layer], w)
    return [new_w, new_m1, new_m2, steps][:ctx.num_outputs]


@register_op("RowWiseSparseAdam", inputs=7, outputs=(3, 4), inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
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
        new_w[r] += _f32(_scalar(lr) * steps[layer], w)
    return [new_w, new_m1, new_m2, steps][:ctx.num_outputs]


def _adadelta_step(w: Any, h: Any, d: Any, g: Any, ctx: OpContext, lr: float) -> tuple:
    eps, decay = ctx.float_arg("epsilon", 1e-5), ctx.float_arg("decay", 0.95)
    new_h = _f32(decay * h + (1 - decay) * g * g, h)
    ng = np.sqrt(d + eps) / np.sqrt(new_h + eps) * g
    return _f32(w + lr * ng, w), new_h, _f32(decay * d + (1 - decay) * ng * ng, d)


@register_op("Adadelta", inputs=5, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
def adadelta(ctx: OpContext) -> Outputs:
    """[param, moment, moment_delta, grad, lr] -> [param, moment, moment_delta]."""
    w, h, d, g, lr = ctx.inputs
    return _adadelta_step(w, h, d, g, ctx, _scalar(lr))


@register_op("SparseAdadelta", inputs=6, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
def sparse_adadelta(ctx: OpContext) -> Outputs:
    """[param, moment, moment_delta, indices, grad, lr] -> the same three, rows only."""
    w, h, d, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    new = [writable(ctx, v, i, i) for i, v in enumerate((w, h, d))]
    for layer in occurrence_layers(idx):
        r = idx[layer]
        new[0][r], new[1][r], new[2][r] = _adadelta_step(
            new[0][r], new[1][r], new[2][r], rows[layer], ctx, _scalar(lr))
    return new


@register_op("Wngrad", inputs=4, outputs=(2, 4), inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def wngrad(ctx: OpContext) -> Outputs:
    """[param, seq_b, grad, lr] -> [param, seq_b(, effective_lr, update)].

    w' = w + lr·g / (b + epsilon), b' = b + Σg² / (b + epsilon).
    """
    w, b, g, lr = ctx.inputs
    eps, b0 = ctx.float_arg("epsilon", 1e-5), _scalar(b)
    effective = _scalar(lr) / (b0 + eps)
    update = _f32(effective * g, w)
    new_b = _f32(np.reshape(b0 + float((g.astype(np.float64) ** 2).sum()) / (b0 + eps),
                            np.shape(b)), b)
    outs = [_f32(w + update, w), new_b, _f32(np.reshape(effective, np.shape(b)), b), update]
    return outs[:ctx.num_outputs]


@register_op("SparseWngrad", inputs=5, outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def sparse_wngrad(ctx: OpContext) -> Outputs:
    """[param, seq_b, indices, grad, lr] -> [param, seq_b]; seq_b is one global scalar."""
    w, b, indices, g, lr = ctx.inputs
    idx, rows = _rows_of(ctx, w, indices, g)
    eps, b0 = ctx.float_arg("epsilon", 1e-5), _scalar(b)
    new_w = writable(ctx, w, 0, 0)
    if idx.size:
        np.add.at(new_w, idx, _f32(_scalar(lr) * rows / (b0 + eps), w))
    new_b = b0 + float((rows.astype(np.float64) ** 2).sum()) / (b0 + eps)
    return new_w, _f32(np.full(np.shape(b), new_b), b)


@register_op("RmsProp", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (2, 2)],
             shape=_like_inputs(0, 1, 2))
def rms_prop(ctx: OpContext) -> Outputs:
    """[grad, mean_squares, mom, lr] -> [grad', mean_squares', mom'] (grad' = mom')."""
    g, ms, mom, lr = ctx.inputs
    decay, momentum = ctx.float_arg("decay", 0.9), ctx.float_arg("momentum", 0.0)
    eps = ctx.float_arg("epsilon", 1e-5)
    new_ms = _f32(ms + (1 - decay) * (g * g - ms), ms)
    new_mom = _f32(mom * momentum + _scalar(lr) * g / np.sqrt(eps + new_ms), mom)
    return _f32(new_mom, g), new_ms, new_mom


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
        return _scalar(ctx.inputs[index])
    return ctx.float_arg("alpha", 0.005)


@register_op("Ftrl", inputs=(3, 4), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
def ftrl(ctx: OpContext) -> Outputs:
    """[var, n_z (var.shape + [2]), grad(, alpha)] -> [var, n_z] (FTRL-proximal)."""
    w, nz, g = ctx.inputs[:3]
    pairs = nz.reshape(-1, 2)
    new_w, new_n, new_z = _ftrl_step(ctx, w, pairs[:, 0].reshape(w.shape),
                                     pairs[:, 1].reshape(w.shape), g, _ftrl_alpha(ctx, 3))
    new_nz = np.stack([new_n, new_z], axis=-1).reshape(nz.shape)
    return _f32(new_w, w), _f32(new_nz, nz)


@register_op("SparseFtrl", inputs=(4, 5), outputs=2, inplace=[(0, 0), (1, 1)],
             shape=_like_inputs(0, 1))
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
        value = _scalar(trust) / (dx_norm / x_norm + _scalar(wd) + offset)
    value = max(min(value, _scalar(lr_max)), lr_min)
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
             shape=_like_inputs(0, 1, 2, 3, 4, 5, 6, 7))
def yellowfin(ctx: OpContext) -> Outputs:
    """[param, moment, lr, mu, curv_win, g_avg, g2_avg, scalars_memory, grad, iter] -> the
    first eight, updated: a momentum step with the current lr/mu, then Caffe2's YellowFin
    statistics (args beta=0.999, curv_win_width=20, epsilon=1e-6, nesterov=0,
    zero_debias=1); lr and mu are re-tuned from the second iteration on."""
    param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, memory, grad = ctx.inputs[:9]
    xp = ctx.xp
    it = int(_scalar(ctx.inputs[9]))
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
    lr, mu = _scalar(lr_avg), _scalar(mu_avg)
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
