"""CRF decoding helpers: ``ViterbiPath`` (the best tag path through an ``N x D`` prediction
matrix and a ``D x D`` transition matrix) and ``SwapBestPath`` (swaps, in every row, the
score of the row's best tag with the score of the tag on a given path, so the path becomes
each row's argmax).  Neither has a gradient.

Ties go to the lowest index (as Eigen's ``maxCoeff`` picks them).
"""

from __future__ import annotations

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient


@register_op("ViterbiPath", inputs=2, outputs=1)
def viterbi_path(ctx: OpContext) -> Outputs:
    """[predictions (N x D), transitions (D x D)] -> int32 [N]: the best-scoring tag path."""
    predictions, transitions = (np.asarray(host(v)) for v in ctx.inputs)
    if predictions.ndim != 2 or transitions.ndim != 2:
        raise ctx.fail(f"Predictions and transitions hold 2D matrices; got shapes "
                       f"{list(predictions.shape)} and {list(transitions.shape)}")
    if predictions.shape[1] != transitions.shape[0] or \
            transitions.shape[0] != transitions.shape[1]:
        raise ctx.fail(f"Predictions and transitions dimensions not matching: "
                       f"{list(predictions.shape)} vs {list(transitions.shape)}")
    steps = predictions.shape[0]
    if steps == 0:
        raise ctx.fail(f"predictions {ctx.input_name(0)!r} has no rows")
    scores = predictions.astype(np.float32)
    trans = transitions.astype(np.float32)
    back = np.zeros(predictions.shape, np.int32)
    trellis = scores[0].copy()
    for t in range(1, steps):
        candidates = trellis[:, None] + trans
        back[t] = np.argmax(candidates, axis=0)
        trellis = scores[t] + candidates.max(axis=0)
    path = [int(np.argmax(trellis))]
    for t in range(steps - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return (np.array(path[::-1], np.int32),)


@register_op("SwapBestPath", inputs=2, outputs=1)
def swap_best_path(ctx: OpContext) -> Outputs:
    """[predictions (N x D), bestPath (N)] -> predictions with, per row, the scores of the
    row's argmax and of ``bestPath[i]`` swapped."""
    data, best = (np.asarray(host(v)) for v in ctx.inputs)
    if data.ndim != 2 or best.ndim != 1:
        raise ctx.fail("predictions should be a 2D matrix and bestPath should be 1D vector; "
                       f"got shapes {list(data.shape)} and {list(best.shape)}")
    if data.shape[0] != best.shape[0]:
        raise ctx.fail(f"predictions and bestPath dimensions not matching: {data.shape[0]} "
                       f"rows vs {best.shape[0]} path entries")
    new_idx = best.astype(np.int64)
    if new_idx.size and (int(new_idx.min()) < 0 or int(new_idx.max()) >= data.shape[1]):
        raise ctx.fail(f"bestPath entries must be in [0, {data.shape[1]}), got "
                       f"{new_idx.tolist()[:10]}")
    out = data.astype(np.float32, copy=True)
    rows = np.arange(data.shape[0])
    old_idx = np.argmax(out, axis=1) if data.shape[1] else np.zeros(0, np.int64)
    old_vals = out[rows, old_idx].copy()
    out[rows, old_idx] = out[rows, new_idx]
    out[rows, new_idx] = old_vals
    return (out,)


for _type in ("ViterbiPath", "SwapBestPath"):
    register_gradient(_type)(no_gradient)
