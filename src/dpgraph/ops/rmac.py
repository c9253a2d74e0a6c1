"""``RMACRegions`` (Caffe2's rmac_regions_op): the fixed grid of square R-MAC regions
(arXiv:1511.05879) of an NCHW feature map, as RoIPool rows ``[batch, x1, y1, x2, y2]``.

At scale ``l`` (1..``scales``, default 3) the region side is ``2·min(H, W) // (l + 1)``;
the long side gets ``step`` extra regions, the step in 1..6 whose overlap between
consecutive regions is closest to ``overlap`` (default 0.4).  The grid is repeated for
every batch item.  No gradient.
"""

from __future__ import annotations

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.proto import caffe2_pb2


def _long_side_step(h: int, w: int, overlap: np.float32) -> int:
    """Extra regions along the long side (0 for a square map); float32 math as Caffe2."""
    if h == w:
        return 0
    short = np.float32(min(h, w))
    best, best_gap = 0, np.float32(np.inf)
    for step in range(1, 7):
        b = np.float32((max(h, w) - min(h, w)) / step)
        gap = np.abs((short * short - short * b) / (short * short) - overlap)
        if gap < best_gap:
            best, best_gap = step, gap
    return best


def _origins(extent: int, side: int, count: int) -> list[int]:
    """``count`` evenly spaced region starts along one axis, pulled back inside ``extent``."""
    spacing = np.float32((extent - side) / (count - 1) if count > 1 else 0.0)
    return [min(int(spacing * np.float32(i)), extent - side) for i in range(count)]


def rmac_grid(h: int, w: int, scales: int, overlap: np.float32) -> np.ndarray:
    """Regions (R, 4) as ``x1, y1, x2, y2`` for one H×W map."""
    step = _long_side_step(h, w, overlap)
    extra_w, extra_h = (step if w > h else 0), (step if h > w else 0)
    rows = []
    for level in range(1, scales + 1):
        side = 2 * min(h, w) // (level + 1)
        if side == 0:
            break
        xs = _origins(w, side, level + extra_w)
        ys = _origins(h, side, level + extra_h)
        rows += [(x, y, x + side - 1, y + side - 1) for x in xs for y in ys]
    return np.asarray(rows, dtype=np.float32).reshape(-1, 4)


def _rmac_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    return [None]


@register_op("RMACRegions", inputs=1, outputs=1, shape=_rmac_shape)
def rmac_regions(ctx: OpContext) -> Outputs:
    """X (N, C, H, W) -> regions (N·R, 5) float: [batch index, x1, y1, x2, y2]."""
    x = ctx.inputs[0]
    if x.size == 0:
        return (np.zeros((0, 5), np.float32),)
    if x.ndim != 4:
        raise ctx.fail(f"X must be a 4-D NCHW tensor, got shape {x.shape}")
    grid = rmac_grid(x.shape[2], x.shape[3], ctx.int_arg("scales", 3),
                     np.float32(ctx.float_arg("overlap", 0.4)))
    n = x.shape[0]
    batch = np.repeat(np.arange(n, dtype=np.float32), len(grid))[:, None]
    return (np.concatenate([batch, np.tile(grid, (n, 1))], axis=1),)


register_gradient("RMACRegions")(no_gradient)
