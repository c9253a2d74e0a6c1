"""The flat Tensor-Train (TT) core layout the ``TT`` op reads, and the numpy helpers
Caffe2's ``tt_core`` module offers to build it.

A TT layer stands for a ``[prod(inp_sizes), prod(out_sizes)]`` matrix ``M`` (``Y = X M +
b``). Core ``i`` has ``tt_ranks[i] * inp_sizes[i] * out_sizes[i] * tt_ranks[i + 1]`` values;
all cores are concatenated into one 1-D float32 array. The ``TT`` op multiplies by the core
of the LAST factor first, so the array stores the cores from the last factor to the first,
each laid out ``[inp_sizes[i], tt_ranks[i + 1], tt_ranks[i], out_sizes[i]]``.

* :func:`init_tt_cores`: random cores (orthogonalised left to right, Glorot-style scaled) for
  training a TT layer from scratch, drawn from numpy's global generator seeded with ``seed``.
* :func:`matrix_to_tt`: the TT decomposition (TT-SVD, truncated to ``tt_ranks``) of a trained
  FC weight ``W``, so that the ``TT`` op computes what ``FC`` does (``M = W^T``).  As in
  Caffe2, ``W^T``'s values are read with the input sizes as the leading modes, which is
  exact when ``inp_sizes == out_sizes`` (the case Caffe2 uses).
* :func:`tt_svd`: the TT-SVD itself: cores laid out ``[r_i, n_i, r_{i+1}]``, first to last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.errors import ArgumentError


def _check_sizes(inp_sizes: Sequence[int], out_sizes: Sequence[int],
                 tt_ranks: Sequence[int]) -> None:
    if len(inp_sizes) != len(out_sizes):
        raise ArgumentError(
            f"The number of input dimensions ({len(inp_sizes)}) must be equal to the number "
            f"of output dimensions ({len(out_sizes)}).")
    if len(tt_ranks) != len(inp_sizes) + 1:
        raise ArgumentError(
            f"The number of tt-ranks ({len(tt_ranks)}) must be one more than the number of "
            f"input and output dims ({len(out_sizes)}).")


def init_tt_cores(inp_sizes: Sequence[int], out_sizes: Sequence[int],
                  tt_ranks: Sequence[int], seed: int = 1234) -> np.ndarray:
    """Random TT cores (float32, 1-D) for a layer trained from scratch.

    Core ``i`` is a standard-normal ``[r_i, n_i * m_i * r_{i+1}]`` draw multiplied from the
    left by the triangular factor of the previous core's QR decomposition; every core but
    the last is replaced by its orthonormal Q factor.  The concatenation is scaled by
    ``0.1 / (prod(inp_sizes) * prod(tt_ranks)) ** (1 / d)``.  Seeds numpy's global generator.
    """
    _check_sizes(inp_sizes, out_sizes, tt_ranks)
    np.random.seed(seed)
    inp = np.asarray(inp_sizes)
    out = np.asarray(out_sizes)
    ranks = np.asarray(tt_ranks)
    count = len(inp)
    pieces: list[np.ndarray] = []
    carry: Any = 1
    for i in range(count):
        width = int(inp[i] * out[i] * ranks[i + 1])
        draw = np.dot(carry, np.random.normal(0, 1, size=(int(ranks[i]), width)))
        tall = draw.reshape(int(ranks[i] * inp[i] * out[i]), int(ranks[i + 1]))
        if i < count - 1:
            tall, carry = np.linalg.qr(tall)
        pieces.append(tall.reshape(-1))
    cores = np.concatenate(pieces) if pieces else np.zeros(0)
    scale = (np.prod(inp) * np.prod(ranks)) ** (1.0 / count)
    return ((0.1 / scale) * cores).astype(np.float32)


def tt_svd(W: np.ndarray, sizes: Any, tt_ranks: Any) -> np.ndarray:
    """TT-SVD of a tensor ``W`` with mode sizes ``sizes``: successive reduced SVDs truncated
    to ``tt_ranks``; returns the cores ``[r_i, n_i, r_{i+1}]`` concatenated (float32)."""
    sizes = np.asarray(sizes)
    ranks = np.asarray(tt_ranks)
    if len(ranks) != len(sizes) + 1:
        raise ArgumentError(f"tt_svd needs len(tt_ranks) == len(sizes) + 1, got "
                            f"{len(ranks)} ranks for {len(sizes)} sizes")
    core_sizes = ranks[:-1] * sizes * ranks[1:]
    cores = np.zeros(int(np.sum(core_sizes)), dtype=np.float32)
    rest = np.array(W, copy=True)
    pos = 0
    for i in range(len(sizes) - 1):
        rest = rest.reshape(int(ranks[i] * sizes[i]), -1)
        u, s, vt = np.linalg.svd(rest, full_matrices=False)
        keep = int(ranks[i + 1])
        u, s, vt = u[:, :keep], s[:keep], vt[:keep, :]
        cores[pos:pos + int(core_sizes[i])] = u.ravel()
        pos += int(core_sizes[i])
        rest = s[:, None] * vt
    cores[pos:pos + int(core_sizes[-1])] = rest.ravel()
    return cores


def matrix_to_tt(W: np.ndarray, inp_sizes: Sequence[int], out_sizes: Sequence[int],
                 tt_ranks: Sequence[int]) -> np.ndarray:
    """The TT cores (float32, 1-D, in the ``TT`` op's layout) of the FC weight ``W``
    (Caffe2 requires shape ``[prod(inp_sizes), prod(out_sizes)]``): the ``TT`` op with them
    computes ``X W^T`` as FC does, up to the truncation to ``tt_ranks``."""
    _check_sizes(inp_sizes, out_sizes, tt_ranks)
    W = np.asarray(W)
    if W.ndim != 2 or W.shape[0] != np.prod(inp_sizes) or W.shape[1] != np.prod(out_sizes):
        raise ArgumentError(
            f"W must be [prod(inp_sizes), prod(out_sizes)] = [{int(np.prod(inp_sizes))}, "
            f"{int(np.prod(out_sizes))}], got shape {list(W.shape)}")
    inp = np.asarray(inp_sizes)
    out = np.asarray(out_sizes)
    ranks = np.asarray(tt_ranks)
    count = len(inp)
    # W^T's values as a tensor of modes (n_1..n_d, m_1..m_d), interleaved to
    # (n_1 m_1, ..., n_d m_d) (Caffe2 reads W^T's values with the input sizes first).
    tensor = W.T.reshape(np.concatenate((inp, out)))
    interleave = [axis for k in range(count) for axis in (k, count + k)]
    merged = tensor.transpose(interleave).reshape(inp * out)
    raw = tt_svd(merged, inp * out, ranks)
    result = np.zeros(raw.shape, dtype=np.float32)
    pos = 0
    for i in range(count):
        shape = (int(ranks[i]), int(inp[i]), int(out[i]), int(ranks[i + 1]))
        size = int(np.prod(shape))
        core = raw[pos:pos + size].reshape(shape).transpose((1, 3, 0, 2))
        end = raw.size - pos
        result[end - size:end] = core.ravel()
        pos += size
    return result
