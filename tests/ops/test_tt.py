"""TT layers (ops/tt.py) and the TT-format helpers (ops/tt_format.py, facade tt_core)."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every op family)
from dpgraph import tt_core
from dpgraph.errors import ArgumentError, OperatorError, ShapeError
from dpgraph.ops.gradient_builder import build_gradient, make_op
from dpgraph.ops.testing import check_gradient, run_op

RNG = np.random.default_rng(11)


def tt_op(inp: list[int], out: list[int], ranks: list[int]):
    return make_op("TT", ["X", "b", "cores"], ["Y"], inp_sizes=inp, out_sizes=out,
                   tt_ranks=ranks)


def tt_to_matrix(cores: np.ndarray, inp: list[int], out: list[int],
                 ranks: list[int]) -> np.ndarray:
    """Reference: W[(i_1..i_d), (j_1..j_d)] = G_1[i_1, j_1] ... G_d[i_d, j_d], reading the
    op's layout (cores stored last factor first, each [n, r_next, r, m])."""
    d = len(inp)
    blocks, pos = [None] * d, 0
    for k in reversed(range(d)):
        size = inp[k] * ranks[k + 1] * ranks[k] * out[k]
        g = cores[pos:pos + size].reshape(inp[k], ranks[k + 1], ranks[k], out[k])
        blocks[k] = g.transpose(2, 0, 3, 1)  # [r, n, m, r_next]
        pos += size
    w = np.ones((1, 1, 1))
    for g in blocks:  # w: [N, M, r]
        w = np.einsum("abr,rnms->anbms", w, g).reshape(w.shape[0] * g.shape[1],
                                                         w.shape[1] * g.shape[2], -1)
    return w[:, :, 0]


@pytest.mark.parametrize("inp,out,ranks", [([2, 3], [3, 2], [1, 2, 1]),
                                           ([2, 2, 2], [3, 1, 2], [1, 3, 2, 1])])
def test_tt_op_is_fc_with_the_tt_matrix(inp, out, ranks) -> None:
    cores = tt_core.init_tt_cores(inp, out, ranks, seed=3)
    x = RNG.standard_normal((4, int(np.prod(inp)))).astype(np.float32)
    b = RNG.standard_normal(int(np.prod(out))).astype(np.float32)
    (y,) = run_op(tt_op(inp, out, ranks), [x, b, cores])
    w = tt_to_matrix(cores.astype(np.float64), inp, out, ranks)
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-4, atol=1e-6)


def test_matrix_to_tt_full_rank_reconstructs_fc() -> None:
    inp = out = [2, 3, 2]
    w = RNG.standard_normal((12, 12)).astype(np.float32)
    ranks = [1, 4, 4, 1]  # full ranks for modes of 4, 9 and 4 values
    cores = tt_core.matrix_to_tt(w, inp, out, ranks)
    assert cores.dtype == np.float32 and cores.size == sum(
        ranks[k] * inp[k] * out[k] * ranks[k + 1] for k in range(3))
    x = RNG.standard_normal((3, 12)).astype(np.float32)
    (y,) = run_op(tt_op(inp, out, ranks), [x, np.zeros(12, np.float32), cores])
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-3, atol=1e-3)  # as FC with weight W


def test_matrix_to_tt_low_rank_is_worse_than_full_rank() -> None:
    inp = out = [2, 2, 2]
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    x = np.eye(8, dtype=np.float32)
    errors = []
    for ranks in ([1, 1, 1, 1], [1, 4, 4, 1]):
        (y,) = run_op(tt_op(inp, out, ranks),
                      [x, np.zeros(8, np.float32), tt_core.matrix_to_tt(w, inp, out, ranks)])
        errors.append(np.linalg.norm(y - w.T))
    assert errors[1] < 1e-4 < errors[0]


def test_tt_svd_cores_multiply_back() -> None:
    t = RNG.standard_normal((3, 4, 2))
    cores = tt_core.tt_svd(t, np.array([3, 4, 2]), np.array([1, 3, 2, 1]))
    g1, g2, g3 = cores[:9].reshape(1, 3, 3), cores[9:33].reshape(3, 4, 2), \
        cores[33:].reshape(2, 2, 1)
    np.testing.assert_allclose(np.einsum("ais,sjt,tkb->ijk", g1, g2, g3), t, atol=1e-5)


def test_init_tt_cores_is_seeded_orthogonal_and_scaled() -> None:
    a = tt_core.init_tt_cores([2, 2], [3, 3], [1, 2, 1], seed=7)
    b = tt_core.init_tt_cores([2, 2], [3, 3], [1, 2, 1], seed=7)
    assert a.dtype == np.float32 and a.shape == (2 * 3 * 2 + 2 * 3 * 2,)
    np.testing.assert_array_equal(a, b)
    scale = 0.1 / (4 * 2) ** 0.5
    first = a[:12].reshape(6, 2) / scale  # Q factor of the first core: orthonormal columns
    np.testing.assert_allclose(first.T @ first, np.eye(2), atol=1e-5)


def test_tt_helpers_reject_bad_sizes() -> None:
    with pytest.raises(ArgumentError, match="number of tt-ranks"):
        tt_core.init_tt_cores([2, 2], [2, 2], [1, 1])
    with pytest.raises(ArgumentError, match="output dimensions"):
        tt_core.matrix_to_tt(np.zeros((4, 4)), [2, 2], [4], [1, 1, 1])
    with pytest.raises(ArgumentError, match="prod"):
        tt_core.matrix_to_tt(np.zeros((5, 4)), [2, 2], [2, 2], [1, 1, 1])


def test_tt_op_rejects_short_cores() -> None:
    with pytest.raises((ShapeError, OperatorError), match="cores holds"):
        run_op(tt_op([2, 2], [2, 2], [1, 2, 1]),
               [np.ones((1, 4), np.float32), np.zeros(4, np.float32), np.ones(5, np.float32)])


def test_tt_has_no_gradient() -> None:
    ops, g_in = build_gradient(tt_op([2], [2], [1, 1]), ["Y_grad"])
    assert ops == [] and all(g is None for g in g_in)


# --- TTSparseLengthsSum ---------------------------------------------------------------------
def sls_op():
    return make_op("TTSparseLengthsSum", ["c0", "c1", "c2", "idx", "len"],
                   ["Y", "c0_out", "c1_out", "indices"], factor_i=[3, 2, 4],
                   factor_j=[2, 1, 3], ranks=[1, 2, 3, 1], emb_size=6)


def sls_inputs():
    c0 = RNG.standard_normal((3, 1, 2, 2)).astype(np.float32)
    c1 = RNG.standard_normal((2, 2, 1, 3)).astype(np.float32)
    c2 = RNG.standard_normal((4, 3, 3, 1)).astype(np.float32)
    idx = np.array([0, 5, 23, 7, 7], np.int64)
    lengths = np.array([2, 0, 3], np.int32)
    return [c0, c1, c2, idx, lengths]


def test_tt_sparse_lengths_sum_matches_dense_embedding() -> None:
    c0, c1, c2, idx, lengths = sls_inputs()
    y, out0, out1, digits = run_op(sls_op(), [c0, c1, c2, idx, lengths])
    # Row v: digits (v mod 3, v div 3 mod 2, v div 6); columns (j0, j1, j2), j0 slowest.
    rows = np.array([np.einsum("apr,rjs,skt->pjk", c0[v % 3], c1[(v // 3) % 2],
                               c2[v // 6]).reshape(-1) for v in idx])
    expected = np.stack([rows[:2].sum(0), np.zeros(6), rows[2:].sum(0)])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert digits.tolist() == [[0, 0, 0], [2, 1, 0], [2, 1, 3], [1, 0, 1], [1, 0, 1]]
    assert out0.shape == (5, 2, 2) and out1.shape == (5, 2, 3)


def test_tt_sparse_lengths_sum_gradient_matches_finite_differences() -> None:
    check_gradient(sls_op(), sls_inputs(), inputs_to_check=[0, 1, 2])


def test_tt_sparse_lengths_sum_gradient_op_wiring() -> None:
    ops, g_in = build_gradient(sls_op(), ["Y_grad", None, None, None])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("TTSparseLengthsSumGradient",
         ["c0", "c1", "c2", "len", "c0_out", "c1_out", "indices", "Y_grad"],
         ["c0_grad", "c1_grad", "c2_grad"])]


def test_tt_sparse_lengths_sum_rejects_bad_lengths_and_emb_size() -> None:
    c0, c1, c2, idx, _ = sls_inputs()
    with pytest.raises((ShapeError, OperatorError), match="sum to 4"):
        run_op(sls_op(), [c0, c1, c2, idx, np.array([4], np.int32)])
    bad = make_op("TTSparseLengthsSum", ["c0", "c1", "c2", "idx", "len"],
                  ["Y", "a", "b", "c"], factor_i=[3, 2, 4], factor_j=[2, 1, 3],
                  ranks=[1, 2, 3, 1], emb_size=8)
    with pytest.raises((ShapeError, OperatorError), match="emb_size is 8"):
        run_op(bad, [c0, c1, c2, idx, np.array([5], np.int32)])
