"""The ``GREEDY`` engine of Caffe2's N-bit row-wise quantizers: per row, shrink the
quantization range ``[xmin, xmax]`` one bin at a time from whichever end lowers the L2
quantization error more, and keep the best local optimum seen.

Caffe2's search (``param_search_greedy``): ``n_bins = 200``, ``ratio = 0.16``, step
``(xmax - xmin) / n_bins``; it walks while ``cur_min + 168 · step < cur_max``; at each
step it evaluates both moves, records ``(cur_min, cur_max)`` when the current loss is below
both moves' losses and below the best so far, then takes the better move (the right end on
ties).  The loss quantizes with a float16 ``xmin`` and a float16 scale
(``xmax - xmin) / (2**bits - 1)``, rounds to nearest even, clips to ``[0, 2**bits - 1]``
and returns ``sqrt(Σ (x - x̂)²)``.  All rows walk together here (vectorised), each with its
own stop condition; the arithmetic is float32.
"""

from __future__ import annotations

import numpy as np

from dpgraph.ops._rowwise_format import F32, half

N_BINS = 200
RATIO = 0.16


def quantization_loss(x: np.ndarray, xmin: np.ndarray, xmax: np.ndarray, bits: int
                      ) -> np.ndarray:
    """L2 error of quantizing each row of ``x`` [R, N] to ``bits`` bits over
    ``[xmin, xmax]`` (float32 [R])."""
    lo = half(xmin)
    span = (xmax - lo).astype(F32)
    qmax = F32((1 << bits) - 1)
    scale = np.where(span == 0, F32(1), half(span / qmax)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverse = (F32(1) / scale).astype(F32)
        codes = np.clip(np.rint((x - lo[:, None]) * inverse[:, None]), F32(0), qmax)
        err = x - (codes * scale[:, None] + lo[:, None])
        return np.sqrt(np.einsum("ij,ij->i", err, err, dtype=F32)).astype(F32)


def greedy_range(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Caffe2's greedy ``(xmin, xmax)`` for each row of ``x`` [R, N] (float32)."""
    best_min = x.min(axis=1).astype(F32)
    best_max = x.max(axis=1).astype(F32)
    step = ((best_max - best_min) / F32(N_BINS)).astype(F32)
    threshold = (F32(int(N_BINS * (1 - F32(RATIO)))) * step).astype(F32)
    cur_min, cur_max = best_min.copy(), best_max.copy()
    cur_loss = quantization_loss(x, cur_min, cur_max, bits)
    best_loss = cur_loss.copy()
    active = np.flatnonzero(cur_min + threshold < cur_max)
    while active.size:
        rows, st = x[active], step[active]
        lo, hi, loss = cur_min[active], cur_max[active], cur_loss[active]
        left = quantization_loss(rows, lo + st, hi, bits)
        right = quantization_loss(rows, lo, hi - st, bits)
        optimum = (loss < left) & (loss < right) & (loss < best_loss[active])
        hit = active[optimum]
        best_loss[hit], best_min[hit], best_max[hit] = loss[optimum], lo[optimum], hi[optimum]
        go_left = left < right
        cur_min[active] = np.where(go_left, lo + st, lo)
        cur_max[active] = np.where(go_left, hi, hi - st)
        cur_loss[active] = np.where(go_left, left, right)
        active = active[cur_min[active] + threshold[active] < cur_max[active]]
    return best_min, best_max
