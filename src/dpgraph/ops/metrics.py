"""Evaluation metrics: Perplexity and MultiClassAccuracy (no gradients)."""

from __future__ import annotations

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient


@register_op("Perplexity", inputs=1, outputs=1)
def perplexity(ctx: OpContext) -> Outputs:
    """TARGET_PROBABILITIES [N] -> the 0-d float ``prod(p ** (-1 / N))``."""
    p = host(ctx.inputs[0]).reshape(-1).astype(np.float64)
    if p.size and float(p.min()) <= 0.0:
        raise ctx.fail("target probabilities must be > 0 (the perplexity of 0 is infinite)")
    value = float(np.prod(np.power(p, -1.0 / p.size))) if p.size else 1.0
    return (np.asarray(value, dtype=np.float32),)


@register_op("MultiClassAccuracy", inputs=2, outputs=2)
def multi_class_accuracy(ctx: OpContext) -> Outputs:
    """PREDICTION [N, D], LABELS [N] -> per class: the accuracy (float) among its examples
    (the arg-max, first on ties, equals the label) and the number of examples (int32)."""
    prediction = np.asarray(host(ctx.inputs[0]))
    labels = host(ctx.inputs[1]).reshape(-1).astype(np.int64)
    if prediction.ndim != 2 or labels.size != prediction.shape[0]:
        raise ctx.fail(f"PREDICTION must be [N, D] and LABELS [N]; got {prediction.shape} and "
                       f"{labels.size} labels")
    classes = prediction.shape[1]
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ctx.fail(f"labels must be in [0, {classes}); got {labels.tolist()[:10]}")
    amounts = np.bincount(labels, minlength=classes)
    hits = np.bincount(labels[prediction.argmax(axis=1) == labels], minlength=classes)
    accuracies = np.divide(hits, amounts, out=np.zeros(classes), where=amounts > 0)
    return accuracies.astype(np.float32), amounts.astype(np.int32)


for _type in ("Perplexity", "MultiClassAccuracy"):
    register_gradient(_type)(no_gradient)
