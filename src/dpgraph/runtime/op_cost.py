"""Caffe2's operator cost inference (``workspace.GetOperatorCost``).

Caffe2 attached a cost function to some operator schemas and computed
``Cost(flops, bytes_written, bytes_read)`` from the shapes and types of the input blobs.
dpgraph provides the same formulas for the convolution family (``Conv``, ``Conv1D``,
``Conv2D``, ``Conv3D``), ``FC``, ``Concat`` and ``Split``; any other operator has no cost
function, which Caffe2 also reported as an error.
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


def _fc_cost(op: caffe2_pb2.OperatorDef, shapes: Sequence[tuple[int, ...]],
             itemsizes: Sequence[int]) -> Cost:
    """M·N·(2K+1) flops for X [M, K] and W [N, K] (axis / axis_w split the dims)."""
    x, w = shapes[0], shapes[1]
    args = arguments_dict(op.arg)
    axis = int(args.get("axis", 1)) % max(len(x), 1)
    axis_w = int(args.get("axis_w", 1)) % max(len(w), 1)
    m, k = int(np.prod(x[:axis])), int(np.prod(x[axis:]))
    n = int(np.prod(w[axis_w:])) if args.get("pretransposed_weight") else int(
        np.prod(w[:axis_w]))
    return Cost(m * n * (2 * k + 1), m * n * _FLOAT_BYTES, (k * (m + n) + n) * _FLOAT_BYTES)


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
    "FC": _fc_cost, "Concat": _concat_cost, "Split": _split_cost,
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
