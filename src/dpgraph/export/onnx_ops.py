"""The Caffe2 -> ONNX op mapping used by :func:`dpgraph.export.to_onnx`.

One converter per Caffe2 op type, registered in :data:`CONVERTERS`.  A converter reads the
op through an :class:`~dpgraph.export.onnx.OnnxBuilder` (inputs, arguments, observed shapes)
and appends ONNX nodes whose outputs are ``b.output(k)``.  The table in ``docs/export.md``
documents every entry; keep both in step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dpgraph.export.onnx import OnnxBuilder
from dpgraph.ops import _conv_util as cu
from dpgraph.ops.context import OpContext
from dpgraph.ops.fill import numpy_dtype, parse_dtype
from dpgraph.ops.math import legacy_shape
from dpgraph.proto import caffe2_pb2

Convert = Callable[[OnnxBuilder], None]
CONVERTERS: dict[str, Convert] = {}
#: op type -> predicate returning why this instance cannot be exported (or None).
_CHECKS: dict[str, Callable[[dict[str, Any], caffe2_pb2.OperatorDef], str | None]] = {}


def converter(*types: str, check: Callable[..., str | None] | None = None) -> Any:
    def register(fn: Convert) -> Convert:
        for op_type in types:
            CONVERTERS[op_type] = fn
            if check is not None:
                _CHECKS[op_type] = check
        return fn
    return register


def unsupported_reason(op: caffe2_pb2.OperatorDef) -> str | None:
    """Why ``op`` cannot be exported, or ``None`` when it can."""
    if op.type not in CONVERTERS:
        return "no ONNX mapping for this op type"
    check = _CHECKS.get(op.type)
    if check is None:
        return None
    from dpgraph.ir.arguments import arguments_dict

    return check(arguments_dict(op.arg), op)


def _ctx(b: OnnxBuilder) -> OpContext:
    return OpContext(b.op, b.args, np, b.op.device_option)


def _order(b: OnnxBuilder) -> str:
    return str(b.args.get("order", "NCHW"))


def _to_channel_first(b: OnnxBuilder, value: str, rank: int) -> str:
    return b.transpose(value, [0, rank - 1, *range(1, rank - 1)])


def _to_channel_last(b: OnnxBuilder, value: str, rank: int, out: str) -> str:
    return b.transpose(value, [0, *range(2, rank), 1], out)


def _channel_first_wrapped(b: OnnxBuilder, build: Callable[[str, str], object]) -> None:
    """Run ``build(x_channel_first, y_name)``, wrapping NHWC data in Transposes."""
    x, rank = b.input(0), b.rank(0)
    if _order(b) == "NCHW":
        build(x, b.output(0))
        return
    temp = b.fresh(f"{b.op.output[0]}_nchw")
    build(_to_channel_first(b, x, rank), temp)
    _to_channel_last(b, temp, rank, b.output(0))


# --- simple one-to-one maps ---------------------------------------------------------------
_SAME = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
         "Sqrt": "Sqrt", "Abs": "Abs", "Negative": "Neg", "Sign": "Sign", "Ceil": "Ceil",
         "Floor": "Floor", "Erf": "Erf", "Cos": "Cos", "Sin": "Sin", "Tan": "Tan",
         "Acos": "Acos", "Asin": "Asin", "Atan": "Atan", "Cosh": "Cosh", "Sinh": "Sinh",
         "Softplus": "Softplus", "Not": "Not"}
_IDENTITY = ("Copy", "Alias", "StopGradient", "EnsureCPUOutput", "CopyFromCPUInput",
             "CopyGPUToCPU", "CopyCPUToGPU", "EnsureDense")
_NARY = {"Sum": "Sum", "Max": "Max", "Min": "Min", "Mean": "Mean"}


@converter(*_SAME)
def _unary(b: OnnxBuilder) -> None:
    b.node(_SAME[b.op.type], [b.input(0)], [b.output(0)])


@converter(*_IDENTITY)
def _identity(b: OnnxBuilder) -> None:
    b.node("Identity", [b.input(0)], [b.output(0)])


@converter(*_NARY)
def _nary(b: OnnxBuilder) -> None:
    names = [b.input(i) for i in range(len(b.op.input))]
    if len(names) == 1:
        b.node("Identity", names, [b.output(0)])
    else:
        b.node(_NARY[b.op.type], names, [b.output(0)])


@converter("LeakyRelu")
def _leaky_relu(b: OnnxBuilder) -> None:
    b.node("LeakyRelu", [b.input(0)], [b.output(0)], alpha=float(b.args.get("alpha", 0.01)))


@converter("Elu")
def _elu(b: OnnxBuilder) -> None:
    b.node("Elu", [b.input(0)], [b.output(0)], alpha=float(b.args.get("alpha", 1.0)))


@converter("Selu")
def _selu(b: OnnxBuilder) -> None:
    b.node("Selu", [b.input(0)], [b.output(0)],
           alpha=float(b.args.get("alpha", 1.6732632423543772)),
           gamma=float(b.args.get("scale", 1.0507009873554805)))


@converter("ThresholdedRelu")
def _thresholded_relu(b: OnnxBuilder) -> None:
    b.node("ThresholdedRelu", [b.input(0)], [b.output(0)], alpha=float(b.args.get("alpha", 1.0)))


@converter("HardSigmoid")
def _hard_sigmoid(b: OnnxBuilder) -> None:
    b.node("HardSigmoid", [b.input(0)], [b.output(0)], alpha=float(b.args.get("alpha", 0.2)),
           beta=float(b.args.get("beta", 0.5)))


def _scalar(b: OnnxBuilder, value: float, index: int = 0) -> str:
    return b.const(np.asarray(value, dtype=b.in_dtype(index)), "scalar")


@converter("ReluN")
def _relu_n(b: OnnxBuilder) -> None:
    b.node("Clip", [b.input(0), _scalar(b, 0.0), _scalar(b, float(b.args.get("n", 6.0)))],
           [b.output(0)])


@converter("Clip")
def _clip(b: OnnxBuilder) -> None:
    low = _scalar(b, float(b.args["min"])) if "min" in b.args else ""
    high = _scalar(b, float(b.args["max"])) if "max" in b.args else ""
    b.node("Clip", [b.input(0), low, high], [b.output(0)])


@converter("Sqr")
def _sqr(b: OnnxBuilder) -> None:
    x = b.input(0)
    b.node("Mul", [x, x], [b.output(0)])


@converter("Cube")
def _cube(b: OnnxBuilder) -> None:
    x = b.input(0)
    b.node("Mul", [b.node("Mul", [x, x])[0], x], [b.output(0)])


@converter("Rsqrt")
def _rsqrt(b: OnnxBuilder) -> None:
    b.node("Reciprocal", b.node("Sqrt", [b.input(0)]), [b.output(0)])


@converter("Scale")
def _scale(b: OnnxBuilder) -> None:
    b.node("Mul", [b.input(0), _scalar(b, float(b.args.get("scale", 1.0)))], [b.output(0)])


@converter("Pow", check=lambda args, op: None if len(op.input) == 2 or "exponent" in args
           else "Pow needs an 'exponent' argument or a second input")
def _pow(b: OnnxBuilder) -> None:
    if len(b.op.input) == 2:
        exponent = _legacy_b(b)
    else:
        exponent = _scalar(b, float(b.args["exponent"]))
    b.node("Pow", [b.input(0), exponent], [b.output(0)])


# --- binary arithmetic with Caffe2's legacy broadcast ----------------------------------------
def _legacy_b(b: OnnxBuilder) -> str:
    """Input B, reshaped so numpy broadcasting matches Caffe2's ``broadcast=1, axis``."""
    name = b.input(1)
    if not int(b.args.get("broadcast", 0)):
        return name
    target = legacy_shape(b.args, b.in_shape(0), b.in_shape(1))
    if tuple(target) == tuple(b.in_shape(1)):
        return name
    value = b.param(1)
    if value is not None:
        return b.const(value.reshape(target), f"{b.op.input[1]}_bcast")
    return b.reshape(name, target)


@converter("Add", "Sub", "Mul", "Div")
def _arithmetic(b: OnnxBuilder) -> None:
    b.node(b.op.type, [b.input(0), _legacy_b(b)], [b.output(0)])


@converter("Softmax")
def _softmax(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    axis = int(b.args.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    x = b.input(0)
    if axis == rank - 1:
        b.node("Softmax", [x], [b.output(0)], axis=-1)
        return
    flat = b.node("Flatten", [x], axis=axis)[0]
    rows = b.node("Softmax", [flat], axis=1)[0]
    b.reshape(rows, b.shape_of(x), b.output(0))


@converter("PRelu")
def _prelu(b: OnnxBuilder) -> None:
    slope, rank = b.input(1), b.rank(0)
    size = int(np.prod(b.in_shape(1)))
    if _order(b) == "NCHW" and rank > 2 and size > 1:
        value = b.param(1)
        target = [size] + [1] * (rank - 2)
        slope = (b.const(value.reshape(target), "slope") if value is not None
                 else b.reshape(slope, target))
    b.node("PRelu", [b.input(0), slope], [b.output(0)])


# --- dense layers -------------------------------------------------------------------------
def _canonical(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _as_matrix_input(b: OnnxBuilder, index: int, axis: int) -> str:
    """Input ``index`` flattened to 2-D at ``axis`` (constants are reshaped directly)."""
    shape = b.in_shape(index)
    value = b.param(index)
    if value is not None:
        rows = int(np.prod(shape[:axis]))
        if len(shape) == 2 and axis == 1:
            return b.input(index)
        return b.const(value.reshape(rows, -1), f"{b.op.input[index]}_2d")
    if len(shape) == 2 and axis == 1:
        return b.input(index)
    return b.node("Flatten", [b.input(index)], axis=axis)[0]


@converter("FC", "FCTransposed")
def _fc(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    axis = _canonical(int(b.args.get("axis", 1)), rank)
    axis_w = _canonical(int(b.args.get("axis_w", 1)), b.rank(1))
    x2 = _as_matrix_input(b, 0, axis)
    w2 = _as_matrix_input(b, 1, axis_w)
    trans_b = 0 if b.op.type == "FCTransposed" else 1
    bias = b.input(2)
    if len(b.in_shape(2)) != 1:
        value = b.param(2)
        bias = b.const(value.reshape(-1), "bias") if value is not None else b.reshape(bias, [-1])
    if axis == 1:
        b.node("Gemm", [x2, w2, bias], [b.output(0)], transB=trans_b)
        return
    y2 = b.node("Gemm", [x2, w2, bias], transB=trans_b)[0]
    n = b.ints([b.shapes.outputs[0][-1]])
    target = b.node("Concat", [b.shape_of(b.input(0), 0, axis), n], axis=0)[0]
    b.reshape(y2, target, b.output(0))


@converter("MatMul")
def _matmul(b: OnnxBuilder) -> None:
    a = _as_matrix_input(b, 0, _canonical(int(b.args.get("axis_a", 1)), b.rank(0)))
    w = _as_matrix_input(b, 1, _canonical(int(b.args.get("axis_b", 1)), b.rank(1)))
    trans = {"transA": int(b.args.get("trans_a", 0)), "transB": int(b.args.get("trans_b", 0))}
    if len(b.op.input) == 3:
        y = b.node("Gemm", [a, w], **trans)[0]
        b.reshape(y, b.shape_of(b.input(2)), b.output(0))
    else:
        b.node("Gemm", [a, w], [b.output(0)], **trans)


@converter("BatchMatMul")
def _batch_matmul(b: OnnxBuilder) -> None:
    names = []
    for index, flag in ((0, "trans_a"), (1, "trans_b")):
        name, rank = b.input(index), b.rank(index)
        if int(b.args.get(flag, 0)) and rank >= 2:
            name = b.transpose(name, [*range(rank - 2), rank - 1, rank - 2])
        names.append(name)
    b.node("MatMul", names, [b.output(0)])


def _geometry_attrs(b: OnnxBuilder, pooling: bool = False) -> dict[str, Any]:
    shape = b.in_shape(0)
    spatial = shape[2:] if _order(b) == "NCHW" else shape[1:-1]
    kernel = None
    if not pooling:
        w = b.in_shape(1)
        kernel = tuple(w[2:] if _order(b) == "NCHW" else w[1:-1])
    geom = cu.parse_geometry(_ctx(b), tuple(spatial), kernel_shape=kernel, pooling=pooling)
    attrs: dict[str, Any] = {"kernel_shape": list(geom.kernel), "strides": list(geom.stride),
                             "pads": [*geom.pad_head, *geom.pad_tail]}
    if any(d != 1 for d in geom.dilation):
        attrs["dilations"] = list(geom.dilation)
    if not pooling:
        attrs["group"] = geom.group
    return attrs


def _channel_first_filter(b: OnnxBuilder) -> str:
    if _order(b) == "NCHW":
        return b.input(1)
    rank = b.rank(1)
    value = b.param(1)
    perm = [0, rank - 1, *range(1, rank - 1)]
    if value is not None:
        return b.const(np.ascontiguousarray(value.transpose(perm)), f"{b.op.input[1]}_nchw")
    return b.transpose(b.input(1), perm)


def _bias_inputs(b: OnnxBuilder) -> list[str]:
    return [b.input(2)] if len(b.op.input) == 3 else []


@converter("Conv", "Conv1D", "Conv2D", "Conv3D")
def _conv(b: OnnxBuilder) -> None:
    attrs = _geometry_attrs(b)
    w = _channel_first_filter(b)
    bias = _bias_inputs(b)
    _channel_first_wrapped(b, lambda x, y: b.node("Conv", [x, w, *bias], [y], **attrs))


def _conv_transpose_adj(b: OnnxBuilder, nd: int) -> list[int]:
    if "adjs" in b.args:
        return [int(v) for v in b.args["adjs"]]
    if "adj" in b.args:
        return [int(b.args["adj"])] * nd
    if nd == 2:
        return [int(b.args.get("adj_h", 0)), int(b.args.get("adj_w", 0))]
    return [0] * nd


@converter("ConvTranspose")
def _conv_transpose(b: OnnxBuilder) -> None:
    attrs = _geometry_attrs(b)
    adj = _conv_transpose_adj(b, len(attrs["kernel_shape"]))
    if any(adj):
        attrs["output_padding"] = adj
    w = _channel_first_filter(b)
    bias = _bias_inputs(b)
    _channel_first_wrapped(b, lambda x, y: b.node("ConvTranspose", [x, w, *bias], [y], **attrs))


def _pool(kind: str) -> Convert:
    def convert(b: OnnxBuilder) -> None:
        if int(b.args.get("global_pooling", 0)):
            _channel_first_wrapped(b, lambda x, y: b.node(f"Global{kind}Pool", [x], [y]))
            return
        attrs = _geometry_attrs(b, pooling=True)
        if kind == "Average":
            attrs["count_include_pad"] = int(b.args.get("count_include_pad", 0))
        _channel_first_wrapped(b, lambda x, y: b.node(f"{kind}Pool", [x], [y], **attrs))
    return convert


for _suffix in ("", "1D", "2D", "3D"):
    converter(f"MaxPool{_suffix}")(_pool("Max"))
    converter(f"AveragePool{_suffix}")(
        _pool("Average"))


# --- normalisation ------------------------------------------------------------------------
def _vector(b: OnnxBuilder, index: int) -> str:
    """A per-channel input as a 1-D vector."""
    if len(b.in_shape(index)) == 1:
        return b.input(index)
    value = b.param(index)
    if value is not None:
        return b.const(value.reshape(-1), f"{b.op.input[index]}_vec")
    return b.reshape(b.input(index), [-1])


def _needs_is_test(problem: str) -> Callable[..., str | None]:
    """A converter check refusing ops in training mode (``is_test=0``) with ``problem``."""

    def check(args: dict[str, Any], op: caffe2_pb2.OperatorDef) -> str | None:
        return None if int(args.get("is_test", 0)) else problem

    return check


@converter("SpatialBN", check=_needs_is_test(
    "SpatialBN in training mode (is_test=0) has no inference equivalent; set is_test=1"))
def _spatial_bn(b: OnnxBuilder) -> None:
    params = [_vector(b, i) for i in range(1, 5)]
    eps = float(b.args.get("epsilon", 1e-5))
    _channel_first_wrapped(b, lambda x, y: b.node("BatchNormalization", [x, *params], [y],
                                                  epsilon=eps))


def _channel_shaped(b: OnnxBuilder, index: int, rank: int) -> str:
    """A per-channel input shaped to broadcast against channel-first data of ``rank``."""
    target = [-1] + [1] * (rank - 2)
    value = b.param(index)
    if value is not None:
        return b.const(value.reshape(target), f"{b.op.input[index]}_bc")
    return b.reshape(b.input(index), target)


@converter("AffineChannel")
def _affine_channel(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    if _order(b) == "NHWC":
        scale, bias = _vector(b, 1), _vector(b, 2)
    else:
        scale, bias = _channel_shaped(b, 1, rank), _channel_shaped(b, 2, rank)
    y = b.node("Mul", [b.input(0), scale])[0]
    b.node("Add", [y, bias], [b.output(0)])


def _reduce_mean(b: OnnxBuilder, value: str, axes: list[int], keep: int = 1) -> str:
    if b.opset >= 18:
        return b.node("ReduceMean", [value, b.ints(axes)], keepdims=keep)[0]
    return b.node("ReduceMean", [value], axes=axes, keepdims=keep)[0]


def _normalise(b: OnnxBuilder, value: str, axes: list[int], eps: float) -> tuple[str, str, str]:
    """(normalised, mean, sqrt(var + eps)) over ``axes`` (kept as size-1 dims)."""
    mean = _reduce_mean(b, value, axes)
    centred = b.node("Sub", [value, mean])[0]
    var = _reduce_mean(b, b.node("Mul", [centred, centred])[0], axes)
    std = b.node("Sqrt", [b.node("Add", [var, _scalar(b, eps)])[0]])[0]
    return b.node("Div", [centred, std])[0], mean, std


@converter("GroupNorm")
def _group_norm(b: OnnxBuilder) -> None:
    rank, groups = b.rank(0), int(b.args.get("group", 32))
    eps = float(b.args.get("epsilon", 1e-5))
    gamma, beta = _channel_shaped(b, 1, rank), _channel_shaped(b, 2, rank)
    stats: list[str] = []

    def build(x: str, y: str) -> None:
        grouped = b.reshape(x, [0, groups, -1])
        normalised, mean, std = _normalise(b, grouped, [2], eps)
        stats.extend([mean, std])
        restored = b.reshape(normalised, b.shape_of(x))
        b.node("Add", [b.node("Mul", [restored, gamma])[0], beta], [y])

    _channel_first_wrapped(b, build)
    if len(b.op.output) > 1 and b.needed_outputs[1]:
        b.reshape(stats[0], [0, groups], b.output(1))
    if len(b.op.output) > 2 and b.needed_outputs[2]:
        b.reshape(b.node("Reciprocal", [stats[1]])[0], [0, groups], b.output(2))


@converter("InstanceNorm")
def _instance_norm(b: OnnxBuilder) -> None:
    scale, bias = _vector(b, 1), _vector(b, 2)
    eps = float(b.args.get("epsilon", 1e-5))
    _channel_first_wrapped(b, lambda x, y: b.node("InstanceNormalization", [x, scale, bias],
                                                  [y], epsilon=eps))


def _layer_norm_check(args: dict[str, Any], op: caffe2_pb2.OperatorDef) -> str | None:
    if int(args.get("elementwise_affine", 0)) and len(op.input) < 3:
        return "LayerNorm with elementwise_affine=1 needs gamma and beta inputs"
    return None


@converter("LayerNorm", check=_layer_norm_check)
def _layer_norm(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    axis = _canonical(int(b.args.get("axis", 1)), rank)
    eps = float(b.args.get("epsilon", 1e-5))
    affine = int(b.args.get("elementwise_affine", 0))
    tail = list(b.in_shape(0)[axis:])
    needs_stats = any(b.needed_outputs[1:])
    x = b.input(0)
    if b.opset >= 17 and not needs_stats:
        if affine:
            scale, bias = (_as_tail(b, 1, tail), _as_tail(b, 2, tail))
        else:
            scale = b.const(np.ones(tail, dtype=b.in_dtype(0)), "ones")
            bias = b.const(np.zeros(tail, dtype=b.in_dtype(0)), "zeros")
        b.node("LayerNormalization", [x, scale, bias], [b.output(0)], axis=axis, epsilon=eps)
        return
    normalised, mean, std = _normalise(b, x, list(range(axis, rank)), eps)
    if affine:
        normalised = b.node("Mul", [normalised, _as_tail(b, 1, tail)])[0]
        b.node("Add", [normalised, _as_tail(b, 2, tail)], [b.output(0)])
    else:
        b.node("Identity", [normalised], [b.output(0)])
    if needs_stats:
        target = b.node("Concat", [b.shape_of(x, 0, axis), b.ints([1])], axis=0)[0]
        for k, value in ((1, mean), (2, std)):
            if len(b.op.output) > k and b.needed_outputs[k]:
                b.reshape(value, target, b.output(k))


def _as_tail(b: OnnxBuilder, index: int, tail: list[int]) -> str:
    value = b.param(index)
    if value is not None:
        return b.const(value.reshape(tail), f"{b.op.input[index]}_tail")
    return b.reshape(b.input(index), tail)


@converter("ElementwiseLinear")
def _elementwise_linear(b: OnnxBuilder) -> None:
    axis = _canonical(int(b.args.get("axis", 1)), b.rank(0))
    tail = list(b.in_shape(0)[axis:])
    y = b.node("Mul", [b.input(0), _as_tail(b, 1, tail)])[0]
    b.node("Add", [y, _as_tail(b, 2, tail)], [b.output(0)])


# --- dropout ------------------------------------------------------------------------------
@converter("Dropout", check=_needs_is_test(
    "Dropout in training mode (is_test=0) is random; set is_test=1 for inference"))
def _dropout(b: OnnxBuilder) -> None:
    b.node("Identity", [b.input(0)], [b.output(0)])
    if len(b.op.output) > 1 and b.needed_outputs[1]:
        true = b.onnx.helper.make_tensor("true", b.onnx.TensorProto.BOOL, [1], [True])
        b.node("ConstantOfShape", [b.shape_of(b.input(0))], [b.output(1)], value=true)


# --- shapes and layouts -------------------------------------------------------------------
@converter("Flatten")
def _flatten(b: OnnxBuilder) -> None:
    b.node("Flatten", [b.input(0)], [b.output(0)], axis=int(b.args.get("axis", 1)))


@converter("FlattenToVec")
def _flatten_to_vec(b: OnnxBuilder) -> None:
    b.reshape(b.input(0), [-1], b.output(0))


def _reshape_check(args: dict[str, Any], op: caffe2_pb2.OperatorDef) -> str | None:
    if "shape" not in args and len(op.input) < 2:
        return "Reshape needs a 'shape' argument or a second input"
    return None


@converter("Reshape", check=_reshape_check)
def _reshape(b: OnnxBuilder) -> None:
    if len(b.op.input) == 2:
        value = b.param(1)
        target = (b.ints(value.reshape(-1).tolist()) if value is not None else
                  b.node("Cast", [b.input(1)], to=b.onnx.TensorProto.INT64)[0])
    else:
        target = b.ints([int(v) for v in b.args["shape"]])
    b.reshape(b.input(0), target, b.output(0))
    if len(b.op.output) > 1 and b.needed_outputs[1]:
        b.node("Shape", [b.input(0)], [b.output(1)])


@converter("Transpose")
def _transpose(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    axes = [int(a) for a in b.args.get("axes", [])] or list(range(rank))[::-1]
    b.transpose(b.input(0), axes, b.output(0))


@converter("NCHW2NHWC")
def _nchw2nhwc(b: OnnxBuilder) -> None:
    _to_channel_last(b, b.input(0), b.rank(0), b.output(0))


@converter("NHWC2NCHW")
def _nhwc2nchw(b: OnnxBuilder) -> None:
    b.transpose(b.input(0), [0, b.rank(0) - 1, *range(1, b.rank(0) - 1)], b.output(0))


def _concat_axis(b: OnnxBuilder, ndim: int) -> int:
    if "axis" in b.args:
        return _canonical(int(b.args["axis"]), ndim)
    return ndim - 1 if _order(b) == "NHWC" else 1


@converter("Concat", "DepthConcat")
def _concat(b: OnnxBuilder) -> None:
    add_axis = int(b.args.get("add_axis", 0))
    ndim = b.rank(0) + add_axis
    axis = _concat_axis(b, ndim)
    names = [b.input(i) for i in range(len(b.op.input))]
    if add_axis:
        names = [b.node("Unsqueeze", [n, b.ints([axis])])[0] for n in names]
    b.node("Concat", names, [b.output(0)], axis=axis)
    if len(b.op.output) > 1 and b.needed_outputs[1]:
        b.node("Identity", [b.const(b.shapes.output_values[1], "split_info")], [b.output(1)])


@converter("Split", "DepthSplit")
def _split(b: OnnxBuilder) -> None:
    rank = b.rank(0)
    axis = _concat_axis(b, rank)
    sizes = [shape[axis] if not int(b.args.get("add_axis", 0)) else 1
             for shape in b.shapes.outputs]
    if int(b.args.get("add_axis", 0)):
        parts = b.node("Split", [b.input(0), b.ints(sizes)], len(sizes), axis=axis)
        for k, part in enumerate(parts):
            b.node("Squeeze", [part, b.ints([axis])], [b.output(k)])
        return
    b.node("Split", [b.input(0), b.ints(sizes)], [b.output(k) for k in range(len(sizes))],
           axis=axis)


@converter("Squeeze")
def _squeeze(b: OnnxBuilder) -> None:
    dims = sorted({int(d) for d in b.args.get("dims", [])})
    b.node("Squeeze", [b.input(0), b.ints(dims)], [b.output(0)])


@converter("ExpandDims")
def _expand_dims(b: OnnxBuilder) -> None:
    dims = sorted({int(d) for d in b.args.get("dims", [])})
    b.node("Unsqueeze", [b.input(0), b.ints(dims)], [b.output(0)])


@converter("Gather")
def _gather(b: OnnxBuilder) -> None:
    b.node("Gather", [b.input(0), b.input(1)], [b.output(0)], axis=int(b.args.get("axis", 0)))


@converter("Cast", check=lambda args, op: None if "to" in args else "Cast needs 'to'")
def _cast(b: OnnxBuilder) -> None:
    dtype = np.dtype(numpy_dtype(parse_dtype(b.args["to"], "Cast 'to'")))
    to = b.onnx.helper.np_dtype_to_tensor_dtype(dtype)
    b.node("Cast", [b.input(0)], [b.output(0)], to=to)


# --- reductions ---------------------------------------------------------------------------
def _reduce(b: OnnxBuilder, kind: str, axes: list[int], keep: int, out: str) -> None:
    onnx_type = f"Reduce{kind}"
    axes_as_input = b.opset >= 18 or (kind == "Sum")
    if axes_as_input:
        b.node(onnx_type, [b.input(0), b.ints(axes)], [out], keepdims=keep)
    else:
        b.node(onnx_type, [b.input(0)], [out], axes=axes, keepdims=keep)


def _reduce_axes_op(kind: str) -> Convert:
    def convert(b: OnnxBuilder) -> None:
        rank = b.rank(0)
        axes = sorted({_canonical(int(a), rank) for a in b.args.get("axes", range(rank))})
        if not axes:
            b.node("Identity", [b.input(0)], [b.output(0)])
            return
        _reduce(b, kind, axes, int(b.args.get("keepdims", 1)), b.output(0))
    return convert


def _front_back(kind: str, front: bool) -> Convert:
    def convert(b: OnnxBuilder) -> None:
        rank, count = b.rank(0), int(b.args.get("num_reduce_dim", 1))
        axes = list(range(count)) if front else list(range(rank - count, rank))
        if not axes:
            b.node("Identity", [b.input(0)], [b.output(0)])
            return
        _reduce(b, kind, axes, 0, b.output(0))
    return convert


def _front_back_check(args: dict[str, Any], op: caffe2_pb2.OperatorDef) -> str | None:
    return "the lengths input of Reduce{Front,Back}* is not supported" if len(op.input) > 1 \
        else None


for _kind in ("Sum", "Mean", "Max", "Min"):
    converter(f"Reduce{_kind}")(_reduce_axes_op(_kind))
for _kind in ("Sum", "Mean", "Max"):
    converter(f"ReduceFront{_kind}", check=_front_back_check)(_front_back(_kind, True))
    converter(f"ReduceBack{_kind}", check=_front_back_check)(_front_back(_kind, False))


def supported_op_types() -> list[str]:
    """Every Caffe2 op type the exporter maps."""
    return sorted(CONVERTERS)
