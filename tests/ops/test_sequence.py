"""Sequence ops (ops/sequence.py): loop references, gradient ops and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(5)


def summary(ops: list) -> list[tuple]:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def segments(data: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    bounds = np.cumsum(lens)[:-1]
    return np.split(data, bounds) if len(lens) else []


# --- paddings --------------------------------------------------------------------------------
def test_add_padding_matches_reference_and_gradients() -> None:
    lens = np.array([2, 0, 3], np.int32)
    data = RNG.standard_normal((5, 2))
    start, end = RNG.standard_normal(2), RNG.standard_normal(2)
    op = make_op("AddPadding", ["D", "L", "S", "E"], ["Y", "LY"], padding_width=2,
                 end_padding_width=1)
    y, ly = run_op(op, [data, lens, start, end])
    expected = np.concatenate([np.vstack([start, start, seg, end])
                               for seg in segments(data, lens)])
    np.testing.assert_allclose(y, expected)
    assert ly.dtype == np.int32 and ly.tolist() == [5, 3, 6]
    ops, g_in = build_gradient(op, ["Y_grad", None])
    assert summary(ops) == [("RemovePadding", ["Y_grad", "LY"], ["D_grad"]),
                            ("GatherPadding", ["Y_grad", "LY"], ["S_grad", "E_grad"])]
    assert g_in == ["D_grad", None, "S_grad", "E_grad"]
    check_gradient(op, [data, lens, start, end], inputs_to_check=[0, 2, 3])


def test_add_padding_defaults_and_remove_padding_round_trip() -> None:
    data = RNG.standard_normal((4, 3)).astype(np.float32)
    (y,) = run_op(make_op("AddPadding", ["D"], ["Y"]), [data])
    np.testing.assert_array_equal(y, np.vstack([np.zeros((1, 3)), data, np.zeros((1, 3))]))
    lens = np.array([1, 3], np.int64)
    padded, plen = run_op(make_op("AddPadding", ["D", "L"], ["Y", "LY"]), [data, lens])
    back, blen = run_op(make_op("RemovePadding", ["Y", "LY"], ["X", "LX"]), [padded, plen])
    np.testing.assert_array_equal(back, data)
    assert blen.tolist() == [1, 3] and blen.dtype == np.int64
    remove = make_op("RemovePadding", ["Y", "LY"], ["X", "LX"])
    ops, _ = build_gradient(remove, ["X_grad", None])
    assert summary(ops) == [("AddPadding", ["X_grad", "LX"], ["Y_grad"])]
    check_gradient(remove, [padded.astype(np.float64), plen])
    (total,) = run_op(make_op("GatherPadding", ["Y", "LY"], ["P"]), [padded + 1, plen])
    np.testing.assert_allclose(total, np.full(3, 4.0))  # 2 segments × (start + end) of ones
    same = run_op(make_op("AddPadding", ["D", "L"], ["Y", "LY"], padding_width=0), [data, lens])
    np.testing.assert_array_equal(same[0], data)
    with pytest.raises(ShapeError, match="lengths sum"):
        run_op(make_op("AddPadding", ["D", "L"], ["Y"]), [data, np.array([1, 1])])


# --- packing ---------------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=5))
def test_pack_unpack_segments_round_trip(lengths: list[int]) -> None:
    lens = np.array(lengths, np.int32)
    data = RNG.standard_normal((int(lens.sum()), 2)).astype(np.float32)
    packed, mask = run_op(make_op("PackSegments", ["L", "D"], ["P", "M"],
                                  return_presence_mask=1), [lens, data])
    width = max(lengths, default=0)
    assert packed.shape == (len(lengths), width, 2) and mask.shape == (len(lengths), width)
    for i, seg in enumerate(segments(data, lens)):
        np.testing.assert_array_equal(packed[i, :len(seg)], seg)
        assert not packed[i, len(seg):].any() and mask[i].sum() == len(seg)
    (back,) = run_op(make_op("UnpackSegments", ["L", "P"], ["D2"]), [lens, packed])
    np.testing.assert_array_equal(back, data)


def test_pack_segments_options_and_gradients() -> None:
    lens = np.array([1, 3], np.int64)
    data = RNG.standard_normal((4, 2))
    op = make_op("PackSegments", ["L", "D"], ["P"], max_length=5, pad_minf=1)
    (packed,) = run_op(op, [lens, data])
    assert packed.shape == (2, 5, 2) and np.isneginf(packed[0, 1:]).all()
    ops, _ = build_gradient(op, ["P_grad"])
    assert summary(ops) == [("UnpackSegments", ["L", "P_grad"], ["D_grad"])]
    check_gradient(make_op("PackSegments", ["L", "D"], ["P"]), [lens, data])
    check_gradient(make_op("UnpackSegments", ["L", "P"], ["D"]),
                   [lens, RNG.standard_normal((2, 3, 2))])
    with pytest.raises(ShapeError, match="max_length"):
        run_op(make_op("PackSegments", ["L", "D"], ["P"], max_length=-3), [lens, data])


def test_pack_and_unpack_rnn_sequence() -> None:
    lens = np.array([2, 0, 3], np.int32)
    values = RNG.standard_normal((5, 2))
    op = make_op("PackRNNSequence", ["V", "L"], ["O"])
    (out,) = run_op(op, [values, lens])
    assert out.shape == (3, 3, 2)
    np.testing.assert_array_equal(out[:2, 0], values[:2])
    np.testing.assert_array_equal(out[:, 2], values[2:])
    assert not out[:, 1].any() and not out[2, 0].any()
    (back,) = run_op(make_op("UnpackRNNSequence", ["O", "L"], ["V2"]), [out, lens])
    np.testing.assert_array_equal(back, values)
    ops, _ = build_gradient(op, ["O_grad"])
    assert summary(ops) == [("UnpackRNNSequence", ["O_grad", "L"], ["V_grad"])]
    check_gradient(op, [values, lens])
    check_gradient(make_op("UnpackRNNSequence", ["O", "L"], ["V"]), [out, lens])


def test_reverse_packed_segs() -> None:
    data = RNG.standard_normal((4, 3, 2))
    lens = np.array([4, 2, 0], np.int64)
    op = make_op("ReversePackedSegs", ["D", "L"], ["R"])
    (out,) = run_op(op, [data, lens])
    expected = data.copy()
    for n, length in enumerate(lens):
        expected[:length, n] = data[:length, n][::-1]
    np.testing.assert_array_equal(out, expected)
    ops, _ = build_gradient(op, ["R_grad"])
    assert summary(ops) == [("ReversePackedSegs", ["R_grad", "L"], ["D_grad"])]
    check_gradient(op, [data, lens])


# --- lengths ops -----------------------------------------------------------------------------
def test_lengths_pad_and_split() -> None:
    data = RNG.standard_normal((3, 2)).astype(np.float32)
    lens = np.array([1, 0, 2], np.int32)
    (out,) = run_op(make_op("LengthsPad", ["D", "L"], ["O"], target_length=3,
                            padding_value=7.0), [data, lens])
    expected = np.full((9, 2), 7.0, np.float32)
    expected[0], expected[6:8] = data[0], data[1:]
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ShapeError, match="target_length"):
        run_op(make_op("LengthsPad", ["D", "L"], ["O"], target_length=1), [data, lens])
    (parts,) = run_op(make_op("LengthsSplit", ["L"], ["Y"], n_split=3),
                      [np.array([7, 2], np.int32)])
    assert parts.dtype == np.int32 and parts.tolist() == [3, 2, 2, 1, 1, 0]
    (parts,) = run_op(make_op("LengthsSplit", ["L", "N"], ["Y"]),
                      [np.array([4], np.int64), np.array([2], np.int32)])
    assert parts.tolist() == [2, 2]


def test_lengths_top_k_and_gradient() -> None:
    x = RNG.permutation(9).astype(np.float64)
    lens = np.array([4, 1, 0, 4], np.int32)
    op = make_op("LengthsTopK", ["X", "L"], ["V", "I"], k=2)
    values, indices = run_op(op, [x, lens])
    assert values.shape == (4, 2) and indices.dtype == np.int32
    for i, seg in enumerate(segments(x, lens)):
        order = np.argsort(-seg, kind="stable")[:2]
        assert indices[i].tolist() == order.tolist() + [-1] * (2 - len(order))
        assert values[i].tolist() == seg[order].tolist() + [0.0] * (2 - len(order))
    ops, _ = build_gradient(op, ["V_grad", None])
    assert summary(ops) == [("LengthsTopKGradient", ["L", "I", "V_grad"], ["X_grad"])]
    check_gradient(op, [x, lens])


def test_lengths_gather_and_gather_ranges() -> None:
    items = np.arange(10.0).reshape(5, 2)
    lens = np.array([2, 0, 3], np.int32)
    (out,) = run_op(make_op("LengthsGather", ["D", "L", "I"], ["O"]),
                    [items, lens, np.array([2, 1, 0, 2])])
    np.testing.assert_array_equal(out, items[[2, 3, 4, 0, 1, 2, 3, 4]])
    data = np.arange(10, 20).astype(np.float32)
    ranges = np.array([[[0, 2], [5, 1]], [[3, 0], [8, 2]]], np.int32)
    gathered, glens = run_op(make_op("GatherRanges", ["D", "R"], ["O", "L"]), [data, ranges])
    assert gathered.tolist() == [10, 11, 15, 18, 19] and glens.tolist() == [3, 2]
    assert glens.dtype == np.int32


def test_gather_ranges_to_dense_with_and_without_key() -> None:
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], np.float32)
    ranges = np.array([[[0, 2], [2, 1]], [[3, 0], [4, 1]], [[3, 2], [5, 0]]], np.int64)
    op = make_op("GatherRangesToDense", ["D", "R"], ["A", "B"], lengths=[2, 1])
    a, b = run_op(op, [data, ranges])
    np.testing.assert_array_equal(a, [[1, 2], [0, 0], [4, 5]])
    np.testing.assert_array_equal(b, [[3], [5], [0]])
    key = np.array([9, 1, 0, 5, 2, 0], np.int64)
    keyed = make_op("GatherRangesToDense", ["D", "R", "K"], ["A", "B"], lengths=[2, 1])
    a, _ = run_op(keyed, [data, ranges, key])
    np.testing.assert_array_equal(a, [[2, 1], [0, 0], [5, 4]])
    # a mismatched length gives a zero row; too many of them over the op's life are an error
    from dpgraph import core, workspace

    workspace.FeedBlob("grd_D", data)
    workspace.FeedBlob("grd_R", np.array([[[0, 2], [0, 2]]], np.int64))
    net = core.Net("gather_ranges_lenient")
    net.GatherRangesToDense(["grd_D", "grd_R"], ["grd_A", "grd_B"], lengths=[2, 1],
                            min_observation=4, max_mismatched_ratio=0.5)
    workspace.CreateNet(net)
    for _ in range(2):  # 1 and 2 mismatches of B, allowed: max(seen, 4) * 0.5 = 2
        workspace.RunNet(net)
        np.testing.assert_array_equal(workspace.FetchBlob("grd_B"), [[0]])
    with pytest.raises(ShapeError, match=r"mismatch for feature at index 1 .*\(3/3\).*\[2\]"):
        workspace.RunNet(net)
    strict = make_op("GatherRangesToDense", ["D", "R"], ["A", "B"], lengths=[2, 1],
                     max_empty_ratio=0.1, min_observation=1)
    with pytest.raises(ShapeError, match="empty ranges for feature at index 0"):
        run_op(strict, [data, ranges])


# --- id lists, blocks, masks -----------------------------------------------------------------
def test_merge_id_lists() -> None:
    l0, v0 = np.array([2, 0, 1], np.int32), np.array([5, 3, 4], np.int64)
    l1, v1 = np.array([1, 2, 1], np.int32), np.array([3, 7, 7, 4], np.int64)
    lens, values = run_op(make_op("MergeIdLists", ["L0", "V0", "L1", "V1"], ["L", "V"]),
                          [l0, v0, l1, v1])
    assert lens.tolist() == [2, 1, 1] and values.tolist() == [3, 5, 7, 4]
    assert lens.dtype == np.int32 and values.dtype == np.int64


def test_remove_data_blocks_and_boolean_unmask() -> None:
    data = np.arange(12.0).reshape(6, 2)
    (out,) = run_op(make_op("RemoveDataBlocks", ["D", "I"], ["O"]),
                    [data, np.array([4, 0, 4], np.int32)])
    np.testing.assert_array_equal(out, data[[1, 2, 3, 5]])
    with pytest.raises(ShapeError, match="indices"):
        run_op(make_op("RemoveDataBlocks", ["D", "I"], ["O"]), [data, np.array([6])])
    masks = [np.array([True, False, False, True]), np.array([False, True, True, False])]
    op = make_op("BooleanUnmask", ["M0", "V0", "M1", "V1"], ["O"])
    (out,) = run_op(op, [masks[0], np.array([1, 4]), masks[1], np.array([2, 3])])
    assert out.tolist() == [1, 2, 3, 4]
    with pytest.raises(ShapeError, match="exactly one mask"):
        run_op(op, [masks[0], np.array([1, 4]), masks[0], np.array([2, 3])])


def test_lengths_top_k_shape_function() -> None:
    from dpgraph.ir.registry import OPERATORS

    op = make_op("LengthsTopK", ["X", "L"], ["V", "I"], k=3)
    assert OPERATORS.lookup("LengthsTopK").shape_fn(op, [(10,), (4,)], [1, 2]) == [
        ((4, 3), 1), ((4, 3), 2)]


def test_pack_segments_max_length_keeps_each_segments_first_rows() -> None:
    lengths = np.array([1, 3, 2], np.int32)
    data = np.arange(6, dtype=np.float32).reshape(6, 1)
    (packed,) = run_op(make_op("PackSegments", ["l", "d"], ["t"], max_length=2),
                       [lengths, data])
    assert packed[:, :, 0].tolist() == [[0, 0], [1, 2], [4, 5]]
    (unpacked,) = run_op(make_op("UnpackSegments", ["l", "t"], ["d"], max_length=2),
                         [lengths, packed])
    assert unpacked[:, 0].tolist() == [0, 1, 2, 4, 5]
