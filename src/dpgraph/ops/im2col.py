"""``Im2Col`` and ``Col2Im`` (Caffe2's im2col_op): 2-D image <-> column layout, each the
other's gradient.

Arguments (Caffe2's names): ``kernel``/``kernel_h``/``kernel_w`` (required), ``stride``,
``dilation`` (and their _h/_w forms), one symmetric ``pad`` and ``order``.  Columns are
``(N, C·kh·kw, out_h, out_w)`` for NCHW (channel-major, then kernel row, kernel column) and
``(N, out_h, out_w, kh·kw·C)`` for NHWC (kernel row, kernel column, then channel).
"""

from __future__ import annotations

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops import _conv_util as cu
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.gradient_builder import GradientBuilder
from dpgraph.ops.nn import _ctx_for
from dpgraph.proto import caffe2_pb2

Shape = tuple[int, ...]


def _hw_arg(ctx: OpContext, name: str, default: int) -> tuple[int, int]:
    base = ctx.int_arg(name, default)
    return ctx.int_arg(f"{name}_h", base), ctx.int_arg(f"{name}_w", base)


def _geometry(ctx: OpContext) -> cu.Geometry:
    kernel, stride = _hw_arg(ctx, "kernel", 0), _hw_arg(ctx, "stride", 1)
    dilation, pad = _hw_arg(ctx, "dilation", 1), ctx.int_arg("pad", 0)
    if min(kernel + stride + dilation) < 1 or pad < 0:
        raise ctx.fail(f"needs kernel, stride and dilation > 0 and pad >= 0; got kernel="
                       f"{kernel} stride={stride} dilation={dilation} pad={pad}")
    return cu.Geometry(kernel, stride, (pad, pad), (pad, pad), dilation)


def _image_dims(ctx: OpContext, shape: Shape, geom: cu.Geometry) -> tuple[str, Shape, Shape]:
    """(order, (N, C, H, W), (out_h, out_w)) of an image-shaped tensor."""
    order = cu.check_order(ctx)
    if len(shape) != 4:
        raise ctx.fail(f"the image must be 4-D ({order}), got shape {shape}")
    nchw = shape if order == "NCHW" else (shape[0], shape[3], shape[1], shape[2])
    if any(s < e for s, e in zip(nchw[2:], geom.extent)):
        raise ctx.fail(f"image {nchw[2:]} is smaller than the dilated kernel {geom.extent}")
    return order, nchw, geom.out_shape(nchw[2:])


def _col_shape(order: str, nchw: Shape, geom: cu.Geometry, out: Shape) -> Shape:
    n, c = nchw[:2]
    k = geom.kernel[0] * geom.kernel[1]
    return (n, c * k, *out) if order == "NCHW" else (n, *out, k * c)


def _im2col_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    if shapes[0] is None:
        return [None]
    ctx = _ctx_for(op)
    geom = _geometry(ctx)
    order, nchw, out = _image_dims(ctx, tuple(shapes[0]), geom)
    return [(_col_shape(order, nchw, geom, out), types[0] or caffe2_pb2.TensorProto.FLOAT)]


@register_op("Im2Col", inputs=1, outputs=1, shape=_im2col_shape)
def im2col(ctx: OpContext) -> Outputs:
    """Image -> columns: every (dilated, strided, zero-padded) kernel window, unrolled."""
    x = ctx.inputs[0]
    geom = _geometry(ctx)
    order, nchw, out = _image_dims(ctx, x.shape, geom)
    xp = ctx.xp
    xpad = cu.pad_spatial(xp, cu.channel_first(x, order), geom)
    windows = cu.window_view(xp, xpad, geom, out)  # (N, C, kh, kw, oh, ow)
    if order == "NHWC":
        windows = windows.transpose(0, 4, 5, 2, 3, 1)
    return (xp.ascontiguousarray(windows).reshape(_col_shape(order, nchw, geom, out)),)


def _col2im_shape(op: caffe2_pb2.OperatorDef, shapes: list, types: list) -> list:
    return [None if shapes[1] is None else
            (tuple(shapes[1]), types[0] or caffe2_pb2.TensorProto.FLOAT)]


@register_op("Col2Im", inputs=2, outputs=1, shape=_col2im_shape)
def col2im(ctx: OpContext) -> Outputs:
    """[columns, image-shaped Z] -> image of Z's shape: every column entry added back at
    its window position (padding dropped)."""
    cols, like = ctx.inputs
    geom = _geometry(ctx)
    order, nchw, out = _image_dims(ctx, tuple(like.shape), geom)
    n, c = nchw[:2]
    kh, kw = geom.kernel
    if cols.size != n * c * kh * kw * out[0] * out[1]:
        raise ctx.fail(f"columns {cols.shape} do not match image {like.shape} with kernel "
                       f"{geom.kernel} (need {n * c * kh * kw * out[0] * out[1]} values)")
    xp = ctx.xp
    if order == "NCHW":
        blocks = cols.reshape(n, c, kh, kw, *out)
    else:
        blocks = cols.reshape(n, *out, kh, kw, c).transpose(0, 5, 3, 4, 1, 2)
    padded = cu.col2im(xp, blocks, geom, out, geom.padded(nchw[2:]))
    image = padded[cu.inner_slices(geom, nchw[2:])]
    return (cu.channel_last(xp.ascontiguousarray(image), order, xp).astype(cols.dtype,
                                                                           copy=False),)


@register_gradient("Im2Col")
def _im2col_grad(g: GradientBuilder) -> None:
    g.add("Col2Im", [g.GO(0), g.I(0)], [g.GI(0)])


@register_gradient("Col2Im")
def _col2im_grad(g: GradientBuilder) -> None:
    g.add("Im2Col", [g.GO(0)], [g.GI(0)])
