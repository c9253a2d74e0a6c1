"""Ranking losses and metrics.

* ``LambdaRankNdcg``: per session (a ``session_lengths`` segment), the LambdaRank loss of
  scores ``y`` against relevances ``r``, pairs weighted by ``|Δgain · Δdiscount|`` (or the
  NDCG gap itself with ``use_ndcg_as_loss``), and the gradient ``dy`` it caches as its
  second output;
* ``SessionMarginLoss``: per session, the pairwise hinge ``margin - sign(Δlabel) Δpred``
  averaged over the session length, with the cached gradient ``dpred``;
* their ``*Gradient`` ops scale the cached gradient by each session's loss gradient;
* ``APMeter``: average precision per class over the last ``buffer_size`` predictions that
  the op instance saw (a state kept across runs, as Caffe2's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

SessionFn = Callable[[np.ndarray, np.ndarray], tuple[float, np.ndarray]]


# --- sessions ---------------------------------------------------------------------------------
def _session_bounds(ctx: OpContext, index: int, total: int) -> np.ndarray:
    """Start offsets of the sessions (plus the end), from int ``session_lengths``."""
    lengths = np.asarray(host(ctx.inputs[index])).reshape(-1)
    if lengths.dtype.kind not in "iu":
        raise ctx.fail(f"session lengths {ctx.input_name(index)!r} must be int32, got "
                       f"{lengths.dtype}")
    if lengths.size and lengths.min() < 0:
        raise ctx.fail("session lengths must be >= 0")
    if int(lengths.sum()) != total:
        raise ctx.fail(f"session lengths {ctx.input_name(index)!r} sum to "
                       f"{int(lengths.sum())}, the predictions hold {total}")
    return np.concatenate([[0], np.cumsum(lengths)])


def _per_session(ctx: OpContext, session: SessionFn) -> Outputs:
    """[pred (1-D), label, session_lengths] -> [loss per session, d loss / d pred]."""
    pred = np.asarray(host(ctx.inputs[0]))
    label = np.asarray(host(ctx.inputs[1]))
    if pred.ndim != 1:
        raise ctx.fail(f"the predictions must be 1-D, got shape {pred.shape}")
    if label.size != pred.size:
        raise ctx.fail(f"the labels must hold one value per prediction ({pred.size}), got "
                       f"{label.size}")
    bounds = _session_bounds(ctx, 2, pred.size)
    pred = pred.astype(np.float32, copy=False)
    label = label.reshape(-1).astype(np.float32, copy=False)
    loss = np.zeros(bounds.size - 1, np.float32)
    grad = np.zeros(pred.size, np.float32)
    for s in range(bounds.size - 1):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if hi > lo and np.abs(label[lo:hi]).sum() >= 1e-6:
            loss[s], grad[lo:hi] = session(pred[lo:hi], label[lo:hi])
    return loss, grad


def _scaled_by_session(ctx: OpContext) -> Outputs:
    """[pred, session_lengths, cached d pred, d loss] -> d pred = d loss[s] * cached[s]."""
    pred = np.asarray(host(ctx.inputs[0]))
    cached = np.asarray(host(ctx.inputs[2]))
    dloss = np.asarray(host(ctx.inputs[3])).reshape(-1)
    if pred.ndim != 1 or cached.ndim != 1:
        raise ctx.fail(f"the predictions and their cached gradient must be 1-D, got "
                       f"{pred.shape} and {cached.shape}")
    if cached.size == 0 or cached.size != pred.size:
        raise ctx.fail(f"the cached gradient must hold one value per prediction "
                       f"({pred.size}), got {cached.size}")
    bounds = _session_bounds(ctx, 1, pred.size)
    if dloss.size != bounds.size - 1:
        raise ctx.fail(f"the loss gradient must hold one value per session "
                       f"({bounds.size - 1}), got {dloss.size}")
    scale = np.repeat(dloss.astype(np.float32), np.diff(bounds))
    return ((scale * cached.astype(np.float32)).astype(np.float32),)


def _cached_gradient_maker(op_type: str) -> None:
    @register_gradient(op_type)
    def _gradient(g: GradientBuilder) -> None:
        g.add(op_type + "Gradient", [g.I(0), g.I(2), g.O(1), g.GO(0)], [g.GI(0)])


def _pairwise(v: np.ndarray) -> np.ndarray:
    """``D[i, j] = v[i] - v[j]``."""
    return v[:, None] - v[None, :]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# --- LambdaRankNdcg ---------------------------------------------------------------------------
def _discounts(scores: np.ndarray) -> np.ndarray:
    """``1 / log2(rank + 2)`` for each item, ranked by decreasing score."""
    order = np.argsort(-scores, kind="stable")
    discount = np.empty(scores.size)
    discount[order] = 1.0 / np.log2(np.arange(scores.size) + 2.0)
    return discount


def _log_sigmoid(x: np.ndarray, huge: float = 100.0) -> np.ndarray:
    with np.errstate(divide="ignore"):
        inner = np.log(_sigmoid(np.clip(x, -huge, huge)))
    return np.where(x > huge, 0.0, np.where(x < -huge, x, inner))


def _lambda_rank_session(y: np.ndarray, r: np.ndarray, as_ndcg: bool, normalize: bool,
                         exp_gain: bool) -> tuple[float, np.ndarray]:
    y64, r64 = y.astype(np.float64), r.astype(np.float64)
    gain = r64 if as_ndcg and not exp_gain else np.exp2(r64)
    idcg = float((gain * _discounts(r64)).sum())
    discount = _discounts(y64)
    weight = np.abs(_pairwise(discount) * _pairwise(gain))
    sign = np.where(_pairwise(r64) > 0, 1.0, -1.0)
    dy_diff = _pairwise(y64)
    dy = -(weight * sign * _sigmoid(-sign * dy_diff)).sum(axis=1)
    if as_ndcg:
        loss = idcg - float((gain * discount).sum())
    else:
        loss = -float((weight * _log_sigmoid(sign * dy_diff)).sum())
    if normalize:
        norm = max(idcg, 1e-5)
        loss, dy = loss / norm, dy / norm
    return loss, dy


@register_op("LambdaRankNdcg", inputs=3, outputs=2)
def lambda_rank_ndcg(ctx: OpContext) -> Outputs:
    """[y, r, session_lengths] -> [loss per session, dy]; arguments ``use_ndcg_as_loss``
    (0), ``use_idcg_normalization`` (1), ``use_exp_gain`` (1: gain 2^r; with NDCG as the
    loss and 0, gain r)."""
    as_ndcg = bool(ctx.arg("use_ndcg_as_loss", False))
    normalize = bool(ctx.arg("use_idcg_normalization", True))
    exp_gain = bool(ctx.arg("use_exp_gain", True))
    return _per_session(
        ctx, lambda y, r: _lambda_rank_session(y, r, as_ndcg, normalize, exp_gain))


@register_op("LambdaRankNdcgGradient", inputs=4, outputs=1)
def lambda_rank_ndcg_gradient(ctx: OpContext) -> Outputs:
    """[y, session_lengths, dy (cached), dloss] -> dy scaled by each session's dloss."""
    return _scaled_by_session(ctx)


_cached_gradient_maker("LambdaRankNdcg")


# --- SessionMarginLoss ------------------------------------------------------------------------
def _margin_session(pred: np.ndarray, label: np.ndarray, margin: np.float32
                    ) -> tuple[float, np.ndarray]:
    weight = np.float32(1.0) / np.float32(pred.size)
    sign = np.sign(_pairwise(label)).astype(np.float32)
    gap = (margin - sign * _pairwise(pred)) * np.abs(sign)
    active = gap > 0
    loss = np.float32(0.5) * weight * np.float32(gap[active].sum(dtype=np.float64))
    return float(loss), -weight * (active * sign).sum(axis=1)


@register_op("SessionMarginLoss", inputs=3, outputs=2)
def session_margin_loss(ctx: OpContext) -> Outputs:
    """[pred, label, session_lengths] -> [loss per session, dpred]: per session of n items,
    ``(1/n) Σ_{i<j, label_i != label_j} max(0, margin - sign(label_i - label_j)
    (pred_i - pred_j))`` (``margin`` default 1.0)."""
    margin = np.float32(ctx.float_arg("margin", 1.0))
    return _per_session(ctx, lambda p, l: _margin_session(p, l, margin))


@register_op("SessionMarginLossGradient", inputs=4, outputs=1)
def session_margin_loss_gradient(ctx: OpContext) -> Outputs:
    """[pred, session_lengths, dpred (cached), dloss] -> dpred scaled by each session's
    dloss."""
    return _scaled_by_session(ctx)


_cached_gradient_maker("SessionMarginLoss")


# --- APMeter ----------------------------------------------------------------------------------
#: Per-instance key (in the op's own argument dict) of APMeter's prediction buffer.
_BUFFER = "\0apmeter_buffer"


class _APBuffer:
    """The last ``size`` (score, label) pairs per class.  As in Caffe2, the buffer is left
    sorted by score after each run, so a later run drops its highest-scored pairs first."""

    def __init__(self, size: int, classes: int) -> None:
        self.size = size
        self.scores = np.zeros((classes, 0), np.float32)
        self.labels = np.zeros((classes, 0), np.int64)

    def add(self, scores: np.ndarray, labels: np.ndarray) -> None:
        """Append rows (``[N, classes]``), keeping the last ``size`` pairs."""
        scores, labels = scores[-self.size:].T, labels[-self.size:].T
        drop = max(0, self.scores.shape[1] + scores.shape[1] - self.size)
        self.scores = np.concatenate([self.scores[:, drop:], scores], axis=1)
        self.labels = np.concatenate([self.labels[:, drop:], labels], axis=1)

    def average_precision(self) -> np.ndarray:
        order = np.argsort(-self.scores, axis=1, kind="stable")
        self.scores = np.take_along_axis(self.scores, order, axis=1)
        self.labels = np.take_along_axis(self.labels, order, axis=1)
        hits = np.cumsum(self.labels, axis=1, dtype=np.float64)
        precision = hits / np.arange(1, self.labels.shape[1] + 1)
        positive = self.labels == 1
        total = (precision * positive).sum(axis=1)
        return (total / np.maximum(1, positive.sum(axis=1))).astype(np.float32)


@register_op("APMeter", inputs=2, outputs=1)
def ap_meter(ctx: OpContext) -> Outputs:
    """[predictions [N, D], labels [N, D] (0/1)] -> AP [D]: per class, the mean precision at
    each positive, over the last ``buffer_size`` (1000) rows this op has seen."""
    scores = np.asarray(host(ctx.inputs[0]))
    labels = np.asarray(host(ctx.inputs[1]))
    if scores.ndim != 2 or labels.shape != scores.shape:
        raise ctx.fail(f"predictions and labels must both be [samples, classes], got "
                       f"{scores.shape} and {labels.shape}")
    if labels.dtype.kind not in "iub":
        raise ctx.fail(f"labels must be int32, got {labels.dtype}")
    buffer: Any = ctx.args.get(_BUFFER)
    if buffer is None:
        size = ctx.int_arg("buffer_size", 1000)
        if size <= 0:
            raise ctx.fail(f"argument 'buffer_size' must be > 0, got {size}")
        buffer = ctx.args[_BUFFER] = _APBuffer(size, scores.shape[1])
    if buffer.scores.shape[0] != scores.shape[1]:
        raise ctx.fail(f"this APMeter has seen {buffer.scores.shape[0]} classes, the "
                       f"predictions now have {scores.shape[1]}")
    buffer.add(scores.astype(np.float32), labels.astype(np.int64))
    return (buffer.average_precision(),)
