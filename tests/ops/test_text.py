"""Mixed ops of ops/text.py: strings, hashing, top-k, CTC decoders, calibration, GRU unit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph.errors import ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(17)


def summary(ops: list) -> list[tuple]:
    return [(o.type, list(o.input), list(o.output)) for o in ops]


# --- strings and hashing ---------------------------------------------------------------------
def test_string_prefix_and_suffix() -> None:
    strings = np.array([b"apple", b"banana", b"", b"avocado"])
    (starts,) = run_op(make_op("StringStartsWith", ["S"], ["B"], prefix="a"), [strings])
    (ends,) = run_op(make_op("StringEndsWith", ["S"], ["B"], suffix="na"), [strings])
    assert starts.tolist() == [True, False, False, True]
    assert ends.tolist() == [False, True, False, False]
    objects = np.array(["xa", b"ax"], dtype=object).reshape(2, 1)
    (obj,) = run_op(make_op("StringEndsWith", ["S"], ["B"], suffix="a"), [objects])
    assert obj.shape == (2, 1) and obj.reshape(-1).tolist() == [True, False]


def hash_reference(value: int, seed: int, modulo: int, width: int) -> int:
    bits = 8 * width
    hashed = (seed * 0xDEADBEEF) % (1 << bits)
    for byte in value.to_bytes(width, "little", signed=True):
        signed_byte = byte - 256 if byte > 127 else byte
        hashed = (hashed * 65537 + signed_byte) % (1 << bits)
    if hashed >= 1 << (bits - 1):
        hashed -= 1 << bits
    rem = abs(hashed) % modulo * (1 if hashed >= 0 else -1)  # C++ truncating remainder
    return rem + modulo if rem < 0 else rem


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_index_hash_matches_reference(dtype: type) -> None:
    values = np.array([0, 1, -1, 255, 123456, -98765, 2**31 - 1], dtype)
    for seed, modulo in [(0, 100000), (7, 13), (-3, 1 << 20)]:
        op = make_op("IndexHash", ["I"], ["H"], seed=seed, modulo=modulo)
        (out,) = run_op(op, [values])
        width = np.dtype(dtype).itemsize
        assert out.dtype == dtype
        assert out.tolist() == [hash_reference(int(v), seed, modulo, width) for v in values]
    with pytest.raises(ShapeError, match="modulo"):
        run_op(make_op("IndexHash", ["I"], ["H"]), [values])


# --- TopK / FlexibleTopK ---------------------------------------------------------------------
def test_top_k_values_indices_and_gradient() -> None:
    x = RNG.permutation(24).reshape(2, 3, 4).astype(np.float64)
    op = make_op("TopK", ["X"], ["V", "I", "F"], k=2, axis=1)
    values, indices, flat = run_op(op, [x])
    expected = np.argsort(-x, axis=1)[:, :2]
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis=1))
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(x.reshape(-1)[flat], values.reshape(-1))
    ops, _ = build_gradient(op, ["V_grad", None, None])
    assert summary(ops) == [("TopKGradient", ["V_grad", "I", "X"], ["X_grad"])]
    check_gradient(make_op("TopK", ["X"], ["V", "I"], k=3), [x])
    (ties,) = run_op(make_op("TopK", ["X"], ["V", "I"], k=2), [np.zeros((1, 3))])[1:]
    assert ties.tolist() == [[0, 1]]


def test_flexible_top_k_and_gradient() -> None:
    x = RNG.permutation(12).reshape(3, 4).astype(np.float64)
    k = np.array([1, 3, 2], np.int64)
    op = make_op("FlexibleTopK", ["X", "K"], ["V", "I"])
    values, indices = run_op(op, [x, k])
    exp_idx = np.concatenate([np.argsort(-row)[:n] for row, n in zip(x, k)])
    np.testing.assert_array_equal(indices, exp_idx)
    np.testing.assert_array_equal(values, x[np.repeat(np.arange(3), k), exp_idx])
    ops, _ = build_gradient(op, ["V_grad", None])
    assert summary(ops) == [("FlexibleTopKGradient", ["X", "K", "V_grad", "I"], ["X_grad"])]
    check_gradient(op, [x, k])
    with pytest.raises(ShapeError, match="k"):
        run_op(op, [x, np.array([1, 5, 1])])


# --- CTC decoders ----------------------------------------------------------------------------
def greedy_reference(inputs: np.ndarray, lens: list[int], merge: bool) -> list[list[int]]:
    decoded = []
    for n, length in enumerate(lens):
        out, prev = [], 0
        for t in range(length):
            c = int(np.argmax(inputs[t, n]))
            if c != 0 and not (merge and c == prev):
                out.append(c)
            prev = c
        decoded.append(out)
    return decoded


@pytest.mark.parametrize("merge", [0, 1])
def test_ctc_greedy_decoder(merge: int) -> None:
    inputs = RNG.random((6, 3, 4)).astype(np.float32)
    inputs[1:3, 0, 2] = 5.0  # a repeat to merge
    lens = [6, 2, 0]
    op = make_op("CTCGreedyDecoder", ["X", "L"], ["OL", "V"], merge_repeated=merge)
    out_len, values = run_op(op, [inputs, np.array(lens, np.int32)])
    expected = greedy_reference(inputs, lens, bool(merge))
    assert out_len.tolist() == [len(e) for e in expected]
    assert values.tolist() == sum(expected, [])


def labelling_probabilities(probs: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact CTC labelling probabilities by enumerating every path."""
    totals: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(probs.shape[1]), repeat=probs.shape[0]):
        collapsed = tuple(c for i, c in enumerate(path) if c != 0 and (i == 0 or path[i - 1] != c))
        p = float(np.prod([probs[t, c] for t, c in enumerate(path)]))
        totals[collapsed] = totals.get(collapsed, 0.0) + p
    return totals


def test_ctc_beam_search_is_exact_with_a_wide_beam() -> None:
    probs = RNG.dirichlet(np.ones(3), size=(3, 2)).astype(np.float32)  # T × N × C
    op = make_op("CTCBeamSearchDecoder", ["X"], ["OL", "V", "P"], beam_width=100,
                 num_candidates=2, prune_threshold=0.0)
    out_len, values, out_prob = run_op(op, [probs])
    assert out_len.shape == (4,) and out_prob.shape == (4,)
    offset = 0
    for n in range(2):
        exact = sorted(labelling_probabilities(probs[:, n].astype(np.float64)).items(),
                       key=lambda kv: -kv[1])
        for j in range(2):
            length = int(out_len[2 * n + j])
            assert tuple(values[offset:offset + length].tolist()) == exact[j][0]
            assert out_prob[2 * n + j] == pytest.approx(exact[j][1], rel=1e-5)
            offset += length


# --- PiecewiseLinearTransform ----------------------------------------------------------------
def test_piecewise_linear_transform_args_inputs_and_binary() -> None:
    bounds = np.array([0.0, 0.5, 1.0, 0.0, 1.0, 2.0], np.float32)
    slopes = np.array([1.0, 2.0, -1.0, 0.5], np.float32)
    intercepts = np.array([0.0, -0.5, 1.0, 0.0], np.float32)
    x = np.array([[-1.0, 0.5], [0.25, 1.5], [0.75, 3.0]], np.float32)
    op = make_op("PiecewiseLinearTransform", ["X"], ["Y"], bounds=bounds.tolist(),
                 slopes=slopes.tolist(), intercepts=intercepts.tolist())
    (y,) = run_op(op, [x])
    expected = [[0.0, 0.5], [0.25, 0.75], [1.0, 1.0]]
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    (y2,) = run_op(make_op("PiecewiseLinearTransform", ["X", "B", "S", "I"], ["Y"]),
                   [x, bounds, slopes, intercepts])
    np.testing.assert_array_equal(y2, y)
    binary = make_op("PiecewiseLinearTransform", ["X"], ["Y"], binary=1,
                     bounds=[0.0, 0.5, 1.0], slopes=[1.0, 2.0], intercepts=[0.0, -0.5])
    (yb,) = run_op(binary, [np.array([[0.8, 0.2], [0.1, 0.9]], np.float32)])
    np.testing.assert_allclose(yb, [[0.8, 0.2], [-0.3, 1.3]], rtol=1e-6)
    with pytest.raises(ShapeError, match="group"):
        run_op(make_op("PiecewiseLinearTransform", ["X"], ["Y"], bounds=[0.0, 1.0],
                       slopes=[1.0], intercepts=[0.0]), [x])


# --- LearningRateAdaption --------------------------------------------------------------------
def test_learning_rate_adaption() -> None:
    lr = np.array([0.1], np.float32)
    grad = np.array([1.0, 2.0, 2.0], np.float32)
    effgrad = np.array([2.0, 0.0, 0.0], np.float32)
    op = make_op("LearningRateAdaption", ["lr", "g", "e"], ["out"], lr_alpha=0.5)
    (out,) = run_op(op, [lr, grad, effgrad])
    np.testing.assert_allclose(out, [0.1 * (1 - 0.5 * 2.0 / (3.0 * 2.0))], rtol=1e-6)
    plain = make_op("LearningRateAdaption", ["lr", "g", "e"], ["out"], lr_alpha=0.5,
                    normalized_lr_adaption=0)
    (out,) = run_op(plain, [lr, grad, effgrad])
    np.testing.assert_allclose(out, [0.1 - 0.5 * 2.0], rtol=1e-6)
    assert out.dtype == np.float32 and out.shape == (1,)


# --- GRUUnit ---------------------------------------------------------------------------------
def gru_reference(h_prev: np.ndarray, gates: np.ndarray, valid: np.ndarray,
                  drop: bool) -> np.ndarray:
    d = h_prev.shape[-1]
    u = 1 / (1 + np.exp(-gates[..., d:2 * d]))
    h = u * h_prev + (1 - u) * np.tanh(gates[..., 2 * d:])
    return np.where(valid[None, :, None], h, 0 if drop else h_prev)


@pytest.mark.parametrize("drop", [0, 1])
def test_gru_unit_with_sequence_lengths(drop: int) -> None:
    h_prev = RNG.standard_normal((1, 3, 2)).astype(np.float32)
    gates = RNG.standard_normal((1, 3, 6)).astype(np.float32)
    lens = np.array([5, 2, 3], np.int32)
    t = np.array([2], np.int32)
    op = make_op("GRUUnit", ["h", "g", "L", "t"], ["H"], drop_states=drop)
    (h,) = run_op(op, [h_prev, gates, lens, t])
    np.testing.assert_allclose(h, gru_reference(h_prev, gates, np.array([1, 0, 1], bool),
                                                bool(drop)), rtol=1e-5)
    ops, _ = build_gradient(op, ["H_grad"])
    assert summary(ops) == [("GRUUnitGradient", ["h", "g", "L", "t", "H", "H_grad"],
                             ["h_grad", "g_grad"])]
    check_gradient(op, [h_prev, gates, lens, t])


def test_gru_unit_without_sequence_lengths() -> None:
    h_prev = RNG.standard_normal((1, 2, 3)).astype(np.float32)
    gates = RNG.standard_normal((1, 2, 9)).astype(np.float32)
    op = make_op("GRUUnit", ["h", "g", "t"], ["H"], sequence_lengths=0)
    (h,) = run_op(op, [h_prev, gates, np.array([7], np.int32)])
    assert h.dtype == np.float32
    np.testing.assert_allclose(h, gru_reference(h_prev, gates, np.ones(2, bool), False),
                               rtol=1e-5)
    check_gradient(op, [h_prev.astype(np.float64), gates.astype(np.float64),
                        np.array([7], np.int32)])
    with pytest.raises(ShapeError, match="gates"):
        run_op(op, [h_prev, gates[..., :6], np.array([0], np.int32)])


def test_shape_functions() -> None:
    from dpgraph.ir.registry import OPERATORS

    top_k = make_op("TopK", ["X"], ["V", "I", "F"], k=2, axis=0)
    assert OPERATORS.lookup("TopK").shape_fn(top_k, [(5, 3)], [1]) == [
        ((2, 3), 1), ((2, 3), 10), ((6,), 10)]
    gru = make_op("GRUUnit", ["h", "g", "t"], ["H"])
    assert OPERATORS.lookup("GRUUnit").shape_fn(gru, [(1, 2, 3), (1, 2, 9), (1,)],
                                                [1, 1, 2]) == [((1, 2, 3), 1)]


def test_top_k_larger_than_the_axis_pads_with_zero_and_minus_one() -> None:
    x = np.array([[3.0, 1.0], [0.5, 2.0]], dtype=np.float32)
    op = make_op("TopK", ["X"], ["V", "I", "F"], k=3)
    values, indices, flat = run_op(op, [x])
    assert values.tolist() == [[3.0, 1.0, 0.0], [2.0, 0.5, 0.0]]
    assert indices.tolist() == [[0, 1, -1], [1, 0, -1]]
    assert flat.tolist() == [0, 1, -1, 3, 2, -1]
    (dx,) = run_op(make_op("TopKGradient", ["dV", "I", "X"], ["dX"]),
                   [np.ones((2, 3), np.float32), indices, x])
    assert dx.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_string_prefix_suffix_and_equals() -> None:
    strings = np.array([b"abcdef", b"xy", b""], dtype=object)
    (prefix,) = run_op(make_op("StringPrefix", ["s"], ["p"], length=3), [strings])
    (suffix,) = run_op(make_op("StringSuffix", ["s"], ["p"], length=3), [strings])
    assert prefix.tolist() == [b"abc", b"xy", b""] and suffix.tolist() == [b"def", b"xy", b""]
    (equal,) = run_op(make_op("StringEquals", ["s"], ["b"], text="xy"), [strings])
    assert equal.tolist() == [False, True, False]


def test_mod_follows_the_dividend_or_the_divisor() -> None:
    x = np.array([7, -7, 3], dtype=np.int64)
    (c_style,) = run_op(make_op("Mod", ["x"], ["y"], divisor=3), [x])
    (py_style,) = run_op(make_op("Mod", ["x"], ["y"], divisor=3, sign_follow_divisor=1), [x])
    assert c_style.tolist() == [1, -1, 0] and py_style.tolist() == [1, 2, 0]
    with pytest.raises(ShapeError, match="divisor"):
        run_op(make_op("Mod", ["x"], ["y"], divisor=0), [x])


@pytest.mark.parametrize("axis", [0, -1])
def test_normalize_and_its_gradient(axis: int) -> None:
    x = np.random.default_rng(2).uniform(0.5, 1.0, size=(3, 4))
    op = make_op("Normalize", ["X"], ["Y"], axis=axis)
    (y,) = run_op(op, [x])
    np.testing.assert_allclose(y, x / np.linalg.norm(x, axis=axis, keepdims=True))
    check_gradient(op, [x])
