"""Caffe2's tensor inference rules attached by ``dpgraph.ops.shape_fns``, the distance and
RoIPool ops, and ``GetOperatorCost`` for Concat and Split.

Inferred shapes are checked against fixed Caffe2 answers and against what the kernels then
produce; the new kernels against numpy references and finite-difference gradients."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.errors import OperatorError, WorkspaceError
from dpgraph.ops.testing import check_gradient, run_op
from dpgraph.proto import caffe2_pb2

DT = caffe2_pb2.TensorProto


def _infer_and_run(net: core.Net, feeds: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Infer from the fed blobs, run the net, and assert every blob's shape and type match."""
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    shapes, types = workspace.InferShapesAndTypes([net])
    workspace.RunNetOnce(net)
    for blob in workspace.Blobs():
        value = workspace.FetchBlob(blob)
        assert shapes[blob] == list(value.shape), blob
        assert types[blob] == {np.dtype(np.float32): DT.FLOAT, np.dtype(np.int32): DT.INT32,
                               np.dtype(np.int64): DT.INT64}[value.dtype], blob
    return shapes


# --- Concat / Split ----------------------------------------------------------------------
def test_concat_order_axis_is_fixed_and_add_axis_inserts() -> None:
    net = core.Net("concat")
    net.Concat(["A", "B"], ["C", "splits"], axis=1)
    net.Concat(["C", "D"], ["E", "splitsE"], order="NCHW")
    net.Concat(["E", "F"], ["G", "splitsG"], add_axis=1, order="NHWC")
    net.Concat(["A", "A"], ["H"], axis=-1)
    dims = {"A": [10, 12, 9, 10], "B": [10, 9, 9, 10], "D": [10, 2, 9, 10], "F": [10, 23, 9, 10]}
    shapes, types = workspace.InferShapesAndTypes(
        [net], blob_dimensions=dims, blob_types={k: DT.INT64 for k in dims})
    assert shapes["C"] == [10, 21, 9, 10] and shapes["E"] == [10, 23, 9, 10]
    assert shapes["G"] == [10, 23, 9, 2, 10]  # NHWC means axis 3 even in the 5-D result
    assert shapes["H"] == [10, 12, 9, 20] and "H" in types and types["H"] == DT.INT64
    assert shapes["splits"] == [2] and types["splits"] == DT.INT32
    assert types["G"] == DT.INT64


def test_concat_needs_every_input_and_matching_shapes() -> None:
    net = core.Net("concat_unknown")
    net.Concat(["A", "missing"], ["C", "info"], axis=0)
    net.Concat(["A", "B"], ["bad", "bad_info"], axis=0)
    shapes, _ = workspace.InferShapesAndTypes([net], {"A": [2, 3], "B": [2, 4]})
    assert "C" not in shapes and "info" not in shapes
    assert "bad" not in shapes and "bad_info" not in shapes


def test_concat_and_split_inference_agrees_with_the_kernels() -> None:
    net = core.Net("concat_split_run")
    net.Concat(["x", "y"], ["xy", "xy_info"], axis=1)
    net.Concat(["x", "x"], ["xx", "xx_info"], axis=0, add_axis=1)
    net.Split(["xy"], ["s0", "s1", "s2"], axis=1, split=[1, 2, 2])
    net.Split(["x"], ["e0", "e1"], axis=-1)
    net.Split(["x"], ["r0", "r1", "r2"], axis=1, add_axis=1)
    rng = np.random.default_rng(0)
    shapes = _infer_and_run(net, {"x": rng.random((2, 3, 4), dtype=np.float32),
                                  "y": rng.random((2, 2, 4), dtype=np.float32)})
    assert shapes["s2"] == [2, 2, 4] and shapes["e1"] == [2, 3, 2] and shapes["r1"] == [2, 4]


def test_split_sizes_from_a_blob_or_uneven_stay_unknown() -> None:
    net = core.Net("split_unknown")
    net.Split(["x", "sizes"], ["a", "b"], axis=0)
    net.Split(["x"], ["c", "d"], axis=1)  # 3 columns do not split evenly in 2
    shapes, _ = workspace.InferShapesAndTypes([net], {"x": [4, 3], "sizes": [2]})
    assert not {"a", "b", "c", "d"} & set(shapes)


# --- ConvGradient, LearningRate, PadImage, DotProductWithPadding --------------------------
def test_conv_gradient_bias_and_input_gradients() -> None:
    net = core.Net("conv_grad")
    net.ConvGradient(["X", "W", "dY"], ["dW", "db", "dX"], kernel=3)
    net.ConvGradient(["X", "W", "dY"], ["dW2", "dX2"], kernel=3, no_bias=1)
    rng = np.random.default_rng(1)
    shapes = _infer_and_run(net, {"X": rng.random((2, 3, 5, 5), dtype=np.float32),
                                  "W": rng.random((4, 3, 3, 3), dtype=np.float32),
                                  "dY": rng.random((2, 4, 3, 3), dtype=np.float32)})
    assert shapes["db"] == [4] and shapes["dX2"] == [2, 3, 5, 5]


def test_conv_transpose_gradient_bias_has_channels_times_group() -> None:
    net = core.Net("conv_t_grad")
    net.ConvTransposeGradient(["X", "W", "dY"], ["dW", "db", "dX"], kernel=3, order="NHWC")
    shapes, _ = workspace.InferShapesAndTypes(
        [net], {"X": [2, 5, 5, 4], "W": [4, 3, 3, 6], "dY": [2, 7, 7, 6]})
    assert shapes["db"] == [6] and shapes["dW"] == [4, 3, 3, 6] and shapes["dX"] == [2, 5, 5, 4]


def test_learning_rate_has_the_iteration_shape() -> None:
    net = core.Net("lr")
    it = net.ConstantFill([], "iter", shape=[1], value=0, dtype=core.DataType.INT64)
    net.LearningRate([it], "lr", base_lr=0.5, policy="fixed")
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes["lr"] == [1] and types["lr"] == DT.FLOAT


def test_pad_image_shape_from_each_pad_spelling() -> None:
    net = core.Net("pad")
    net.PadImage("x", "a", pad_t=3, pad_l=1, pad_b=2, pad_r=0, mode="constant")
    net.PadImage("x", "b", pad=2, order="NCHW")
    net.PadImage("xh", "c", pads=[1, 2, 3, 4], order="NHWC")
    shapes, _ = workspace.InferShapesAndTypes([net], {"x": [16, 3, 228, 228],
                                                      "xh": [2, 5, 6, 3]})
    assert shapes["a"] == [16, 3, 233, 229] and shapes["b"] == [16, 3, 232, 232]
    assert shapes["c"] == [2, 9, 12, 3]


def test_first_dim_rules_for_the_distance_family() -> None:
    net = core.Net("dist")
    for op_type in ("L1Distance", "CosineSimilarity", "SquaredL2Distance", "DotProduct"):
        net.__getattr__(op_type)(["x", "y"], op_type + "_out")
    net.DotProductWithPadding(["x", "z"], "pad_out")
    shapes, _ = workspace.InferShapesAndTypes([net], {"x": [10, 5], "y": [10, 5], "z": [10, 4]})
    assert all(shapes[name] == [10] for name in shapes if name.endswith("_out"))
    assert len([n for n in shapes if n.endswith("_out")]) == 5


def test_data_sized_ops_follow_caffe2_rules_from_placeholders() -> None:
    """Inputs made by fills in the same net have shapes but no values yet: the rules answer
    from shapes and arguments (the kernels on zeros would say [0] or [1])."""
    net = core.Net("placeholders")
    net.ConstantFill([], "ranges", shape=[3, 5, 2], dtype=core.DataType.INT32)
    net.ConstantFill([], "values", shape=[64], dtype=core.DataType.INT64)
    net.GatherRanges(["values", "ranges"], ["gathered", "lengths"])
    net.GatherRangesToDense(["values", "ranges"], ["d0", "d1"], lengths=[2, 4])
    net.ConstantFill([], "big", shape=[5], dtype=core.DataType.INT64)
    net.Unique(["big"], ["uniq", "remap"])
    net.Slice(["values", "starts", "ends"], ["sliced_by_blobs"])
    shapes, types = workspace.InferShapesAndTypes([net], {})
    assert shapes["gathered"] == [64] and types["gathered"] == DT.INT64
    assert shapes["lengths"] == [3] and types["lengths"] == DT.INT32
    assert shapes["d0"] == [3, 2] and shapes["d1"] == [3, 4]
    assert "uniq" not in shapes and shapes["remap"] == [5] and types["remap"] == DT.INT32
    assert "sliced_by_blobs" not in shapes


def test_data_sized_op_rules_agree_with_the_kernels_on_real_inputs() -> None:
    net = core.Net("rules_vs_kernels")
    net.Slice(["x"], ["s"], starts=[1, 0], ends=[-1, -2])
    net.Tile(["x"], ["t"], tiles=3, axis=1)
    net.Shape(["x"], ["shape"])
    net.LengthsToRanges(["lens"], ["ranges"])
    net.LengthsPad(["rows", "lens"], ["padded"], target_length=4)
    net.GatherRanges(["data", "granges"], ["gathered", "glens"])
    net.AddPadding(["rows", "lens"], ["with_pad", "pad_lens"], padding_width=2)
    net.SparseToDense(["idx", "vals", "like"], ["dense"])
    net.Unique(["one"], ["u", "u_remap"])
    net.BatchOneHot(["bx", "blens", "bvals"], ["onehot"])
    rng = np.random.default_rng(5)
    _infer_and_run(net, {
        "x": rng.random((4, 5), dtype=np.float32),
        "lens": np.array([1, 2], np.int32), "rows": rng.random((3, 2), dtype=np.float32),
        "data": np.arange(6, dtype=np.float32),
        "granges": np.array([[[0, 2], [2, 1]], [[3, 3], [6, 0]]], np.int32),
        "idx": np.array([0, 2], np.int32), "vals": rng.random((2, 3), dtype=np.float32),
        "like": np.zeros(5, np.float32), "one": np.array([7], np.int64),
        "bx": np.array([[2, 3], [4, 1]], np.float32), "blens": np.array([2, 3], np.int32),
        "bvals": np.array([2, 4, 1, 3, 5], np.float32)})


# --- Caffe2's driver rules (runtime/shapes.py) -----------------------------------------------
def test_gradient_reshape_and_split_use_what_their_forward_ops_saw() -> None:
    net = core.Net("grad_caches")
    net.Reshape(["x"], ["x2", "x_old_shape"], shape=[2, -1])
    net.Concat(["x2", "y"], ["xy", "xy_info"], axis=1)
    net.AveragedLoss(["xy"], ["loss"])
    net.AddGradientOperators(["loss"])
    shapes, types = workspace.InferShapesAndTypes([net], {"x": [4, 3], "y": [2, 5]})
    assert shapes["x2_grad"] == [2, 6] and shapes["y_grad"] == [2, 5]
    assert shapes["x_grad"] == [4, 3] and types["x_grad"] == DT.FLOAT


def test_gradient_outputs_named_after_params_take_their_shapes() -> None:
    """DotProductGradient has no shape function: its outputs x_grad / y_grad come from x and
    y without running the kernel (which would reject these mismatched inputs)."""
    net = core.Net("grad_names")
    op = net.DotProductGradient(["x", "y", "d"], ["x_grad", "y_grad"])
    net.Proto().op[-1].is_gradient_op = True
    shapes, _ = workspace.InferShapesAndTypes([net], {"x": [3, 4], "y": [5], "d": [3]})
    assert shapes["x_grad"] == [3, 4] and shapes["y_grad"] == [5] and op is not None


def test_sum_gives_auto_split_inputs_a_shape() -> None:
    net = core.Net("autosplit")
    net.Sum(["g_autosplit_0", "g_autosplit_1"], ["g"])
    shapes, _ = workspace.InferShapesAndTypes([net], {"g_autosplit_1": [7, 2]})
    assert shapes["g_autosplit_0"] == [7, 2] and shapes["g"] == [7, 2]


def test_queue_ops_are_skipped_and_missing_types_are_undefined() -> None:
    net = core.Net("queues")
    net.EnqueueBlobs(["queue", "x"], ["x"])
    net.Relu(["x"], ["y"])
    shapes, types = workspace.InferShapesAndTypes(
        [net], {"x": [2], "queue": []}, blob_types={"queue": DT.FLOAT})
    assert shapes["y"] == [2] and types["x"] == DT.UNDEFINED


def test_non_tensor_workspace_blobs_are_present_but_unknown() -> None:
    workspace.RunOperatorOnce(core.CreateOperator("CreateMutex", [], ["mutex"]))
    workspace.FeedBlob("x", np.ones(3, np.float32))
    shapes, _ = workspace.InferShapesAndTypes([core.Net("empty")])
    assert "mutex" not in shapes and shapes["x"] == [3]


# --- L1Distance / CosineSimilarity kernels ---------------------------------------------------
def _op(op_type: str, inputs: list[str], outputs: list[str], **args: object
        ) -> caffe2_pb2.OperatorDef:
    return core.CreateOperator(op_type, inputs, outputs, **args)


def test_l1_distance_values_rows_and_gradient() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (3, 6)).astype(np.float32)
    y = rng.uniform(-1, 1, (3, 6)).astype(np.float32)
    x += 0.05 * np.sign(x - y)  # keep finite differences off the kinks
    op = _op("L1Distance", ["X", "Y"], ["D"])
    (dist,) = run_op(op, [x, y])
    np.testing.assert_allclose(dist, np.abs(x - y).sum(axis=1), rtol=1e-6)
    (flat,) = run_op(op, [x[:, 0].copy(), y[:, 0].copy()])  # 1-D: one value per row
    np.testing.assert_allclose(flat, np.abs(x[:, 0] - y[:, 0]), rtol=1e-6)
    check_gradient(op, [x, y], eps=1e-3)


def test_l1_distance_gradient_is_zero_on_ties() -> None:
    x = np.array([[1.0, 2.0]], np.float32)
    dx, dy = run_op(_op("L1DistanceGradient", ["X", "Y", "dD"], ["dX", "dY"]),
                    [x, np.array([[1.0, 3.0]], np.float32), np.array([2.0], np.float32)])
    np.testing.assert_array_equal(dx, [[0.0, -2.0]])
    np.testing.assert_array_equal(dy, [[0.0, 2.0]])


def test_cosine_similarity_values_and_gradient() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (3, 5)).astype(np.float32)
    y = rng.uniform(-1, 1, (3, 5)).astype(np.float32)
    op = _op("CosineSimilarity", ["X", "Y"], ["C"])
    (cos,) = run_op(op, [x, y])
    want = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    np.testing.assert_allclose(cos, want, rtol=1e-5)
    (zero,) = run_op(op, [np.zeros((2, 3), np.float32), y[:2, :3].copy()])
    np.testing.assert_array_equal(zero, [0.0, 0.0])  # norms floored, no NaN
    check_gradient(op, [x, y], eps=1e-3)


def test_distance_ops_reject_mismatched_shapes() -> None:
    workspace.FeedBlob("X", np.ones((2, 3), np.float32))
    workspace.FeedBlob("Y", np.ones((3, 2), np.float32))
    with pytest.raises(OperatorError, match="same shape"):
        workspace.RunOperatorOnce(_op("CosineSimilarity", ["X", "Y"], ["C"]))


# --- RoIPool ---------------------------------------------------------------------------------
def test_roi_pool_matches_roi_pool_f_and_infers_its_outputs() -> None:
    rng = np.random.default_rng(4)
    x = rng.random((2, 3, 6, 7), dtype=np.float32)
    rois = np.array([[0, 0, 0, 4, 3], [1, 1.4, 2, 6, 5]], np.float32)
    args = {"pooled_h": 2, "pooled_w": 3, "spatial_scale": 1.0}
    y, argmax = run_op(_op("RoIPool", ["X", "R"], ["Y", "A"], **args), [x, rois])
    y_f, argmax_f = run_op(_op("RoIPoolF", ["X", "R"], ["Y", "A"], **args), [x, rois])
    np.testing.assert_array_equal(y, y_f)
    np.testing.assert_array_equal(argmax, argmax_f)
    net = core.Net("roi")
    net.RoIPool(["X", "R"], ["Yt"], is_test=1, **args)
    net.RoIPool(["X", "R"], ["Y", "A"], **args)
    shapes = _infer_and_run(net, {"X": x, "R": rois})
    assert shapes["Y"] == shapes["A"] == shapes["Yt"] == [2, 3, 2, 3]


def test_roi_pool_output_count_follows_is_test() -> None:
    workspace.FeedBlob("X", np.ones((1, 1, 4, 4), np.float32))
    workspace.FeedBlob("R", np.array([[0, 0, 0, 3, 3]], np.float32))
    with pytest.raises(OperatorError, match="is_test"):
        workspace.RunOperatorOnce(_op("RoIPool", ["X", "R"], ["Y"]))


def test_roi_pool_gradient_routes_to_the_argmax() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 0, 3, 3]], np.float32)
    op = _op("RoIPool", ["X", "R"], ["Y", "A"], pooled_h=1, pooled_w=1)
    _, argmax = run_op(op, [x, rois])
    (dx,) = run_op(_op("RoIPoolGradient", ["X", "R", "A", "dY"], ["dX"]),
                   [x, rois, argmax, np.full((1, 1, 1, 1), 2.0, np.float32)])
    assert dx.reshape(-1)[15] == 2.0 and dx.sum() == 2.0


# --- GetOperatorCost -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.int8])
def test_concat_cost_counts_input_and_output_bytes(dtype: type) -> None:
    workspace.FeedBlob("a", np.ones((2, 3), dtype))
    workspace.FeedBlob("b", np.ones((2, 1), dtype))
    op = _op("Concat", ["a", "b"], ["out", "info"])
    workspace.RunOperatorOnce(op)
    flops, written, read = workspace.GetOperatorCost(op, op.input)
    assert flops == 0 and read == 8 * np.dtype(dtype).itemsize
    assert written == workspace.FetchBlob("out").nbytes + workspace.FetchBlob("info").nbytes


def test_split_cost_reads_the_sizes_blob_too() -> None:
    workspace.FeedBlob("x", np.ones((2, 3), np.int32))
    workspace.FeedBlob("sizes", np.array([1, 1, 1], np.int32))
    op = _op("Split", ["x", "sizes"], ["p", "q", "r"], axis=1, add_axis=1)
    assert tuple(workspace.GetOperatorCost(op, op.input)) == (0, 24, 36)
    plain = _op("Split", ["x"], ["p", "q"], axis=0)
    assert tuple(workspace.GetOperatorCost(plain, plain.input)) == (0, 24, 24)


_F32 = np.float32


@pytest.mark.parametrize("op_type,inputs,args,outputs,expected", [
    ("FC", [(4, 5), (3, 5), (3,)], {}, 1, (132, 48, 152)),
    ("FCTransposed", [(4, 5), (5, 3), (3,)], {}, 1, (132, 48, 152)),
    ("FCGradient", [(4, 5), (3, 5), (4, 3)], {}, 3, (252, 152, 0)),
    ("ConvGradient", [(2, 3, 5, 5), (4, 3, 3, 3), (2, 4, 3, 3)], {"kernel": 3}, 3,
     (7848, 1048, 1320)),
    ("ConvGradient", [(2, 3, 5, 5), (4, 3, 3, 3), (2, 4, 3, 3)], {"kernel": 3, "no_bias": 1},
     2, (7776, 1032, 1320)),
    ("Add", [(2, 3), (3,)], {"broadcast": 1}, 1, (6, 24, 36)),
    ("ReluN", [(5,)], {}, 1, (10, 20, 20)),
    ("Sum", [(2, 2), (2, 2), (2, 2)], {}, 1, (8, 16, 48)),
    ("WeightedSum", [(4,), (1,), (4,), (1,)], {}, 1, (12, 16, 40)),
    ("DotProduct", [(3, 4), (3, 4)], {}, 1, (24, 12, 96)),
    ("BatchMatMul", [(2, 3, 4), (2, 4, 5)], {}, 1, (240, 120, 256)),
    ("BatchMatMul", [(2, 3, 4), (2, 5, 4)], {"trans_b": 1}, 1, (240, 120, 256)),
])
def test_caffe2_cost_formulas(op_type: str, inputs: list, args: dict, outputs: int,
                              expected: tuple) -> None:
    names = [f"in{i}" for i in range(len(inputs))]
    for name, shape in zip(names, inputs):
        workspace.FeedBlob(name, np.ones(shape, _F32))
    op = _op(op_type, names, [f"out{i}" for i in range(outputs)], **args)
    assert tuple(workspace.GetOperatorCost(op, names)) == expected


def test_in_place_collectives_keep_their_tensors_shapes() -> None:
    net = core.Net("gloo")
    net.Allreduce(["cw", "g1", "g2"], ["g1", "g2"])
    net.Broadcast(["cw", "p"], ["p"])
    shapes, _ = workspace.InferShapesAndTypes([net], {"g1": [3, 4], "g2": [5], "p": [2]})
    assert shapes["g1"] == [3, 4] and shapes["g2"] == [5] and shapes["p"] == [2]


def test_every_named_shape_rule_targets_a_registered_op() -> None:
    from dpgraph.ops import shape_fns

    assert shape_fns.UNREGISTERED == []


def test_cost_of_an_op_without_a_cost_function_is_an_error() -> None:
    workspace.FeedBlob("x", np.ones(3, np.float32))
    with pytest.raises(WorkspaceError, match="no cost inference function"):
        workspace.GetOperatorCost(_op("Sigmoid", ["x"], ["y"]), ["x"])
