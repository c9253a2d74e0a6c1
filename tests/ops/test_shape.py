"""Shape ops: numpy references, gradient op structure and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ArgumentError, GradientError, ShapeError
from dpgraph.ir.arguments import arguments_dict
from dpgraph.ir.operator import CreateOperator
from dpgraph.ir.registry import OPERATORS
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, run_op, run_ops

RNG = np.random.default_rng(5)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def structure(ops) -> list:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def test_flatten_and_flatten_to_vec() -> None:
    x = rand(2, 3, 4)
    op = CreateOperator("Flatten", ["X"], ["Y"])
    assert run_op(op, [x])[0].shape == (2, 12)
    assert run_op(CreateOperator("Flatten", ["X"], ["Y"], axis=2), [x])[0].shape == (6, 4)
    ops, _ = build_gradient(op, ["Y_grad"])
    assert structure(ops) == [("ResizeLike", ["Y_grad", "X"], ["X_grad"])]
    check_gradient(op, [x])
    vec = CreateOperator("FlattenToVec", ["X"], ["Y"])
    assert run_op(vec, [x])[0].shape == (24,)
    check_gradient(vec, [x])
    assert OPERATORS.lookup("Flatten").shape_fn(op, [(2, 3, 4)], [1]) == [((2, 12), 1)]


def test_reshape_arg_input_and_gradient() -> None:
    x = rand(2, 3, 4)
    op = CreateOperator("Reshape", ["X"], ["Y", "old"], shape=[0, -1])
    y, old = run_op(op, [x])
    assert y.shape == (2, 12) and old.dtype == np.int64
    np.testing.assert_array_equal(old, [2, 3, 4])
    y2, _ = run_op(CreateOperator("Reshape", ["X", "S"], ["Y", "old"]),
                   [x, np.array([4, 6], np.int64)])
    assert y2.shape == (4, 6)
    ops, _ = build_gradient(op, ["Y_grad", None])
    assert structure(ops) == [("Reshape", ["Y_grad", "old"], ["X_grad", "_X_grad_dims"])]
    assert not ops[0].arg
    check_gradient(op, [x])
    with pytest.raises(ShapeError):
        run_op(CreateOperator("Reshape", ["X"], ["Y", "o"], shape=[5, -1]), [x])
    with pytest.raises(ArgumentError):
        run_op(CreateOperator("Reshape", ["X"], ["Y", "o"], shape=[-1, -1]), [x])


@pytest.mark.parametrize("axes", [None, [1, 2, 0], [0, 2, 1]])
def test_transpose_and_inverse_gradient(axes) -> None:
    x = rand(2, 3, 4)
    op = CreateOperator("Transpose", ["X"], ["Y"], axes=axes)
    (y,) = run_op(op, [x])
    np.testing.assert_array_equal(y, np.transpose(x, axes))
    ops, _ = build_gradient(op, ["Y_grad"])
    assert ops[0].type == "Transpose"
    if axes:
        assert arguments_dict(ops[0].arg)["axes"] == list(np.argsort(axes))
    check_gradient(op, [x])


def test_layout_ops_are_each_others_gradient() -> None:
    x = rand(2, 3, 4, 5)
    to_nchw = CreateOperator("NHWC2NCHW", ["X"], ["Y"])
    np.testing.assert_array_equal(run_op(to_nchw, [x])[0], x.transpose(0, 3, 1, 2))
    to_nhwc = CreateOperator("NCHW2NHWC", ["X"], ["Y"])
    np.testing.assert_array_equal(run_op(to_nhwc, [x])[0], x.transpose(0, 2, 3, 1))
    assert build_gradient(to_nchw, ["Y_grad"])[0][0].type == "NCHW2NHWC"
    assert build_gradient(to_nhwc, ["Y_grad"])[0][0].type == "NHWC2NCHW"
    check_gradient(to_nchw, [x[:1, :2]])


def test_concat_split_roundtrip_and_gradients() -> None:
    a, b = rand(2, 3), rand(2, 5)
    op = CreateOperator("Concat", ["A", "B"], ["C", "info"], axis=1)
    c, info = run_op(op, [a, b])
    np.testing.assert_array_equal(c, np.concatenate([a, b], axis=1))
    assert info.dtype == np.int32 and list(info) == [3, 5]
    ops, g_in = build_gradient(op, ["C_grad", None])
    assert structure(ops) == [("Split", ["C_grad", "info"], ["A_grad", "B_grad"])]
    check_gradient(op, [a, b])
    split = CreateOperator("Split", ["C"], ["P", "Q"], split=[3, 5], axis=1)
    p, q = run_op(split, [c])
    np.testing.assert_array_equal(p, a)
    np.testing.assert_array_equal(q, b)
    ops, _ = build_gradient(split, ["P_grad", "Q_grad"])
    assert structure(ops) == [("Concat", ["P_grad", "Q_grad"], ["C_grad", "_C_grad_dims"])]
    check_gradient(split, [c], outputs_with_grads=(0, 1))


def test_concat_order_and_add_axis() -> None:
    a, b = rand(1, 2, 2, 3), rand(1, 2, 2, 4)
    (c, _) = run_op(CreateOperator("Concat", ["A", "B"], ["C", "i"], order="NHWC"), [a, b])
    assert c.shape == (1, 2, 2, 7)
    x, y = rand(2, 3), rand(2, 3)
    stacked, info = run_op(CreateOperator("Concat", ["X", "Y"], ["S", "i"], axis=0,
                                          add_axis=1), [x, y])
    np.testing.assert_array_equal(stacked, np.stack([x, y]))
    parts = run_op(CreateOperator("Split", ["S", "i"], ["P", "Q"], axis=0, add_axis=1),
                   [stacked, info])
    np.testing.assert_array_equal(parts[1], y)


def test_split_equal_parts_input_sizes_and_missing_grads() -> None:
    x = rand(6, 2)
    p, q, r = run_op(CreateOperator("Split", ["X"], ["P", "Q", "R"], axis=0), [x])
    assert p.shape == q.shape == r.shape == (2, 2)
    p, q = run_op(CreateOperator("Split", ["X", "s"], ["P", "Q"], axis=0),
                  [x, np.array([1, 5], np.int32)])
    assert p.shape == (1, 2) and q.shape == (5, 2)
    op = CreateOperator("Split", ["X"], ["P", "Q"], axis=0)
    ops, _ = build_gradient(op, [None, "Q_grad"])
    state = run_ops([op, *ops], {"X": x, "Q_grad": np.ones((3, 2))})
    np.testing.assert_array_equal(state["X_grad"], np.r_[np.zeros((3, 2)), np.ones((3, 2))])
    with pytest.raises(ShapeError):
        run_op(CreateOperator("Split", ["X"], ["P", "Q"], split=[1, 2], axis=0), [x])


def test_concat_gradient_needs_split_info() -> None:
    with pytest.raises(GradientError, match="split_info"):
        build_gradient(CreateOperator("Concat", ["A", "B"], ["C"]), ["C_grad"])


def test_split_by_lengths() -> None:
    data = rand(6)
    op = CreateOperator("SplitByLengths", ["D", "L"], ["P", "Q"])
    p, q = run_op(op, [data, np.array([1, 2, 2, 1], np.int32)])
    np.testing.assert_array_equal(p, data[:3])
    np.testing.assert_array_equal(q, data[3:])
    ops, _ = build_gradient(op, ["P_grad", "Q_grad"])
    assert structure(ops) == [("Concat", ["P_grad", "Q_grad"], ["D_grad", "_D_grad_dims"])]


@pytest.mark.parametrize("starts,ends", [([1, 0], [3, -1]), ([0, 1], [-1, -2]), ([2], [4])])
def test_slice_args_and_inputs(starts, ends) -> None:
    x = rand(4, 5)
    op = CreateOperator("Slice", ["X"], ["Y"], starts=starts, ends=ends)
    index = tuple(slice(s, e + 1 + d if e < 0 else e)
                  for s, e, d in zip(starts, ends, x.shape))
    np.testing.assert_array_equal(run_op(op, [x])[0], x[index])
    check_gradient(op, [x])
    op2 = CreateOperator("Slice", ["X", "s", "e"], ["Y"])
    inputs = [x, np.array(starts, np.int32), np.array(ends, np.int32)]
    np.testing.assert_array_equal(run_op(op2, inputs)[0], x[index])
    ops, _ = build_gradient(op2, ["Y_grad"])
    assert structure(ops) == [("SliceGradient", ["X", "s", "e", "Y_grad"], ["X_grad"])]
    check_gradient(op2, inputs, inputs_to_check=[0])


def test_expand_dims_squeeze() -> None:
    x = rand(2, 3)
    op = CreateOperator("ExpandDims", ["X"], ["Y"], dims=[0, 3])
    (y,) = run_op(op, [x])
    assert y.shape == (1, 2, 3, 1)
    assert build_gradient(op, ["Y_grad"])[0][0].type == "Squeeze"
    check_gradient(op, [x])
    sq = CreateOperator("Squeeze", ["Y"], ["Z"], dims=[0, 3])
    assert run_op(sq, [y])[0].shape == (2, 3)
    with pytest.raises(ShapeError):
        run_op(CreateOperator("Squeeze", ["X"], ["Z"], dims=[0]), [x])


def test_tile_numpy_tile_expand() -> None:
    x = rand(2, 3)
    op = CreateOperator("Tile", ["X"], ["Y"], tiles=3, axis=1)
    np.testing.assert_array_equal(run_op(op, [x])[0], np.tile(x, (1, 3)))
    check_gradient(op, [x])
    nt = run_op(CreateOperator("NumpyTile", ["X", "r"], ["Y"]), [x, np.array([2, 2])])[0]
    np.testing.assert_array_equal(nt, np.tile(x, (2, 2)))
    ex = CreateOperator("Expand", ["X", "s"], ["Y"])
    col = rand(3, 1)
    np.testing.assert_array_equal(run_op(ex, [col, np.array([2, 3, 4])])[0],
                                  np.broadcast_to(col, (2, 3, 4)))
    assert structure(build_gradient(ex, ["Y_grad"])[0]) == [
        ("ExpandGradient", ["Y_grad", "X"], ["X_grad"])]
    check_gradient(ex, [col, np.array([2, 3, 4])], inputs_to_check=[0])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_channel_shuffle_and_gradient(order: str) -> None:
    x = rand(1, 6, 2, 2) if order == "NCHW" else rand(1, 2, 2, 6)
    op = CreateOperator("ChannelShuffle", ["X"], ["Y"], group=2, order=order)
    (y,) = run_op(op, [x])
    perm = [0, 3, 1, 4, 2, 5]
    expected = x[:, perm] if order == "NCHW" else x[..., perm]
    np.testing.assert_array_equal(y, expected)
    check_gradient(op, [x])


def test_size_and_shape() -> None:
    x = rand(2, 3)
    (size,) = run_op(CreateOperator("Size", ["X"], ["n"]), [x])
    assert size.shape == () and size.dtype == np.int64 and int(size) == 6
    (shape,) = run_op(CreateOperator("Shape", ["X"], ["s"]), [x])
    np.testing.assert_array_equal(shape, [2, 3])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_transpose_random_permutation(shape: list[int], data) -> None:
    axes = data.draw(st.permutations(list(range(len(shape)))))
    x = np.random.default_rng(len(shape)).standard_normal(shape)  # keeps the shared RNG stable
    op = CreateOperator("Transpose", ["X"], ["Y"], axes=axes)
    (y,) = run_op(op, [x])
    ops, _ = build_gradient(op, ["Y_grad"])
    state = run_ops(ops, {"Y_grad": y})
    np.testing.assert_array_equal(state["X_grad"], x)


def test_concat_and_reshape_shape_functions() -> None:
    concat = CreateOperator("Concat", ["A", "B"], ["C", "info"], axis=1)
    infer = OPERATORS.lookup("Concat").shape_fn
    assert infer(concat, [(2, 3), (2, 5)], [1, 1]) == [((2, 8), 1), ((2,), 2)]
    stacked = CreateOperator("Concat", ["A", "B"], ["C", "info"], axis=0, add_axis=1)
    assert infer(stacked, [(2, 3), (2, 3)], [1, 1])[0] == ((2, 2, 3), 1)
    reshape = CreateOperator("Reshape", ["X"], ["Y", "old"], shape=[0, -1])
    assert OPERATORS.lookup("Reshape").shape_fn(reshape, [(2, 3, 4)], [1]) == [
        ((2, 12), 1), ((3,), 10)]


def test_depth_concat_split_aliases() -> None:
    a, b = rand(2, 3), rand(2, 1)
    op = CreateOperator("DepthConcat", ["A", "B"], ["C", "info"])
    c, info = run_op(op, [a, b])
    assert c.shape == (2, 4) and list(info) == [3, 1]
    assert build_gradient(op, ["C_grad", None])[0][0].type == "Split"
    p, q = run_op(CreateOperator("DepthSplit", ["C", "info"], ["P", "Q"]), [c, info])
    np.testing.assert_array_equal(q, b)


@pytest.mark.parametrize("op_type,args,outputs", [
    ("Reshape", {"shape": [3, 2]}, ["y", "old"]),
    ("Flatten", {}, ["y"]),
    ("FlattenToVec", {}, ["y"]),
    ("ExpandDims", {"dims": [0]}, ["y"]),
    ("Transpose", {"axes": [0, 1]}, ["y"]),
    ("Split", {"axis": 0}, ["y", "z"]),
])
def test_outputs_never_share_the_input_memory_unless_in_place(op_type, args, outputs) -> None:
    """Kernels update blobs in place where Caffe2's ops are in place, so a reshaped (split,
    transposed) output is a copy, as in Caffe2, unless the op is itself in place."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = run_op(CreateOperator(op_type, ["x"], outputs, **args), [x])
    assert not any(np.shares_memory(out, x) for out in outs)
    (same, *_) = run_op(CreateOperator(op_type, ["x"], ["x", *outputs[1:]], **args), [x])
    assert np.shares_memory(same, x)  # in place: no copy needed


def test_reshape_of_empty_tensors_keeps_zero_dims() -> None:
    for old, new, expected in [((0,), [0, -1], (0, 0)), ((2, 0), [-1, 0], (0, 0)),
                               ((0,), [1, -1], (1, 0)), ((4, 2, 1), [0, -1, 0], (4, 2, 1)),
                               ((1, 0), [0], (0,))]:
        out, old_shape = run_op(CreateOperator("Reshape", ["X"], ["Y", "s"], shape=new),
                                [np.zeros(old, np.float32)])
        assert out.shape == expected and old_shape.tolist() == list(old)
    with pytest.raises(ShapeError, match="zero size"):
        run_op(CreateOperator("Reshape", ["X"], ["Y", "s"], shape=[-1, 0, 3]),
               [np.zeros(3, np.float32)])


def test_lengths_to_shape_and_scaled_split_by_lengths() -> None:
    (shape,) = run_op(CreateOperator("LengthsToShape", ["l"], ["s"]),
                      [np.array([200, 200, 200], np.int32)])
    assert shape.dtype == np.int32 and shape.tolist() == [3, 200]
    with pytest.raises(ShapeError, match="equal"):
        run_op(CreateOperator("LengthsToShape", ["l"], ["s"]), [np.array([1, 2], np.int32)])
    data = np.arange(12, dtype=np.float32)
    a, b = run_op(CreateOperator("SplitByLengths", ["d", "l"], ["a", "b"],
                                 use_scaling_lengths=1), [data, np.array([1, 2], np.int32)])
    np.testing.assert_array_equal(a, data[:4])
    np.testing.assert_array_equal(b, data[4:])
    empty = run_op(CreateOperator("SplitByLengths", ["d", "l"], ["a", "b"],
                                  use_scaling_lengths=1), [data[:0], np.array([1, 1], np.int32)])
    assert [e.shape for e in empty] == [(0,), (0,)]


def test_scalars_stay_zero_dimensional_through_split_and_transpose() -> None:
    op = CreateOperator("Concat", ["a", "b"], ["y", "info"], axis=-1, add_axis=1)
    y, info = run_op(op, [np.array(1.0), np.array(2.0)])
    ops, _ = build_gradient(op, ["y_grad"])
    assert [g.shape for g in run_op(ops[0], [y, info])] == [(), ()]
    (t,) = run_op(CreateOperator("Transpose", ["x"], ["y"]), [np.array(3.0)])
    assert t.shape == ()


def test_expand_dims_ignores_repeated_dims() -> None:
    (y,) = run_op(CreateOperator("ExpandDims", ["X"], ["Y"], dims=[0, 0, 2]),
                  [np.zeros((3, 4), np.float32)])
    assert y.shape == (1, 3, 1, 4)


def test_expand_reads_negative_dims_by_their_absolute_value() -> None:
    (y,) = run_op(CreateOperator("Expand", ["X", "S"], ["Y"]),
                  [np.ones((1, 3, 1), np.float32), np.array([3, -1, 3])])
    assert y.shape == (3, 3, 3)
