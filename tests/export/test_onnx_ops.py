"""Each mapped op: dpgraph's kernel and onnxruntime agree on a one- or two-op net.

Models are exported with a symbolic batch dimension (shape inference uses a stand-in size)
and run at another batch size, so batch-dependent shapes must be built at run time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _export_helpers import (
    assert_outputs_close,
    check_model,
    make_net,
    op,
    run_dpgraph,
    run_onnx,
)

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from dpgraph.export.onnx import to_onnx  # noqa: E402

RNG = np.random.default_rng(1234)
BATCH = 2


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return (np.abs(randn(*shape)) + 0.5).astype(np.float32)


X4 = (BATCH, 4, 5, 5)
X4_NHWC = (BATCH, 5, 5, 4)

# (id, ops, data inputs {name: array}, params {name: array}, outputs)
CASES: list[tuple[str, list[Any], dict[str, np.ndarray], dict[str, np.ndarray], list[str]]] = [
    ("fc", [op("FC", ["x", "w", "b"], ["y"])], {"x": randn(BATCH, 6)},
     {"w": randn(3, 6), "b": randn(3)}, ["y"]),
    ("fc_axis2", [op("FC", ["x", "w", "b"], ["y"], axis=2)], {"x": randn(BATCH, 3, 6)},
     {"w": randn(4, 6), "b": randn(4)}, ["y"]),
    ("fc_4d_input", [op("FC", ["x", "w", "b"], ["y"])], {"x": randn(*X4)},
     {"w": randn(3, 100), "b": randn(3)}, ["y"]),
    ("fc_transposed", [op("FCTransposed", ["x", "w", "b"], ["y"])], {"x": randn(BATCH, 6)},
     {"w": randn(6, 3), "b": randn(3)}, ["y"]),
    ("matmul_trans_b", [op("MatMul", ["x", "w"], ["y"], trans_b=1)], {"x": randn(BATCH, 6)},
     {"w": randn(3, 6)}, ["y"]),
    ("batch_matmul", [op("BatchMatMul", ["x", "w"], ["y"], trans_a=1)],
     {"x": randn(BATCH, 4, 3), "w": randn(BATCH, 4, 5)}, {}, ["y"]),
    ("conv_pads_group", [op("Conv", ["x", "w", "b"], ["y"], kernel=3, pad=1, stride=2,
                            group=2)],
     {"x": randn(*X4)}, {"w": randn(6, 2, 3, 3), "b": randn(6)}, ["y"]),
    ("conv_no_bias_dilation", [op("Conv", ["x", "w"], ["y"], kernel=2, dilation=2,
                                  pad_t=1, pad_b=0, pad_l=0, pad_r=1)],
     {"x": randn(*X4)}, {"w": randn(3, 4, 2, 2)}, ["y"]),
    ("conv_nhwc", [op("Conv", ["x", "w", "b"], ["y"], kernel=3, order="NHWC")],
     {"x": randn(*X4_NHWC)}, {"w": randn(6, 3, 3, 4), "b": randn(6)}, ["y"]),
    ("conv_legacy_same", [op("Conv", ["x", "w", "b"], ["y"], kernel=3, stride=2,
                             legacy_pad=2)],
     {"x": randn(*X4)}, {"w": randn(2, 4, 3, 3), "b": randn(2)}, ["y"]),
    ("conv_transpose", [op("ConvTranspose", ["x", "w", "b"], ["y"], kernel=3, stride=2,
                           pad=1, adj=1)],
     {"x": randn(*X4)}, {"w": randn(4, 3, 3, 3), "b": randn(3)}, ["y"]),
    ("maxpool", [op("MaxPool", ["x"], ["y"], kernel=3, stride=2, pad=1)], {"x": randn(*X4)},
     {}, ["y"]),
    ("avgpool_pads", [op("AveragePool", ["x"], ["y"], kernel=3, stride=2, pad=1)],
     {"x": randn(*X4)}, {}, ["y"]),
    ("avgpool_count_pad", [op("AveragePool", ["x"], ["y"], kernel=3, stride=1, pad=1,
                              count_include_pad=1)], {"x": randn(*X4)}, {}, ["y"]),
    ("avgpool_global", [op("AveragePool", ["x"], ["y"], global_pooling=1)],
     {"x": randn(*X4)}, {}, ["y"]),
    ("maxpool_nhwc", [op("MaxPool", ["x"], ["y"], kernel=2, stride=2, order="NHWC")],
     {"x": randn(*X4_NHWC)}, {}, ["y"]),
    ("spatial_bn", [op("SpatialBN", ["x", "s", "b", "m", "v"], ["y"], is_test=1,
                       epsilon=1e-3)],
     {"x": randn(*X4)}, {"s": randn(4), "b": randn(4), "m": randn(4), "v": positive(4)},
     ["y"]),
    ("spatial_bn_nhwc", [op("SpatialBN", ["x", "s", "b", "m", "v"], ["y"], is_test=1,
                            order="NHWC")],
     {"x": randn(*X4_NHWC)},
     {"s": randn(4), "b": randn(4), "m": randn(4), "v": positive(4)}, ["y"]),
    ("affine_channel", [op("AffineChannel", ["x", "s", "b"], ["y"])], {"x": randn(*X4)},
     {"s": randn(4), "b": randn(4)}, ["y"]),
    ("affine_channel_nhwc", [op("AffineChannel", ["x", "s", "b"], ["y"], order="NHWC")],
     {"x": randn(*X4_NHWC)}, {"s": randn(4), "b": randn(4)}, ["y"]),
    ("group_norm", [op("GroupNorm", ["x", "g", "b"], ["y", "mean", "rstd"], group=2)],
     {"x": randn(*X4)}, {"g": randn(4), "b": randn(4)}, ["y", "mean", "rstd"]),
    ("group_norm_nhwc", [op("GroupNorm", ["x", "g", "b"], ["y"], group=2, order="NHWC")],
     {"x": randn(*X4_NHWC)}, {"g": randn(4), "b": randn(4)}, ["y"]),
    ("layer_norm", [op("LayerNorm", ["x"], ["y", "mean", "std"], axis=1)],
     {"x": randn(BATCH, 3, 4)}, {}, ["y"]),
    ("layer_norm_stats", [op("LayerNorm", ["x", "g", "b"], ["y", "mean", "std"], axis=2,
                             elementwise_affine=1)],
     {"x": randn(BATCH, 3, 4)}, {"g": randn(4), "b": randn(4)}, ["y", "mean", "std"]),
    ("instance_norm", [op("InstanceNorm", ["x", "s", "b"], ["y"])], {"x": randn(*X4)},
     {"s": randn(4), "b": randn(4)}, ["y"]),
    ("activations", [op("Relu", ["x"], ["a"]), op("LeakyRelu", ["x"], ["b"], alpha=0.2),
                     op("Elu", ["x"], ["c"], alpha=0.7), op("Sigmoid", ["x"], ["d"]),
                     op("Tanh", ["x"], ["e"]), op("Softplus", ["x"], ["f"]),
                     op("Selu", ["x"], ["g"])],
     {"x": randn(BATCH, 7)}, {}, list("abcdefg")),
    ("softmax_axis1_4d", [op("Softmax", ["x"], ["y"])], {"x": randn(*X4)}, {}, ["y"]),
    ("softmax_axis2", [op("Softmax", ["x"], ["y"], axis=2)], {"x": randn(BATCH, 3, 4)}, {},
     ["y"]),
    ("softmax_2d", [op("Softmax", ["x"], ["y"])], {"x": randn(BATCH, 5)}, {}, ["y"]),
    ("add_legacy_broadcast_axis", [op("Add", ["x", "c"], ["y"], broadcast=1, axis=1)],
     {"x": randn(*X4)}, {"c": randn(4)}, ["y"]),
    ("mul_legacy_broadcast_suffix", [op("Mul", ["x", "c"], ["y"], broadcast=1)],
     {"x": randn(*X4)}, {"c": randn(5, 5)}, ["y"]),
    ("sub_div", [op("Sub", ["x", "z"], ["s"]), op("Div", ["s", "p"], ["y"], broadcast=1,
                                                   axis=1)],
     {"x": randn(BATCH, 3, 2), "z": randn(BATCH, 3, 2)}, {"p": positive(3)}, ["y"]),
    ("unary_math", [op("Sqr", ["x"], ["a"]), op("Sqrt", ["p"], ["b"]), op("Exp", ["x"], ["c"]),
                    op("Log", ["p"], ["d"]), op("Abs", ["x"], ["e"]),
                    op("Negative", ["x"], ["f"]), op("Scale", ["x"], ["g"], scale=2.5),
                    op("Rsqrt", ["p"], ["h"])],
     {"x": randn(BATCH, 4), "p": positive(BATCH, 4)}, {}, list("abcdefgh")),
    ("nary", [op("Sum", ["x", "z", "x"], ["a"]), op("Max", ["x", "z"], ["b"]),
              op("Min", ["x", "z"], ["c"]), op("Mean", ["x", "z"], ["d"])],
     {"x": randn(BATCH, 4), "z": randn(BATCH, 4)}, {}, list("abcd")),
    ("clip", [op("Clip", ["x"], ["a"], min=-0.5, max=0.5), op("Clip", ["x"], ["b"], min=0.1)],
     {"x": randn(BATCH, 4)}, {}, ["a", "b"]),
    ("flatten_reshape", [op("Flatten", ["x"], ["a"]), op("FlattenToVec", ["x"], ["b"]),
                         op("Reshape", ["x"], ["c", "old"], shape=[0, -1, 5])],
     {"x": randn(*X4)}, {}, ["a", "b", "c", "old"]),
    ("transpose_layouts", [op("Transpose", ["x"], ["a"], axes=[0, 2, 3, 1]),
                           op("NCHW2NHWC", ["x"], ["b"]), op("NHWC2NCHW", ["b"], ["c"]),
                           op("Transpose", ["x"], ["d"])],
     {"x": randn(*X4)}, {}, list("abcd")),
    ("concat_split", [op("Concat", ["x", "z"], ["c", "info"], axis=1),
                      op("Split", ["c"], ["s1", "s2"], split=[2, 5], axis=1)],
     {"x": randn(BATCH, 3), "z": randn(BATCH, 4)}, {}, ["c", "info", "s1", "s2"]),
    ("concat_add_axis", [op("Concat", ["x", "z"], ["c"], add_axis=1, axis=1)],
     {"x": randn(BATCH, 3), "z": randn(BATCH, 3)}, {}, ["c"]),
    ("concat_nhwc_order", [op("Concat", ["x", "z"], ["c"], order="NHWC")],
     {"x": randn(*X4_NHWC), "z": randn(*X4_NHWC)}, {}, ["c"]),
    ("squeeze_expand", [op("ExpandDims", ["x"], ["e"], dims=[1, 3]),
                        op("Squeeze", ["e"], ["s"], dims=[1])],
     {"x": randn(BATCH, 3)}, {}, ["e", "s"]),
    ("gather", [op("Gather", ["table", "idx"], ["y"])],
     {"idx": np.array([[0, 2], [1, 1]][:BATCH], dtype=np.int64)}, {"table": randn(3, 4)},
     ["y"]),
    ("dropout_copy_cast", [op("Dropout", ["x"], ["d", "mask"], is_test=1, ratio=0.3),
                           op("Copy", ["d"], ["c"]), op("Cast", ["c"], ["i"], to=2)],
     {"x": randn(BATCH, 4) * 4}, {}, ["d", "mask", "c", "i"]),
    ("reductions", [op("ReduceMean", ["x"], ["a"], axes=[1, 2], keepdims=0),
                    op("ReduceSum", ["x"], ["b"], axes=[-1]),
                    op("ReduceMax", ["x"], ["c"], axes=[1], keepdims=0),
                    op("ReduceFrontSum", ["x"], ["d"]),
                    op("ReduceBackMean", ["x"], ["e"], num_reduce_dim=2)],
     {"x": randn(BATCH, 3, 4)}, {}, list("abcde")),
    ("in_place_chain", [op("FC", ["x", "w", "b"], ["h"]), op("Relu", ["h"], ["h"]),
                        op("Scale", ["h"], ["h"], scale=3.0), op("Softmax", ["h"], ["h"])],
     {"x": randn(BATCH, 6)}, {"w": randn(3, 6), "b": randn(3)}, ["h"]),
    ("prelu", [op("PRelu", ["x", "slope"], ["y"])], {"x": randn(*X4)},
     {"slope": randn(4)}, ["y"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_dpgraph(case: Any) -> None:
    name, ops, feeds, params, outputs = case
    net = make_net(ops, [*feeds, *params], outputs, name=name)
    want = run_dpgraph(net, params, feeds)
    inputs = {k: (("N", *v.shape[1:]), v.dtype) for k, v in feeds.items()}
    model = to_onnx(net, params, inputs)
    check_model(model)
    got = run_onnx(model, feeds)
    assert_outputs_close(got, want)


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
def test_other_opsets(opset: int) -> None:
    feeds = {"x": randn(BATCH, 3, 4)}
    params = {"g": randn(4), "b": randn(4)}
    ops = [op("LayerNorm", ["x", "g", "b"], ["y", "m", "s"], axis=2, elementwise_affine=1),
           op("ReduceMean", ["y"], ["r"], axes=[1]), op("Softmax", ["x"], ["p"], axis=1),
           op("GroupNorm", ["x", "g", "b"], ["gn"], group=1, order="NHWC")]
    net = make_net(ops, ["x", "g", "b"], ["r", "p", "gn"])
    want = run_dpgraph(net, params, feeds)
    model = to_onnx(net, params, {"x": (("N", 3, 4), np.float32)}, opset=opset)
    check_model(model)
    assert model.opset_import[0].version == opset
    assert_outputs_close(run_onnx(model, feeds), want)
