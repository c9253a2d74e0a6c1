"""Caffe2's operator cost inference (``workspace.GetOperatorCost``).

Caffe2 attached a cost function to some operator schemas and computed
``Cost(flops, bytes_written, bytes_read)`` from the shapes and types of the input blobs.
dpgraph provides the same formulas for the operators Caffe2 gave one (``COST_FUNCTIONS``:
the convolution family and ConvGradient, FC/FCTransposed and their gradients, Concat, Split,
the pointwise arithmetic and activation ops, Sum, WeightedSum, DotProduct, BatchMatMul,
SpatialBN); any other operator has no cost function, which Caffe2 also reported as an error.
Like Caffe2, the convolution costs count bytes as floats whatever the input type.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpgraph.errors import WorkspaceError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ops.shape_fns import concat_shape
from dpgraph.proto import caffe2_pb2

Cost = namedtuple("Cost", ["flops", "bytes_written", "bytes_read"])

#: Bytes of a float: Caffe2's conv and FC cost functions size their outputs (and FC its
#: inputs) as float tensors.
_FLOAT_BYTES = 4
#: Bytes of Concat's int32 split_info entries.
_INT32_BYTES = 4


def _numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _spatial_output(size: int, kernel: int, stride: int, pad_head: int, pad_tail: int,
                    dilation: int) -> int:
    return (size + pad_head + pad_tail - (dilation * (kernel - 1) + 1)) // stride + 1


def _per_axis(args: dict[str, Any], name: str, axes: int, default: int) -> list[int]:
    """A conv argument given as ``<name>s`` (list), ``<name>_h/_w`` or ``<name>``."""
    if name + "s" in args:
        return [int(v) for v in args[name + "s"]]
    if axes == 2 and (name + "_h") in args:
        return [int(args[name + "_h"]), int(args.get(name + "_w", args[name + "_h"]))]
    return [int(args.get(name, default))] * axes


def _pads(args: dict[str, Any], axes: int) -> tuple[list[int], list[int]]:
    if "pads" in args:
        pads = [int(v) for v in args["pads"]]
        return pads[:axes], pads[axes:]
    if axes == 2 and "pad_t" in args:
        return ([int(args.get("pad_t", 0)), int(args.get("pad_l", 0))],
                [int(args.get("pad_b", 0)), int(args.get("pad_r", 0))])
    pad = int(args.get("pad", 0))
    return [pad] * axes, [pad] * axes


def _conv_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
               itemsizes: Sequence[int]) -> Cost:
    """N·∏Y_spatial·∏kernel·C_in·C_out·2 flops; reads X and W (X's element size); writes
    the float output Y."""
    x, w = shapes[0], shapes[1]
    if not x or not w:
        return Cost(0, 0, 0)
    args = arguments_dict(op.arg)
    nhwc = str(args.get("order", "NCHW")) == "NHWC"
    axes = len(x) - 2
    spatial = x[1:-1] if nhwc else x[2:]
    kernel = list(w[1:-1] if nhwc else w[2:])
    strides = _per_axis(args, "stride", axes, 1)
    dilations = _per_axis(args, "dilation", axes, 1)
    head, tail = _pads(args, axes)
    out = [_spatial_output(spatial[i], kernel[i], strides[i], head[i], tail[i], dilations[i])
           for i in range(axes)]
    in_channels = w[-1] if nhwc else w[1]
    out_channels = w[0]
    flops = x[0] * int(np.prod(out)) * int(np.prod(kernel)) * in_channels * out_channels * 2
    y_elements = x[0] * out_channels * int(np.prod(out))
    read = (int(np.prod(x)) + int(np.prod(w))) * itemsizes[0]
    return Cost(int(flops), int(y_elements * _FLOAT_BYTES), int(read))


def _fc_dims(op: caffe2_pb2.OperatorDef, x: tuple[int, ...], w: tuple[int, ...]
             ) -> tuple[int, int, int]:
    """(M, K, N) of an FC: X split at ``axis``; N from W's dims before ``axis_w`` (after it
    for the pretransposed FCTransposed)."""
    args = arguments_dict(op.arg)
    axis = int(args.get("axis", 1)) % max(len(x), 1)
    axis_w = int(args.get("axis_w", 1)) % max(len(w), 1)
    m, k = _numel(x[:axis]), _numel(x[axis:])
    n = _numel(w[axis_w:]) if op.type.startswith("FCTransposed") else _numel(w[:axis_w])
    return m, k, n


def _fc_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
             itemsizes: Sequence[int]) -> Cost:
    """M·N·(2K+1) flops for X [M, K] and W [N, K]; reads X, W, b and writes Y (X's
    element size)."""
    m, k, n = _fc_dims(op, shapes[0], shapes[1])
    return Cost(m * n * (2 * k + 1), m * n * itemsizes[0], (k * (m + n) + n) * itemsizes[0])


def _fc_gradient_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                      itemsizes: Sequence[int]) -> Cost:
    """dW and db: M·N·(2K+1) flops, dX another 2·M·N·K; writes dW, db (W's element size)
    and dX; Caffe2 counted no bytes read."""
    x, w = shapes[0], shapes[1]
    m, k, n = _fc_dims(op, x, w)
    flops = m * n * (2 * k + 1)
    written = (_numel(w) + n) * itemsizes[1]
    if len(op.output) == 3:
        flops += 2 * m * n * k
        written += _numel(x) * itemsizes[0]
    return Cost(flops, written, 0)


def _conv_gradient_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                        itemsizes: Sequence[int]) -> Cost:
    """2·N·M·C·|kernel|·|dY image| flops for dW, N·M·|dY image| for db, as much again as dW
    for dX; reads X, W, dY and writes the gradients, all as floats."""
    x, w, dy = shapes[0], shapes[1], shapes[2]
    nhwc = str(arguments_dict(op.arg).get("order", "NCHW")) == "NHWC"
    no_bias = bool(int(arguments_dict(op.arg).get("no_bias", 0)))
    channels = x[-1] if nhwc else x[1]
    image = _numel(dy[1:-1] if nhwc else dy[2:])
    kernel = _numel(w[1:-1] if nhwc else w[2:])
    per_pass = x[0] * 2 * w[0] * kernel * channels * image
    flops = per_pass + (0 if no_bias else x[0] * w[0] * image)
    written = [_numel(w)] + ([] if no_bias else [w[0]])
    if len(op.output) == 3 or (no_bias and len(op.output) == 2):
        flops += per_pass
        written.append(_numel(x))
    return Cost(int(flops), sum(written[:len(op.output)]) * _FLOAT_BYTES,
                (_numel(x) + _numel(w) + _numel(dy)) * _FLOAT_BYTES)


def _pointwise(ops_per_point: int) -> Callable[..., Cost]:
    """Caffe2's PointwiseCostInference: ops_per_point flops per element of input 0; reads
    every input, writes input 0's size, all in input 0's element size."""

    def cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
             itemsizes: Sequence[int]) -> Cost:
        elements = _numel(shapes[0])
        read = sum(_numel(s) for s in shapes) * itemsizes[0]
        return Cost(elements * ops_per_point, elements * itemsizes[0], read)

    return cost


def _sum_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
              itemsizes: Sequence[int]) -> Cost:
    """Pointwise, with one add per element for each input after the first."""
    base = _pointwise(1)(op, shapes, itemsizes)
    return base._replace(flops=base.flops * (len(shapes) - 1))


def _weighted_sum_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                       itemsizes: Sequence[int]) -> Cost:
    """[X0, w0, X1, w1, ...]: (inputs - 1) flops per element; reads each pair's X and
    weight."""
    if len(shapes) % 2:
        raise WorkspaceError(f"GetOperatorCost: WeightedSum takes (X, weight) pairs, got "
                             f"{len(shapes)} inputs")
    elements = _numel(shapes[0])
    return Cost((len(shapes) - 1) * elements, elements * itemsizes[0],
                (len(shapes) // 2) * (elements + 1) * itemsizes[0])


def _dot_product_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                      itemsizes: Sequence[int]) -> Cost:
    """Pointwise (2 flops per element) writing one value per row of X."""
    rows = shapes[0][0] if shapes[0] else 1
    return _pointwise(2)(op, shapes, itemsizes)._replace(bytes_written=rows * itemsizes[0])


def _matmul_output(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul's result shape (batch dims broadcast; 1-D operands promoted)."""
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return a[:-1]
    return (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])


def _batch_matmul_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                       itemsizes: Sequence[int]) -> Cost:
    """2·|Y|·K flops; reads A and B, writes Y (A's element size)."""
    args = arguments_dict(op.arg)
    a, b = tuple(shapes[0]), tuple(shapes[1])
    if int(args.get("trans_a", 0)) and len(a) > 1:
        a = (*a[:-2], a[-1], a[-2])
    if int(args.get("trans_b", 0)) and len(b) > 1:
        b = (*b[:-2], b[-1], b[-2])
    y = _numel(_matmul_output(a, b))
    return Cost(2 * y * a[-1], y * itemsizes[0], (_numel(a) + _numel(b)) * itemsizes[0])


def _concat_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                 itemsizes: Sequence[int]) -> Cost:
    """No flops; reads every input and writes the output (all sized by input 0's element)
    plus the int32 split_info."""
    out_shape = concat_shape(op, list(shapes), [None] * len(shapes))[0][0]
    read = sum(int(np.prod(s)) for s in shapes) * itemsizes[0]
    written = int(np.prod(out_shape)) * itemsizes[0] + len(shapes) * _INT32_BYTES
    return Cost(0, int(written), int(read))


def _split_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
                itemsizes: Sequence[int]) -> Cost:
    """No flops; reads the input (and the split sizes blob) and writes the input's bytes."""
    data = int(np.prod(shapes[0])) * itemsizes[0]
    sizes = int(np.prod(shapes[1])) * itemsizes[1] if len(shapes) > 1 else 0
    return Cost(0, data, data + sizes)


COST_FUNCTIONS: dict[str, Callable[..., Cost]] = {
    "Conv": _conv_cost, "Conv1D": _conv_cost, "Conv2D": _conv_cost, "Conv3D": _conv_cost,
    "ConvGradient": _conv_gradient_cost,
    "FC": _fc_cost, "FCTransposed": _fc_cost,
    "FCGradient": _fc_gradient_cost, "FCTransposedGradient": _fc_gradient_cost,
    "Concat": _concat_cost, "Split": _split_cost,
    "Add": _pointwise(1), "Sub": _pointwise(1), "Mul": _pointwise(1), "Div": _pointwise(1),
    "MulGradient": _pointwise(2), "Relu": _pointwise(0), "ReluN": _pointwise(2),
    "LeakyRelu": _pointwise(2), "ThresholdedRelu": _pointwise(2), "Gelu": _pointwise(2),
    "HardSigmoid": _pointwise(4), "SpatialBN": _pointwise(4),
    "Sum": _sum_cost, "WeightedSum": _weighted_sum_cost, "DotProduct": _dot_product_cost,
    "BatchMatMul": _batch_matmul_cost,
}


def operator_cost(op: caffe2_pb2.OperatorDef, values: Sequence[Any]) -> Cost:
    """The cost of ``op`` run on ``values`` (its inputs, in order)."""
    if op.type not in COST_FUNCTIONS:
        raise WorkspaceError(
            f"GetOperatorCost: operator {op.type!r} has no cost inference function; dpgraph "
            f"defines it for {sorted(COST_FUNCTIONS)}.")
    arrays = [np.asarray(v) for v in values]
    return COST_FUNCTIONS[op.type](op, [a.shape for a in arrays],
                                   [a.dtype.itemsize for a in arrays])


def GetOperatorCost(operator: Any, blobs: Sequence[Any]) -> Cost:
    """Caffe2's ``workspace.GetOperatorCost(op, input blob names)``: the op's
    ``Cost(flops, bytes_written, bytes_read)`` for the current workspace's blobs."""
    from dpgraph.runtime import api

    op = operator
    if not isinstance(op, caffe2_pb2.OperatorDef):
        op = caffe2_pb2.OperatorDef()
        op.ParseFromString(operator)
    return operator_cost(op, [api.FetchBlob(name) for name in blobs])
