"""The LearningRate op: ``base_lr`` times the multiplier of a Caffe2 learning rate policy.

Each run builds its policy from the op's arguments through ``get(name, default)``, so the
composite policy reads its sub-policies' ``sub_policy_{i}_*`` arguments the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_op
from dpgraph.ops._common import FLOAT, scalar_value
from dpgraph.ops.context import OpContext, Outputs

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
    """Policies of later Caffe2 releases: gate, slope, pieceWarmup, cosine and the warmup
    composites."""
    if kind == "gate":
        m1, m2 = float(get("multiplier_1", 1.0)), float(get("multiplier_2", 1.0))
        num = int(get("num_iter", 0))
        return lambda it: m2 if it >= num else m1
    if kind == "slope":
        return _slope(get, ctx)
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
        "poly, linearWarmup, constantWarmup, alter, hill, slope, cyclical, composite, "
        "gate, pieceWarmup, cosine, constantThenLinearWarmup, compositeCyclical, compositeCosine")


def _slope(get: Callable[[str, Any], Any], ctx: OpContext) -> Policy:
    """multiplier_1 until num_iter_1, then a straight line reaching multiplier_2 at num_iter_2,
    never past multiplier_2 (Caffe2's SlopeLearningRate)."""
    n1, n2 = int(get("num_iter_1", 0)), int(get("num_iter_2", 0))
    m1, m2 = float(get("multiplier_1", 0.0)), float(get("multiplier_2", 0.0))
    if n1 <= 0 or n2 <= n1:
        raise ctx.fail(f"policy 'slope' needs 0 < num_iter_1 < num_iter_2, got num_iter_1={n1}, "
                       f"num_iter_2={n2}")
    return lambda it: m1 if it < n1 else max(m2, m1 + (it - n1) * (m2 - m1) / (n2 - n1))


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


def _rate_shape(op: Any, shapes: list, types: list) -> list:
    """Caffe2's schema gives the rate the iteration blob's shape (its value is a float)."""
    return [None] if shapes[0] is None else [(tuple(shapes[0]), FLOAT)]


@register_op("LearningRate", inputs=1, outputs=1, shape=_rate_shape)
def learning_rate(ctx: OpContext) -> Outputs:
    """iter (int64) -> base_lr × policy multiplier(iter), a float32 0-d array (as Caffe2)."""
    if not ctx.has_arg("base_lr"):
        raise ctx.fail("argument 'base_lr' is required")
    it = int(scalar_value(ctx.inputs[0]))
    kind = ctx.str_arg("policy", "fixed")
    policy = _policy(kind, ctx.arg, ctx)
    scale = 1.0 if kind == "composite" else ctx.float_arg("lr_scale", 1.0)
    with np.errstate(invalid="ignore"):
        value = ctx.float_arg("base_lr") * scale * policy(it)
    return (ctx.xp.asarray(np.float32(value)),)
