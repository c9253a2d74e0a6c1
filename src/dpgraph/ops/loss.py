"""Loss operators: softmax losses, cross entropies, distances, criteria, accuracy.

Each op registers its schema, numpy kernel and Caffe2's gradient maker; every gradient op is
itself a registered op with a kernel.  Scalar losses (``AveragedLoss``, the ``avg_loss`` of
``SoftmaxWithLoss``, ``Accuracy``) are 0-d arrays, like Caffe2's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import FLOAT, like_inputs
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder

_LOG_THRESHOLD = 1e-20
DONT_CARE = -1  # SpatialSoftmaxWithLoss label to ignore


# --- helpers ---------------------------------------------------------------------------------
def _scalar_shape(op: Any, shapes: list, types: list) -> list:
    return [((), FLOAT)]


def _batch_shape(op: Any, shapes: list, types: list) -> list:
    if shapes[0] is None:
        return [None]
    return [((shapes[0][0] if len(shapes[0]) else 1,), types[0] or FLOAT)]


def _matrix_rows_shape(op: Any, shapes: list, types: list) -> list:
    """(N,) for an N×D input; a 1-D input is one row."""
    if shapes[0] is None:
        return [None]
    return [((shapes[0][0] if len(shapes[0]) > 1 else 1,), types[0] or FLOAT)]


def _softmax_rows(x: Any, xp: Any) -> tuple[Any, Any]:
    """(softmax, log-softmax) by rows: exp(x - max) / sum and x - max - log(sum)."""
    shifted = x - x.max(axis=1, keepdims=True)
    e = xp.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    return e / total, shifted - xp.log(total)


def _as_2d(ctx: OpContext, x: Any) -> Any:
    """Flatten at the canonical ``axis`` argument (default 1) to [outer, inner]."""
    axis = ctx.int_arg("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _integer_labels(ctx: OpContext, label: Any) -> Any:
    """Input 1 (the label) as an int64 array; a clear error for float labels, which Caffe2
    refuses (its label tensors are int32)."""
    label = ctx.xp.asarray(label)
    if label.dtype.kind not in "iu":
        raise ctx.fail(f"label {ctx.input_name(1)!r} must hold integer class ids (int32), got "
                       f"{label.dtype}; cast it with .astype(np.int32) before feeding it")
    return label.astype(np.int64)


def _labels(ctx: OpContext, label: Any, n: int, d: int) -> Any:
    label = _integer_labels(ctx, label).reshape(-1)
    if label.shape[0] != n:
        raise ctx.fail(f"label has {label.shape[0]} entries, expected one per row ({n})")
    if label.size and (int(label.min()) < 0 or int(label.max()) >= d):
        raise ctx.fail(f"labels must lie in [0, {d}), got [{int(label.min())}, "
                       f"{int(label.max())}]")
    return label


def _probability_rows(p: Any) -> Any:
    """P as an N×D matrix of class probabilities; a 1-D P is one row (unlike ``_rows``)."""
    return p.reshape(p.shape[0] if p.ndim > 1 else 1, -1)


def _clamped_log(p: Any, xp: Any) -> Any:
    return xp.log(xp.maximum(p, _LOG_THRESHOLD))


# --- SoftmaxWithLoss -------------------------------------------------------------------------
def _softmax_loss_parts(ctx: OpContext, x2: Any, label: Any, weight: Any | None) -> tuple:
    """(target matrix, per-row weights, total weight) for a [N, D] problem."""
    xp = ctx.xp
    n, d = x2.shape
    if ctx.int_arg("label_prob", 0):
        target = xp.asarray(label, dtype=x2.dtype).reshape(n, d)
    else:
        target = xp.zeros((n, d), dtype=x2.dtype)
        target[xp.arange(n), _labels(ctx, label, n, d)] = 1
    w = (xp.ones(n, dtype=x2.dtype) if weight is None
         else xp.asarray(weight, dtype=x2.dtype).reshape(n))
    return target, w, float(w.sum()) if weight is not None else float(n)


_PLAIN_PLAN = "\0softmax_loss_plain"


def _plain_labels(ctx: OpContext, x: Any, label: Any, num_inputs: int) -> Any:
    """The labels as a flat integer array when the op is the common case the fast paths
    handle, else None: numpy float logits [N, D] (N > 0) classified along axis 1, integer
    class ids (one per row, all in [0, D)), no weight input and no ``label_prob``.  The
    argument part is decided once per op instance; bad labels take the general path,
    which raises its error."""
    plain = ctx.args.get(_PLAIN_PLAN)
    if plain is None:
        plain = ctx.args[_PLAIN_PLAN] = ctx.int_arg("axis", 1) in (1, -1) and \
            not ctx.int_arg("label_prob", 0)
    if not plain or len(ctx.inputs) != num_inputs or type(x) is not np.ndarray or \
            x.ndim != 2 or x.dtype.kind != "f" or not x.shape[0] or \
            type(label) is not np.ndarray or label.dtype.kind not in "iu" or \
            label.size != x.shape[0]:
        return None
    flat = label.reshape(-1)
    if int(np.minimum.reduce(flat)) < 0 or int(np.maximum.reduce(flat)) >= x.shape[1]:
        return None
    return flat


def _plain_softmax_with_loss(ctx: OpContext, x: Any, labels: Any) -> Outputs | None:
    """SoftmaxWithLoss for :func:`_plain_labels`' case: the general path's float operations
    (softmax, log-softmax, the row losses and their sum) with fewer temporaries, and the
    label entries read directly, which gives the one-hot product's values where every
    log-probability is finite (else the general path runs)."""
    # ufunc reductions called directly: the values of x.max/p.sum without their wrappers
    shifted = x - np.maximum.reduce(x, axis=1, keepdims=True)
    p = np.exp(shifted)
    total = np.add.reduce(p, axis=1, keepdims=True)
    p /= total
    np.subtract(shifted, np.log(total), out=shifted)  # the log-softmax
    if not np.minimum.reduce(shifted, axis=None) > -np.inf:
        return None  # a -inf or NaN log-probability: the one-hot product's semantics
    per_row = -shifted[np.arange(x.shape[0]), labels]
    loss = np.add.reduce(per_row) * ctx.float_arg("scale", 1.0) / float(x.shape[0])
    return p, np.asarray(loss, dtype=x.dtype)


@register_op("SoftmaxWithLoss", inputs=(2, 3), outputs=2,
             shape=lambda op, s, t: [like_inputs(0)(op, s, t)[0], ((), FLOAT)])
def softmax_with_loss(ctx: OpContext) -> Outputs:
    """[logits, label(, weight)] -> [softmax, avg_loss]; args scale, label_prob, axis."""
    xp = ctx.xp
    x = ctx.inputs[0]
    labels = _plain_labels(ctx, x, ctx.inputs[1], 2)
    if labels is not None:
        outs = _plain_softmax_with_loss(ctx, x, labels)
        if outs is not None:
            return outs
    x2 = _as_2d(ctx, x)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    p, log_softmax = _softmax_rows(x2, xp)
    target, w, total = _softmax_loss_parts(ctx, x2, ctx.inputs[1], weight)
    # like Caffe2: integer labels read the log-softmax (exact for any logit range); label
    # probabilities use log(max(P, 1e-20))
    log_p = _clamped_log(p, xp) if ctx.int_arg("label_prob", 0) else log_softmax
    per_row = -(target * log_p).sum(axis=1) * w
    scale = ctx.float_arg("scale", 1.0)
    loss = per_row.sum() * scale / total if total > 0 else 0.0
    return p.reshape(x.shape), xp.asarray(loss, dtype=x.dtype)


@register_gradient("SoftmaxWithLoss")
def _softmax_with_loss_grad(g: GradientBuilder) -> None:
    inputs = [g.I(0), g.I(1)] + ([g.I(2)] if len(g.op.input) > 2 else [])
    g.add("SoftmaxWithLossGradient", [*inputs, g.O(0), g.GO(1)], [g.GI(0)])


@register_op("SoftmaxWithLossGradient", inputs=(4, 5), outputs=1, shape=like_inputs(0))
def softmax_with_loss_gradient(ctx: OpContext) -> Outputs:
    """[X, label, (weight,) softmax, d_avg_loss] -> dX."""
    xp = ctx.xp
    x, label = ctx.inputs[0], ctx.inputs[1]
    labels = _plain_labels(ctx, x, label, 4)
    p = ctx.inputs[-2]
    if labels is not None and type(p) is np.ndarray and p.shape == x.shape and \
            p.dtype == x.dtype:
        # (P - one-hot) * factor, as the general path computes it: P - 0 is P
        factor = ctx.float_arg("scale", 1.0) * float(
            xp.asarray(ctx.inputs[-1]).reshape(-1)[0]) / x.shape[0]
        dx = p.copy()
        dx[np.arange(x.shape[0]), labels] -= 1
        dx *= x.dtype.type(factor)
        return (dx,)
    weight = ctx.inputs[2] if len(ctx.inputs) == 5 else None
    p, d_loss = ctx.inputs[-2], ctx.inputs[-1]
    x2 = _as_2d(ctx, x)
    p2 = xp.asarray(p).reshape(x2.shape)
    target, w, total = _softmax_loss_parts(ctx, x2, label, weight)
    if total <= 0:
        return (xp.zeros_like(x),)
    factor = ctx.float_arg("scale", 1.0) * float(xp.asarray(d_loss).reshape(-1)[0]) / total
    dx = (p2 - target) * (w[:, None] * factor).astype(x2.dtype, copy=False)
    return (dx.astype(x.dtype, copy=False).reshape(x.shape),)


# --- SpatialSoftmaxWithLoss ------------------------------------------------------------------
def _spatial_parts(ctx: OpContext, x: Any, label: Any, weights: Any | None) -> tuple:
    """(one-hot target, pixel weights with ignored pixels zeroed, total weight)."""
    xp = ctx.xp
    n, c = x.shape[0], x.shape[1]
    label = _integer_labels(ctx, label).reshape(n, *x.shape[2:])
    valid = label != DONT_CARE
    if bool(((label < 0) & valid).any()) or bool((label >= c).any()):
        raise ctx.fail(f"labels must be -1 (ignored) or lie in [0, {c})")
    w = (xp.ones(label.shape, dtype=x.dtype) if weights is None
         else xp.asarray(weights, dtype=x.dtype).reshape(label.shape))
    w = w * valid
    onehot = (xp.arange(c).reshape(1, c, *([1] * (x.ndim - 2)))
              == xp.where(valid, label, 0)[:, None]).astype(x.dtype)
    return onehot, w, float(w.sum())


def _channel_softmax(x: Any, xp: Any) -> Any:
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@register_op("SpatialSoftmaxWithLoss", inputs=(2, 3), outputs=2,
             shape=lambda op, s, t: [like_inputs(0)(op, s, t)[0], ((), FLOAT)])
def spatial_softmax_with_loss(ctx: OpContext) -> Outputs:
    """NCHW [X, label N×H×W (-1 = ignore)(, weights)] -> [softmax, avg_loss]."""
    xp = ctx.xp
    x = ctx.inputs[0]
    p = _channel_softmax(x, xp)
    weights = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    onehot, w, total = _spatial_parts(ctx, x, ctx.inputs[1], weights)
    picked = (p * onehot).sum(axis=1)
    loss = -(_clamped_log(picked, xp) * w).sum()
    scale = ctx.float_arg("scale", 1.0)
    avg = loss * scale / total if total > 0 else 0.0
    return p, xp.asarray(avg, dtype=x.dtype)


@register_gradient("SpatialSoftmaxWithLoss")
def _spatial_softmax_with_loss_grad(g: GradientBuilder) -> None:
    inputs = [g.I(0), g.I(1)] + ([g.I(2)] if len(g.op.input) > 2 else [])
    g.add("SpatialSoftmaxWithLossGradient", [*inputs, g.O(0), g.GO(1)], [g.GI(0)])


@register_op("SpatialSoftmaxWithLossGradient", inputs=(4, 5), outputs=1, shape=like_inputs(0))
def spatial_softmax_with_loss_gradient(ctx: OpContext) -> Outputs:
    """[X, label, (weights,) softmax, d_avg_loss] -> dX."""
    xp = ctx.xp
    x = ctx.inputs[0]
    p, d_loss = ctx.inputs[-2], ctx.inputs[-1]
    weights = ctx.inputs[2] if len(ctx.inputs) == 5 else None
    onehot, w, total = _spatial_parts(ctx, x, ctx.inputs[1], weights)
    if total <= 0:
        return (xp.zeros_like(x),)
    factor = ctx.float_arg("scale", 1.0) * float(xp.asarray(d_loss).reshape(-1)[0]) / total
    dx = (p - onehot) * (w[:, None] * factor).astype(x.dtype)
    return (dx.astype(x.dtype),)



# --- cross entropies -------------------------------------------------------------------------
@register_op("LabelCrossEntropy", inputs=2, outputs=1, shape=_matrix_rows_shape)
def label_cross_entropy(ctx: OpContext) -> Outputs:
    """[P (N×D), label int (N)] -> -log(max(P[i, label_i], 1e-20))."""
    xp = ctx.xp
    p = ctx.inputs[0]
    p2 = _probability_rows(p)
    label = _labels(ctx, ctx.inputs[1], p2.shape[0], p2.shape[1])
    picked = p2[xp.arange(p2.shape[0]), label]
    return (-_clamped_log(picked, xp)).astype(p.dtype),


@register_gradient("LabelCrossEntropy")
def _label_cross_entropy_grad(g: GradientBuilder) -> None:
    g.add("LabelCrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("LabelCrossEntropyGradient", inputs=3, outputs=1, shape=like_inputs(0))
def label_cross_entropy_gradient(ctx: OpContext) -> Outputs:
    """[P, label, dY] -> dP = -dY / max(P[i, label_i], 1e-20) at the label, 0 elsewhere."""
    xp = ctx.xp
    p, label, dy = ctx.inputs
    p2 = _probability_rows(p)
    label = _labels(ctx, label, p2.shape[0], p2.shape[1])
    rows = xp.arange(p2.shape[0])
    dp = xp.zeros_like(p2)
    dp[rows, label] = -xp.asarray(dy).reshape(-1) / xp.maximum(p2[rows, label], _LOG_THRESHOLD)
    return (dp.reshape(p.shape),)


@register_op("CrossEntropy", inputs=2, outputs=1, shape=_matrix_rows_shape)
def cross_entropy(ctx: OpContext) -> Outputs:
    """[P (N×D), soft labels (N×D)] -> -Σ_j label_ij·log(max(P_ij, 1e-20))."""
    xp = ctx.xp
    p, label = ctx.inputs
    p2 = _probability_rows(p)
    out = -(xp.asarray(label).reshape(p2.shape) * _clamped_log(p2, xp)).sum(axis=1)
    return (out.astype(p.dtype),)


@register_gradient("CrossEntropy")
def _cross_entropy_grad(g: GradientBuilder) -> None:
    g.add("CrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("CrossEntropyGradient", inputs=3, outputs=1, shape=like_inputs(0))
def cross_entropy_gradient(ctx: OpContext) -> Outputs:
    """[P, label, dY] -> dP = -dY·label / max(P, 1e-20)."""
    xp = ctx.xp
    p, label, dy = ctx.inputs
    p2 = _probability_rows(p)
    dp = (-xp.asarray(dy).reshape(-1, 1) * xp.asarray(label).reshape(p2.shape)
          / xp.maximum(p2, _LOG_THRESHOLD))
    return (dp.astype(p.dtype).reshape(p.shape),)


@register_op("MakeTwoClass", inputs=1, outputs=1,
             shape=lambda op, s, t: [None if s[0] is None else ((*s[0], 2), t[0] or FLOAT)])
def make_two_class(ctx: OpContext) -> Outputs:
    """X -> Y[..., 2] with Y[..., 0] = 1 - X and Y[..., 1] = X."""
    x = ctx.inputs[0]
    return (ctx.xp.stack([1 - x, x], axis=-1).astype(x.dtype),)


@register_gradient("MakeTwoClass")
def _make_two_class_grad(g: GradientBuilder) -> None:
    g.add("MakeTwoClassGradient", [g.GO(0)], [g.GI(0)])


@register_op("MakeTwoClassGradient", inputs=1, outputs=1)
def make_two_class_gradient(ctx: OpContext) -> Outputs:
    """dY[..., 2] -> dX = dY[..., 1] - dY[..., 0]."""
    dy = ctx.inputs[0]
    return (dy[..., 1] - dy[..., 0],)


# --- distances and averages ------------------------------------------------------------------
def _rows(x: Any) -> Any:
    """[N, D] view: N = first dim (1 for a scalar), D = the rest."""
    n = x.shape[0] if x.ndim else 1
    return x.reshape(n, -1) if n else x.reshape(0, 0)


@register_op("SquaredL2Distance", inputs=2, outputs=1, shape=_batch_shape)
def squared_l2_distance(ctx: OpContext) -> Outputs:
    """[X, Y] -> 0.5·Σ(X-Y)² over the non-batch dims (an N-vector)."""
    x, y = ctx.inputs
    if x.shape != y.shape:
        raise ctx.fail(f"X and Y must have the same shape, got {x.shape} and {y.shape}")
    diff = _rows(x) - _rows(y)
    return ((0.5 * (diff * diff).sum(axis=1)).astype(x.dtype),)


@register_gradient("SquaredL2Distance")
def _squared_l2_distance_grad(g: GradientBuilder) -> None:
    g.add("SquaredL2DistanceGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])


@register_op("SquaredL2DistanceGradient", inputs=3, outputs=2,
             shape=like_inputs(0, 1))
def squared_l2_distance_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dD] -> [dX = (X-Y)·dD, dY = -dX]."""
    x, y, dd = ctx.inputs
    dx = (_rows(x) - _rows(y)) * ctx.xp.asarray(dd).reshape(-1, 1)
    dx = dx.astype(x.dtype).reshape(x.shape)
    return dx, -dx


@register_op("AveragedLoss", inputs=1, outputs=1, shape=_scalar_shape)
def averaged_loss(ctx: OpContext) -> Outputs:
    """X -> mean of all elements, a 0-d array."""
    x = ctx.inputs[0]
    mean = x.sum() / x.size if x.size else 0.0
    return (ctx.xp.asarray(mean, dtype=x.dtype),)


@register_gradient("AveragedLoss")
def _averaged_loss_grad(g: GradientBuilder) -> None:
    g.add("AveragedLossGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@register_op("AveragedLossGradient", inputs=2, outputs=1, shape=like_inputs(0))
def averaged_loss_gradient(ctx: OpContext) -> Outputs:
    """[X, dL] -> dX = dL / numel(X) everywhere."""
    x, dl = ctx.inputs
    value = float(ctx.xp.asarray(dl).reshape(-1)[0]) / max(x.size, 1)
    return (ctx.xp.full(x.shape, value, dtype=x.dtype),)


@register_op("Accuracy", inputs=2, outputs=1, shape=_scalar_shape)
def accuracy(ctx: OpContext) -> Outputs:
    """[prediction N×D, label N] -> fraction of rows whose label is in the top_k (0-d)."""
    xp = ctx.xp
    pred = ctx.inputs[0]
    p2 = pred.reshape(pred.shape[0], -1)
    n, d = p2.shape
    label = _labels(ctx, ctx.inputs[1], n, d)
    top_k = ctx.int_arg("top_k", 1)
    score = p2[xp.arange(n), label][:, None]
    cols = xp.arange(d)[None, :]
    ahead = ((p2 > score) | ((p2 == score) & (cols < label[:, None]))).sum(axis=1)
    value = float((ahead < top_k).sum()) / n if n else 0.0
    return (xp.asarray(value, dtype=np.float32),)


@register_op("DotProduct", inputs=2, outputs=1, shape=_batch_shape)
def dot_product(ctx: OpContext) -> Outputs:
    """[X, Y] (N×D) -> row-wise dot products (N)."""
    x, y = ctx.inputs
    if x.shape != y.shape:
        raise ctx.fail(f"X and Y must have the same shape, got {x.shape} and {y.shape}")
    return ((_rows(x) * _rows(y)).sum(axis=1).astype(x.dtype),)


@register_gradient("DotProduct")
def _dot_product_grad(g: GradientBuilder) -> None:
    g.add("DotProductGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])


@register_op("DotProductGradient", inputs=3, outputs=2)
def dot_product_gradient(ctx: OpContext) -> Outputs:
    """[X, Y, dDot] -> [dX = Y·dDot, dY = X·dDot]."""
    x, y, dd = ctx.inputs
    col = ctx.xp.asarray(dd).reshape(-1, 1)
    return ((_rows(y) * col).astype(x.dtype).reshape(x.shape),
            (_rows(x) * col).astype(y.dtype).reshape(y.shape))


# --- ranking / embedding criteria ------------------------------------------------------------
@register_op("CosineEmbeddingCriterion", inputs=2, outputs=1, shape=like_inputs(0))
def cosine_embedding_criterion(ctx: OpContext) -> Outputs:
    """[S, Y (±1)] -> 1 - S where Y == 1, else max(0, S - margin)."""
    s, y = ctx.inputs
    margin = ctx.float_arg("margin", 0.0)
    out = ctx.xp.where(y == 1, 1 - s, ctx.xp.maximum(s - margin, 0))
    return (out.astype(s.dtype),)


@register_gradient("CosineEmbeddingCriterion")
def _cosine_embedding_criterion_grad(g: GradientBuilder) -> None:
    g.add("CosineEmbeddingCriterionGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@register_op("CosineEmbeddingCriterionGradient", inputs=3, outputs=1, shape=like_inputs(0))
def cosine_embedding_criterion_gradient(ctx: OpContext) -> Outputs:
    """[S, Y, dOut] -> dS = -dOut where Y == 1, else dOut·[S >= margin]."""
    s, y, dout = ctx.inputs
    margin = ctx.float_arg("margin", 0.0)
    factor = ctx.xp.where(y == 1, -1.0, (s >= margin).astype(s.dtype))
    return ((dout * factor).astype(s.dtype),)


@register_op("MarginRankingCriterion", inputs=3, outputs=1, shape=like_inputs(0))
def margin_ranking_criterion(ctx: OpContext) -> Outputs:
    """[X1, X2, Y (±1)] -> max(0, -Y·(X1 - X2) + margin)."""
    x1, x2, y = ctx.inputs
    margin = ctx.float_arg("margin", 0.0)
    return (ctx.xp.maximum(-y * (x1 - x2) + margin, 0).astype(x1.dtype),)


@register_gradient("MarginRankingCriterion")
def _margin_ranking_criterion_grad(g: GradientBuilder) -> None:
    g.add("MarginRankingCriterionGradient", [g.I(0), g.I(1), g.I(2), g.GO(0)],
          [g.GI(0), g.GI(1)])


@register_op("MarginRankingCriterionGradient", inputs=4, outputs=2)
def margin_ranking_criterion_gradient(ctx: OpContext) -> Outputs:
    """[X1, X2, Y, dLoss] -> [dX1 = -Y·dLoss where active, dX2 = -dX1]."""
    x1, x2, y, dl = ctx.inputs
    margin = ctx.float_arg("margin", 0.0)
    active = (-y * (x1 - x2) + margin) > 0
    dx1 = ctx.xp.where(active, -y * dl, 0).astype(x1.dtype)
    return dx1, (-dx1).astype(x2.dtype)


def _entropy(x: Any, xp: Any) -> Any:
    return -(x * _clamped_log(x, xp) + (1 - x) * _clamped_log(1 - x, xp))


@register_op("BernoulliJSD", inputs=2, outputs=1, shape=like_inputs(0))
def bernoulli_jsd(ctx: OpContext) -> Outputs:
    """[p, q] -> Jensen-Shannon divergence of Bernoulli(p) and Bernoulli(q), elementwise."""
    xp = ctx.xp
    p, q = ctx.inputs
    m = (p + q) / 2
    out = _entropy(m, xp) - (_entropy(p, xp) + _entropy(q, xp)) / 2
    return (out.astype(p.dtype),)


@register_gradient("BernoulliJSD")
def _bernoulli_jsd_grad(g: GradientBuilder) -> None:
    g.add("BernoulliJSDGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0)])


@register_op("BernoulliJSDGradient", inputs=3, outputs=1)
def bernoulli_jsd_gradient(ctx: OpContext) -> Outputs:
    """[dl, p, q] -> dp = dl·(logit(p) - logit(m)) / 2 with m = (p + q) / 2."""
    xp = ctx.xp
    dl, p, q = ctx.inputs
    m = (p + q) / 2

    def logit(v: Any) -> Any:
        return _clamped_log(v, xp) - _clamped_log(1 - v, xp)

    return ((dl * (logit(p) - logit(m)) / 2).astype(p.dtype),)


# --- pairwise ranking ------------------------------------------------------------------------
def _groups(ctx: OpContext, n: int, lengths: Any | None) -> Any:
    """Group boundaries from the optional lengths input (one group of all rows by default)."""
    lens = (np.array([n], np.int64) if lengths is None
            else np.asarray(lengths).reshape(-1).astype(np.int64))
    if int(lens.sum()) != n:
        raise ctx.fail(f"lengths sum to {int(lens.sum())}, expected {n} rows")
    return np.r_[0, np.cumsum(lens)]


def _pair_terms(x: Any, label: Any) -> tuple[Any, Any, int]:
    """(sign matrix s_ij = sign(l_i - l_j), score differences x_i - x_j, number of pairs)."""
    sign = np.sign(label[:, None] - label[None, :])
    return sign, x[:, None] - x[None, :], int((sign != 0).sum())


def _sigmoid(u: Any) -> Any:
    """1 / (1 + exp(-u)) without overflow."""
    e = np.exp(-np.abs(u))
    return np.where(u >= 0, 1 / (1 + e), e / (1 + e))


def _softplus_neg(u: Any) -> Any:
    """log(1 + exp(-u)), computed stably."""
    return np.logaddexp(0, -u)


@register_op("PairWiseLoss", inputs=(2, 3), outputs=1)
def pair_wise_loss(ctx: OpContext) -> Outputs:
    """[X (N), label (N)(, lengths)] -> per group, mean over pairs with different labels of
    log(1 + exp(-sign(l_i - l_j)·(x_i - x_j)))."""
    x = np.asarray(ctx.inputs[0])
    xs, labels = x.reshape(-1), np.asarray(ctx.inputs[1]).reshape(-1)
    bounds = _groups(ctx, xs.size, ctx.inputs[2] if len(ctx.inputs) > 2 else None)
    out = np.zeros(bounds.size - 1, dtype=x.dtype)
    for g in range(bounds.size - 1):
        lo, hi = bounds[g], bounds[g + 1]
        sign, diff, pairs = _pair_terms(xs[lo:hi], labels[lo:hi])
        if pairs:
            out[g] = (_softplus_neg(sign * diff) * (sign != 0)).sum() / pairs
    return (out,)


@register_gradient("PairWiseLoss")
def _pair_wise_loss_grad(g: GradientBuilder) -> None:
    extra = [g.I(2)] if len(g.op.input) > 2 else []
    g.add("PairWiseLossGradient", [g.I(0), g.I(1), g.GO(0), *extra], [g.GI(0)])


@register_op("PairWiseLossGradient", inputs=(3, 4), outputs=1, shape=like_inputs(0))
def pair_wise_loss_gradient(ctx: OpContext) -> Outputs:
    """[X, label, dY(, lengths)] -> dX."""
    x = np.asarray(ctx.inputs[0])
    xs, labels = x.reshape(-1), np.asarray(ctx.inputs[1]).reshape(-1)
    dy = np.asarray(ctx.inputs[2]).reshape(-1)
    bounds = _groups(ctx, xs.size, ctx.inputs[3] if len(ctx.inputs) > 3 else None)
    dx = np.zeros(xs.size, dtype=x.dtype)
    for g in range(bounds.size - 1):
        lo, hi = bounds[g], bounds[g + 1]
        sign, diff, pairs = _pair_terms(xs[lo:hi], labels[lo:hi])
        if pairs:
            # d/du log(1 + exp(-u)) = -sigmoid(-u); each unordered pair appears twice.
            slope = -sign * _sigmoid(-sign * diff)
            dx[lo:hi] = 2 * dy[g] * slope.sum(axis=1) / pairs
    return (dx.reshape(x.shape),)
