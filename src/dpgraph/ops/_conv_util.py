"""Shared geometry and im2col helpers for convolution and pooling kernels.

Everything here works on the channel-first layout ``(N, C, *spatial)``; kernels for NHWC
move the channel axis first (a free view) and back.  Windows are strided *views*
(``as_strided``) so im2col costs one contiguous copy and convolutions become one batched
matmul; the adjoint (col2im) is a scatter-add loop over kernel offsets only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from dpgraph.errors import ArgumentError, NotSupportedError
from dpgraph.ops.context import OpContext

_LEGACY_NOTSET, _LEGACY_VALID, _LEGACY_SAME = 0, 1, 2


@dataclass(frozen=True)
class Geometry:
    """Window geometry over ``nd`` spatial dims; pads are (head, tail) per dim."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad_head: tuple[int, ...]
    pad_tail: tuple[int, ...]
    dilation: tuple[int, ...]
    group: int = 1

    @property
    def nd(self) -> int:
        return len(self.kernel)

    @property
    def extent(self) -> tuple[int, ...]:
        """Dilated kernel extent per dim."""
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))

    def out_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """Caffe2's output size: floor((S + pads - extent) / stride) + 1."""
        return tuple((s + ph + pt - e) // st + 1 for s, ph, pt, e, st in
                     zip(spatial, self.pad_head, self.pad_tail, self.extent, self.stride))

    def padded(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(s + ph + pt for s, ph, pt in zip(spatial, self.pad_head, self.pad_tail))


def _per_dim(ctx: OpContext, nd: int, plural: str, single: str, names2d: tuple[str, str],
             default: int | None) -> list[int] | None:
    """Read a per-dim int argument: ``plural`` list, ``single`` int or the 2-D h/w pair."""
    if ctx.has_arg(plural):
        values = ctx.ints_arg(plural)
        if len(values) != nd:
            raise ArgumentError(ctx.describe(
                f"argument {plural!r} has {len(values)} values for {nd} spatial dims"))
        return values
    if ctx.has_arg(single):
        return [ctx.int_arg(single)] * nd
    if nd == 2 and any(ctx.has_arg(n) for n in names2d):
        return [ctx.int_arg(n, default or 0) for n in names2d]
    return None if default is None else [default] * nd


def _pads(ctx: OpContext, nd: int) -> tuple[list[int], list[int]]:
    if ctx.has_arg("pads"):
        pads = ctx.ints_arg("pads")
        if len(pads) != 2 * nd:
            raise ArgumentError(ctx.describe(
                f"argument 'pads' needs {2 * nd} values (heads then tails), got {len(pads)}"))
        return pads[:nd], pads[nd:]
    if ctx.has_arg("pad"):
        pad = ctx.int_arg("pad")
        return [pad] * nd, [pad] * nd
    if nd == 2:
        return ([ctx.int_arg("pad_t", 0), ctx.int_arg("pad_l", 0)],
                [ctx.int_arg("pad_b", 0), ctx.int_arg("pad_r", 0)])
    return [0] * nd, [0] * nd


def parse_geometry(ctx: OpContext, spatial: tuple[int, ...],
                   kernel_shape: tuple[int, ...] | None = None,
                   pooling: bool = False) -> Geometry:
    """Window geometry from Caffe2's ConvPoolOpBase arguments.

    ``kernel_shape`` (the filter's spatial dims) is used when no kernel argument is given;
    ``global_pooling`` (pooling only) makes the window the whole input.
    """
    nd = len(spatial)
    if pooling and ctx.int_arg("global_pooling", 0):
        return Geometry(tuple(spatial), (1,) * nd, (0,) * nd, (0,) * nd, (1,) * nd)
    kernel = _per_dim(ctx, nd, "kernels", "kernel", ("kernel_h", "kernel_w"), None)
    if kernel is None:
        if kernel_shape is None:
            raise ArgumentError(ctx.describe(
                "no kernel size: set 'kernel', 'kernel_h'/'kernel_w' or 'kernels'"))
        kernel = list(kernel_shape)
    stride = _per_dim(ctx, nd, "strides", "stride", ("stride_h", "stride_w"), 1)
    dilation = _per_dim(ctx, nd, "dilations", "dilation", ("dilation_h", "dilation_w"), 1)
    assert stride is not None and dilation is not None
    head, tail = _pads(ctx, nd)
    legacy = ctx.int_arg("legacy_pad", _LEGACY_NOTSET)
    if legacy == _LEGACY_VALID:
        head, tail = [0] * nd, [0] * nd
    elif legacy == _LEGACY_SAME:
        head, tail = [], []
        for s, k, st, d in zip(spatial, kernel, stride, dilation):
            out = -(-s // st)
            need = max((out - 1) * st + d * (k - 1) + 1 - s, 0)
            head.append(need // 2)
            tail.append(need - need // 2)
    elif legacy != _LEGACY_NOTSET:
        raise NotSupportedError(ctx.describe(
            f"legacy_pad={legacy} is not supported; use explicit pads (legacy_pad 0, 1 or 2)"))
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(head + tail) < 0:
        raise ArgumentError(ctx.describe(
            f"invalid geometry kernel={kernel} stride={stride} dilation={dilation} "
            f"pads={head + tail}"))
    group = ctx.int_arg("group", 1)
    return Geometry(tuple(kernel), tuple(stride), tuple(head), tuple(tail), tuple(dilation),
                    group)


def channel_first(x: Any, order: str) -> Any:
    """``x`` viewed as (N, C, *spatial); NHWC inputs are re-viewed without a copy."""
    return x if order == "NCHW" else x.transpose(0, x.ndim - 1, *range(1, x.ndim - 1))


def channel_last(x: Any, order: str, xp: Any) -> Any:
    """Inverse of :func:`channel_first`, made contiguous for NHWC."""
    if order == "NCHW":
        return x
    return xp.ascontiguousarray(x.transpose(0, *range(2, x.ndim), 1))


def check_order(ctx: OpContext) -> str:
    order = ctx.str_arg("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise ArgumentError(ctx.describe(f"order must be 'NCHW' or 'NHWC', got {order!r}"))
    return order


def pad_spatial(xp: Any, x: Any, geom: Geometry, value: float = 0.0) -> Any:
    """``x`` (N, C, *S) padded with ``value`` by the geometry's head/tail pads."""
    if not any(geom.pad_head) and not any(geom.pad_tail):
        return x
    shape = x.shape[:2] + geom.padded(x.shape[2:])
    out = xp.full(shape, value, dtype=x.dtype)
    out[inner_slices(geom, x.shape[2:])] = x
    return out


def inner_slices(geom: Geometry, spatial: tuple[int, ...]) -> tuple[slice, ...]:
    """Index of the unpadded region inside a padded (N, C, *S) array."""
    return (slice(None), slice(None),
            *(slice(h, h + s) for h, s in zip(geom.pad_head, spatial)))


def window_view(xp: Any, x: Any, geom: Geometry, out: tuple[int, ...]) -> Any:
    """Read-only view (N, C, *kernel, *out) of the windows of padded ``x`` (N, C, *S)."""
    strides = x.strides
    sp = strides[2:]
    shape = (*x.shape[:2], *geom.kernel, *out)
    new = (*strides[:2], *(s * d for s, d in zip(sp, geom.dilation)),
           *(s * t for s, t in zip(sp, geom.stride)))
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=new)


def offset_slices(geom: Geometry, out: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple]]:
    """For each kernel offset: (offset, index of the matching strided block of a padded array)."""
    result = []
    for offset in itertools.product(*(range(k) for k in geom.kernel)):
        block = tuple(slice(i * d, i * d + (o - 1) * s + 1, s) if o > 0 else slice(0, 0)
                      for i, d, o, s in zip(offset, geom.dilation, out, geom.stride))
        result.append((offset, (slice(None), slice(None), *block)))
    return result


def im2col(xp: Any, x: Any, geom: Geometry, out: tuple[int, ...]) -> Any:
    """Contiguous columns (N, G, C/G * K, P) of padded ``x`` (N, C, *S)."""
    n, c = x.shape[:2]
    cols = xp.ascontiguousarray(window_view(xp, x, geom, out))
    return cols.reshape(n, geom.group, (c // geom.group) * math.prod(geom.kernel),
                        math.prod(out))


def col2im(xp: Any, cols: Any, geom: Geometry, out: tuple[int, ...],
           padded: tuple[int, ...]) -> Any:
    """Adjoint of :func:`im2col`: scatter-add cols (N, C, *kernel, *out) into (N, C, *padded)."""
    n, c = cols.shape[:2]
    target = xp.zeros((n, c, *padded), dtype=cols.dtype)
    lead = (slice(None), slice(None))
    for offset, block in offset_slices(geom, out):
        target[block] += cols[(*lead, *offset)]
    return target


def summed_matmul(xp: Any, a: Any, b: Any) -> Any:
    """``matmul(a, b).sum(axis=0)`` (a sum over the batch of per-sample products, the weight
    gradient) accumulated in batch order into one buffer instead of materialising all N
    products; on the host the same additions in the same order, so the same values."""
    if a.shape[0] == 0:  # an empty batch: zeros of the product's shape
        return xp.matmul(a, b).sum(axis=0)
    total = xp.matmul(a[0], b[0])
    if a.shape[0] > 1:
        product = xp.empty_like(total)
        for index in range(1, a.shape[0]):
            xp.matmul(a[index], b[index], out=product)
            total += product
    return total


def conv_forward(xp: Any, x: Any, w: Any, geom: Geometry) -> Any:
    """Convolution (N, C, *S) * (M, C/G, *k) -> (N, M, *out), channel-first."""
    n = x.shape[0]
    m, g = w.shape[0], geom.group
    out = geom.out_shape(x.shape[2:])
    cols = im2col(xp, pad_spatial(xp, x, geom), geom, out)
    y = xp.matmul(w.reshape(g, m // g, -1), cols)
    return y.reshape(n, m, *out)


def conv_backward(xp: Any, x: Any, w: Any, dy: Any, geom: Geometry,
                  need_dx: bool = True) -> tuple[Any, Any]:
    """(dW, dX) of :func:`conv_forward`; dX is ``None`` unless ``need_dx``."""
    n, c = x.shape[:2]
    m, g = w.shape[0], geom.group
    out = dy.shape[2:]
    xpad = pad_spatial(xp, x, geom)
    cols = im2col(xp, xpad, geom, out)
    dy2 = dy.reshape(n, g, m // g, math.prod(out))
    dw = summed_matmul(xp, dy2, cols.swapaxes(-1, -2)).reshape(w.shape)
    if not need_dx:
        return dw, None
    if _dx_as_conv(geom):
        return dw, _conv_input_grad(xp, w, dy, geom)
    dcols = xp.matmul(w.reshape(g, m // g, -1).swapaxes(-1, -2), dy2)
    dcols = dcols.reshape(n, c, *geom.kernel, *out)
    dxpad = col2im(xp, dcols, geom, out, xpad.shape[2:])
    return dw, dxpad[inner_slices(geom, x.shape[2:])]


def _dx_as_conv(geom: Geometry) -> bool:
    """Stride-1 input gradients are cheaper as a full correlation than as col2im."""
    return all(s == 1 for s in geom.stride) and all(
        h < e and t < e for h, t, e in zip(geom.pad_head, geom.pad_tail, geom.extent))


def _conv_input_grad(xp: Any, w: Any, dy: Any, geom: Geometry) -> Any:
    """dX of a stride-1 convolution: dY, padded to full size, correlated with flipped W."""
    g = geom.group
    m, cg = w.shape[:2]
    nd = geom.nd
    wt = w.reshape(g, m // g, cg, *geom.kernel).swapaxes(1, 2)
    wt = wt[(slice(None), slice(None), slice(None), *(slice(None, None, -1),) * nd)]
    wt = wt.reshape(g * cg, m // g, *geom.kernel)
    back = Geometry(geom.kernel, geom.stride,
                    tuple(e - 1 - h for e, h in zip(geom.extent, geom.pad_head)),
                    tuple(e - 1 - t for e, t in zip(geom.extent, geom.pad_tail)),
                    geom.dilation, g)
    return conv_forward(xp, dy, xp.ascontiguousarray(wt), back)


def conv_transpose_forward(xp: Any, x: Any, w: Any, geom: Geometry,
                           adj: tuple[int, ...]) -> Any:
    """Transposed convolution (N, C, *S) with W (C, M/G, *k) -> (N, M, *out), channel-first."""
    n, c = x.shape[:2]
    g = geom.group
    mg = w.shape[1]
    spatial = x.shape[2:]
    full = tuple((s - 1) * st + e + a for s, st, e, a in
                 zip(spatial, geom.stride, geom.extent, adj))
    x2 = x.reshape(n, g, c // g, math.prod(spatial))
    cols = xp.matmul(w.reshape(g, c // g, -1).swapaxes(-1, -2), x2)
    cols = cols.reshape(n, g * mg, *geom.kernel, *spatial)
    ypad = col2im(xp, cols, geom, spatial, full)
    out = tuple(f - h - t for f, h, t in zip(full, geom.pad_head, geom.pad_tail))
    return ypad[inner_slices(geom, out)]


def conv_transpose_backward(xp: Any, x: Any, w: Any, dy: Any, geom: Geometry,
                            need_dx: bool = True) -> tuple[Any, Any]:
    """(dW, dX) of :func:`conv_transpose_forward`."""
    n, c = x.shape[:2]
    g = geom.group
    spatial = x.shape[2:]
    cols = im2col(xp, pad_spatial(xp, dy, geom), geom, spatial)  # (N, G, Mg*K, P)
    x2 = x.reshape(n, g, c // g, math.prod(spatial))
    dw = summed_matmul(xp, x2, cols.swapaxes(-1, -2)).reshape(w.shape)
    if not need_dx:
        return dw, None
    dx = xp.matmul(w.reshape(g, c // g, -1), cols)
    return dw, dx.reshape(x.shape)
