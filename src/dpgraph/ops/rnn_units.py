"""Recurrent cell operators: LSTMUnit, GRUUnit and their gradients.

Both units take the pre-activation gates of one timestep and the previous state(s), all
shaped ``(1, N, ...)``, plus (unless ``sequence_lengths=0``) an int32 ``seq_lengths`` of N
entries and the int32 timestep blob.  A batch row is *valid* when there are no lengths or
``t < seq_lengths[n]``; invalid rows carry the previous state through (or zero it with
``drop_states``) and get no gate gradient.

LSTM gates are laid out ``[i | f | o | g]``; GRU gates ``[r | u | o]``, of which the unit
uses only u and o (the step net applied the reset gate already).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgraph.errors import GradientError
from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host, like_inputs, same_as_input
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1.0 / (1.0 + xp.exp(-x))


def _uses_lengths(ctx: OpContext) -> bool:
    return bool(ctx.int_arg("sequence_lengths", 1))


def _valid_rows(ctx: OpContext, n: int, lengths_index: int) -> Any:
    """A (1, N, 1) float mask of the valid rows (all ones without seq_lengths)."""
    xp = ctx.xp
    if not _uses_lengths(ctx):
        return None
    timestep = host(ctx.inputs[lengths_index + 1]).reshape(-1)
    lengths = host(ctx.inputs[lengths_index]).reshape(-1)
    if timestep.size < 1:
        raise ctx.fail(f"timestep blob {ctx.input_name(lengths_index + 1)!r} is empty; it must "
                       "hold the int32 step index")
    if lengths.size != n:
        raise ctx.fail(f"seq_lengths {ctx.input_name(lengths_index)!r} has {lengths.size} "
                       f"entries but the batch has {n} rows")
    valid = (int(timestep[0]) < lengths).astype(np.float32)
    return xp.asarray(valid.reshape(1, n, 1))


def _check_state(ctx: OpContext, index: int, like: Any, width: int) -> None:
    value = ctx.inputs[index]
    if value.ndim != 3 or value.shape[0] != 1 or value.shape[1] != like.shape[1] or \
            value.shape[2] != width:
        raise ctx.fail(f"input {ctx.input_name(index)!r} has shape {tuple(value.shape)}; "
                       f"expected (1, {like.shape[1]}, {width})")


def _out_dtype(ctx: OpContext) -> Any:
    """The dtype results are returned in: the gates' (float16 stays float16; the maths runs in
    float32), float32 otherwise."""
    dtype = np.dtype(getattr(ctx.inputs[2 if ctx.op.type.startswith("LSTM") else 1], "dtype",
                             np.float32))
    return dtype if dtype.kind == "f" else np.dtype(np.float32)


def _carry(valid: Any, new: Any, prev: Any, drop: bool) -> Any:
    """Valid rows take ``new``; invalid rows keep ``prev`` (or 0 with drop_states)."""
    if valid is None:
        return new
    return new * valid if drop else new * valid + prev * (1.0 - valid)


# --- LSTM --------------------------------------------------------------------------------
def _lstm_gates(xp: Any, gates: Any, d: int, forget_bias: float) -> tuple[Any, ...]:
    i = _sigmoid(xp, gates[..., :d])
    f = _sigmoid(xp, gates[..., d:2 * d] + forget_bias)
    o = _sigmoid(xp, gates[..., 2 * d:3 * d])
    g = xp.tanh(gates[..., 3 * d:])
    return i, f, o, g


def _lstm_inputs(ctx: OpContext) -> tuple[Any, Any, Any, int]:
    h_prev, c_prev, gates = (ctx.xp.asarray(v, dtype=np.float32) for v in ctx.inputs[:3])
    if c_prev.ndim != 3:
        raise ctx.fail(f"cell_t_prev {ctx.input_name(1)!r} must be 3-D (1, N, D), got shape "
                       f"{tuple(c_prev.shape)}")
    d = c_prev.shape[2]
    if gates.ndim != 3 or gates.shape[2] != 4 * d or gates.shape[1] != c_prev.shape[1]:
        raise ctx.fail(f"gates {ctx.input_name(2)!r} has shape {tuple(gates.shape)}; expected "
                       f"(1, {c_prev.shape[1]}, {4 * d}) for hidden size {d}")
    _check_state(ctx, 0, c_prev, d)
    return h_prev, c_prev, gates, d


def _lstm_arity(ctx: OpContext, base: int) -> None:
    expected = base + (1 if _uses_lengths(ctx) else 0)
    if ctx.num_inputs != expected:
        raise ctx.fail(f"takes {expected} inputs with sequence_lengths="
                       f"{int(_uses_lengths(ctx))}, got {ctx.num_inputs}")


@register_op("LSTMUnit", inputs=(4, 5), outputs=2, shape=same_as_input(1))
def lstm_unit(ctx: OpContext) -> Outputs:
    """One LSTM step: (hidden_t_prev, cell_t_prev, gates, [seq_lengths], timestep) ->
    (hidden_t, cell_t); c = f*c_prev + i*g, h = o*tanh(c)."""
    _lstm_arity(ctx, 4)
    xp = ctx.xp
    h_prev, c_prev, gates, d = _lstm_inputs(ctx)
    i, f, o, g = _lstm_gates(xp, gates, d, ctx.float_arg("forget_bias", 0.0))
    c = f * c_prev + i * g
    h = o * xp.tanh(c)
    valid = _valid_rows(ctx, c_prev.shape[1], 3)
    drop = bool(ctx.int_arg("drop_states", 0))
    out = _out_dtype(ctx)
    return (_carry(valid, h, h_prev, drop).astype(out), _carry(valid, c, c_prev, drop).astype(out))


@register_op("LSTMUnitGradient", inputs=(8, 9), outputs=3, shape=like_inputs(0, 1, 2))
def lstm_unit_gradient(ctx: OpContext) -> Outputs:
    """(h_prev, c_prev, gates, [seq_lengths], timestep, h, c, dh, dc) ->
    (dh_prev, dc_prev, dgates)."""
    _lstm_arity(ctx, 8)
    xp = ctx.xp
    h_prev, c_prev, gates, d = _lstm_inputs(ctx)
    base = 5 if _uses_lengths(ctx) else 4
    c, dh, dc = (xp.asarray(ctx.inputs[base + k], dtype=np.float32) for k in (1, 2, 3))
    i, f, o, g = _lstm_gates(xp, gates, d, ctx.float_arg("forget_bias", 0.0))
    tc = xp.tanh(c)
    dc_tot = dc + dh * o * (1.0 - tc * tc)
    dgates = xp.concatenate([dc_tot * g * i * (1.0 - i), dc_tot * c_prev * f * (1.0 - f),
                             dh * tc * o * (1.0 - o), dc_tot * i * (1.0 - g * g)], axis=2)
    dc_prev = dc_tot * f
    dh_prev = xp.zeros_like(h_prev)
    valid = _valid_rows(ctx, c_prev.shape[1], 3)
    if valid is not None:
        keep = 0.0 if ctx.int_arg("drop_states", 0) else 1.0
        dgates = dgates * valid
        dc_prev = dc_prev * valid + keep * dc * (1.0 - valid)
        dh_prev = keep * dh * (1.0 - valid)
    out = _out_dtype(ctx)
    return dh_prev.astype(out), dc_prev.astype(out), dgates.astype(out)


def _require_output_grads(g: GradientBuilder, count: int) -> None:
    for k in range(count):
        if not g.has_go(k) or g.go_is_sparse(k):
            raise GradientError(
                f"{g.op.type}: output {g.O(k)!r} needs a dense gradient (every output of the "
                f"unit needs one); add a ZeroGradient op for an unused output.")


@register_gradient("LSTMUnit")
def _lstm_unit_gradient_maker(g: GradientBuilder) -> None:
    _require_output_grads(g, 2)
    inputs = [g.I(k) for k in range(len(g.op.input))]
    g.add("LSTMUnitGradient", inputs + [g.O(0), g.O(1), g.GO(0), g.GO(1)],
          [g.GI(0), g.GI(1), g.GI(2)])


# --- GRU ---------------------------------------------------------------------------------
def _gru_inputs(ctx: OpContext) -> tuple[Any, Any, int]:
    h_prev, gates = (ctx.xp.asarray(v, dtype=np.float32) for v in ctx.inputs[:2])
    if h_prev.ndim != 3:
        raise ctx.fail(f"hidden_t_prev {ctx.input_name(0)!r} must be 3-D (1, N, D), got "
                       f"shape {tuple(h_prev.shape)}")
    d = h_prev.shape[2]
    if gates.ndim != 3 or gates.shape[2] != 3 * d or gates.shape[1] != h_prev.shape[1]:
        raise ctx.fail(f"gates {ctx.input_name(1)!r} has shape {tuple(gates.shape)}; expected "
                       f"(1, {h_prev.shape[1]}, {3 * d}) for hidden size {d}")
    return h_prev, gates, d


def gru_unit(ctx: OpContext) -> Outputs:
    """One GRU step: (hidden_t_prev, gates, [seq_lengths], timestep) -> hidden_t;
    h = u*h_prev + (1-u)*tanh(x_o)."""
    _lstm_arity(ctx, 3)
    xp = ctx.xp
    h_prev, gates, d = _gru_inputs(ctx)
    u = _sigmoid(xp, gates[..., d:2 * d])
    h = u * h_prev + (1.0 - u) * xp.tanh(gates[..., 2 * d:])
    valid = _valid_rows(ctx, h_prev.shape[1], 2)
    drop = bool(ctx.int_arg("drop_states", 0))
    return (_carry(valid, h, h_prev, drop).astype(_out_dtype(ctx)),)


def gru_unit_gradient(ctx: OpContext) -> Outputs:
    """(h_prev, gates, [seq_lengths], timestep, h, dh) -> (dh_prev, dgates)."""
    _lstm_arity(ctx, 5)
    xp = ctx.xp
    h_prev, gates, d = _gru_inputs(ctx)
    dh = xp.asarray(ctx.inputs[-1], dtype=np.float32)
    u = _sigmoid(xp, gates[..., d:2 * d])
    to = xp.tanh(gates[..., 2 * d:])
    dgates = xp.concatenate([xp.zeros_like(u), (dh * h_prev - dh * to) * u * (1.0 - u),
                             dh * (1.0 - u) * (1.0 - to * to)], axis=2)
    dh_prev = dh * u
    valid = _valid_rows(ctx, h_prev.shape[1], 2)
    if valid is not None:
        keep = 0.0 if ctx.int_arg("drop_states", 0) else 1.0
        dgates = dgates * valid
        dh_prev = dh_prev * valid + keep * dh * (1.0 - valid)
    return dh_prev.astype(_out_dtype(ctx)), dgates.astype(_out_dtype(ctx))


def _gru_unit_gradient_maker(g: GradientBuilder) -> None:
    _require_output_grads(g, 1)
    inputs = [g.I(k) for k in range(len(g.op.input))]
    g.add("GRUUnitGradient", inputs + [g.O(0), g.GO(0)], [g.GI(0), g.GI(1)])


register_op("GRUUnit", inputs=(3, 4), outputs=1, shape=same_as_input(0))(gru_unit)
register_op("GRUUnitGradient", inputs=(5, 6), outputs=2, shape=like_inputs(0, 1))(
    gru_unit_gradient)
register_gradient("GRUUnit")(_gru_unit_gradient_maker)
