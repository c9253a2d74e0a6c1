"""Tensor-Train layers: ``TT`` (an FC layer whose weight is a chain of TT cores) and the TT
embedding ``TTSparseLengthsSum`` (+ ``TTSparseLengthsSumGradient``).

* ``TT``: ``[X (M x K), b (N), cores (1-D)] -> Y (M x N)`` with ``K = prod(inp_sizes)`` and
  ``N = prod(out_sizes)``; the core layout is described in :mod:`dpgraph.ops.tt_format`.
  Caffe2 has no gradient for it (``GRADIENT_NOT_IMPLEMENTED_YET``).
* ``TTSparseLengthsSum``: ``[core0, core1, core2, INDICES (int64), LENGTHS (int32)] ->
  [OUTPUT (segments x emb_size), core0_output, core1_output, indices (n x 3)]``.  Core ``k``
  is ``[factor_i[k], ranks[k], factor_j[k], ranks[k + 1]]``; index ``v`` is split into the
  mixed-radix digits ``(v mod f0, (v div f0) mod f1, v div (f0 f1))`` that pick one slice of
  each core, and the embedding row is the chained product of the three slices.  Rows are
  summed per segment of LENGTHS.  The partial products of the first two cores are outputs
  for the gradient.
"""

from __future__ import annotations

import numpy as np

from dpgraph.ir.registry import register_gradient, register_op
from dpgraph.ops._common import host
from dpgraph.ops.context import OpContext, Outputs
from dpgraph.ops.fill import no_gradient
from dpgraph.ops.gradient_builder import GradientBuilder


# --- TT -----------------------------------------------------------------------------------
def _tt_sizes(ctx: OpContext) -> tuple[list[int], list[int], list[int]]:
    inp = ctx.ints_arg("inp_sizes")
    out = ctx.ints_arg("out_sizes")
    ranks = ctx.ints_arg("tt_ranks")
    if len(inp) != len(out):
        raise ctx.fail(f"inp_sizes has size: {len(inp)}, out_sizes has size: {len(out)}")
    if len(ranks) != len(inp) + 1:
        raise ctx.fail(f"tt_ranks needs len(inp_sizes) + 1 = {len(inp) + 1} entries, "
                       f"got {len(ranks)}")
    return inp, out, ranks


def _tt_check_inputs(ctx: OpContext, x: np.ndarray, b: np.ndarray,
                     cores: np.ndarray) -> None:
    if x.ndim <= 1:
        raise ctx.fail(f"Number of dimensions in X: {x.ndim} (X must be a batch of rows)")
    if b.ndim != 1:
        raise ctx.fail(f"Number of dimensions in b: {b.ndim}")
    if cores.ndim != 1:
        raise ctx.fail(f"Number of dimensions in cores: {cores.ndim}")


@register_op("TT", inputs=3, outputs=1)
def tt(ctx: OpContext) -> Outputs:
    """[X, b, cores] -> Y = X W + b, W the TT matrix of the cores (inp_sizes, out_sizes,
    tt_ranks)."""
    x, b, cores = (np.asarray(host(v)) for v in ctx.inputs)
    _tt_check_inputs(ctx, x, b, cores)
    inp, out, ranks = _tt_sizes(ctx)
    batch = x.shape[0]
    current = x.astype(np.float32).reshape(-1)
    offset = 0
    for i in reversed(range(len(inp))):
        rows, cols = inp[i] * ranks[i + 1], ranks[i] * out[i]
        if current.size % rows:
            raise ctx.fail(f"core {i}: {current.size} intermediate values do not split into "
                           f"rows of inp_sizes[{i}] * tt_ranks[{i + 1}] = {rows}")
        if offset + rows * cols > cores.size:
            raise ctx.fail(f"cores holds {cores.size} values; core {i} needs values up to "
                           f"{offset + rows * cols} (check inp_sizes, out_sizes, tt_ranks)")
        core = cores[offset:offset + rows * cols].reshape(rows, cols).astype(np.float32)
        product = current.reshape(-1, rows) @ core
        # Caffe2 then lays the product out column-major over out_sizes[i].
        current = product.reshape(-1, out[i]).T.reshape(-1)
        offset += rows * cols
    y = current.reshape(-1, batch).T
    if y.shape[1] != int(np.prod(out)):
        raise ctx.fail(f"Output dimension of Y: {y.shape[1]}, product of out_sizes: "
                       f"{int(np.prod(out))}")
    if b.size != y.shape[1]:
        raise ctx.fail(f"b has {b.size} values, Y has {y.shape[1]} columns")
    return (np.ascontiguousarray(y + b.astype(np.float32)),)


register_gradient("TT")(no_gradient)


# --- TTSparseLengthsSum ---------------------------------------------------------------------
def _sls_args(ctx: OpContext) -> tuple[list[int], list[int], list[int], int]:
    factor_i = ctx.ints_arg("factor_i", (1, 1, 1))
    factor_j = ctx.ints_arg("factor_j", (1, 1, 1))
    ranks = ctx.ints_arg("ranks", (1, 1, 1, 1))
    if len(factor_i) != 3 or len(factor_j) != 3 or len(ranks) != 4:
        raise ctx.fail(f"TT embeddings have 3 cores: factor_i and factor_j need 3 entries and "
                       f"ranks 4, got {factor_i}, {factor_j}, {ranks}")
    return factor_i, factor_j, ranks, ctx.int_arg("emb_size", 64)


def _digits(indices: np.ndarray, factor_i: list[int]) -> np.ndarray:
    """Each index as its mixed-radix digits over ``factor_i`` (least significant first)."""
    place = np.cumprod([1] + factor_i[:-1])
    digits = np.empty((indices.size, len(factor_i)), np.int64)
    rest = indices.copy()
    for k in reversed(range(len(factor_i))):
        digits[:, k] = rest // place[k]
        rest = rest % place[k]
    return digits


def _core_slices(ctx: OpContext, k: int, digits: np.ndarray, ranks: list[int],
                 factor_j: list[int]) -> np.ndarray:
    core = np.asarray(host(ctx.inputs[k]))
    per_row = ranks[k] * factor_j[k] * ranks[k + 1]
    if core.size % per_row:
        raise ctx.fail(f"core{k} ({ctx.input_name(k)!r}, shape {list(core.shape)}) is not made "
                       f"of ranks[{k}] * factor_j[{k}] * ranks[{k + 1}] = {per_row}-value rows")
    flat = core.reshape(-1, per_row)
    picked = digits[:, k]
    if picked.size and int(picked.max()) >= flat.shape[0]:
        raise ctx.fail(f"index digit {int(picked.max())} is out of range for core{k} "
                       f"({ctx.input_name(k)!r}) with {flat.shape[0]} rows")
    return flat[picked].reshape(-1, ranks[k], factor_j[k] * ranks[k + 1])


def _segment_ids(ctx: OpContext, lengths: np.ndarray, count: int) -> np.ndarray:
    if lengths.size and int(lengths.min()) < 0:
        raise ctx.fail(f"LENGTHS must be non-negative, got {lengths.tolist()[:10]}")
    if int(lengths.sum()) != count:
        raise ctx.fail(f"LENGTHS ({ctx.input_name(4) if ctx.num_inputs == 5 else 'lengths'}) "
                       f"sum to {int(lengths.sum())}, but there are {count} indices")
    return np.repeat(np.arange(lengths.size), lengths)


@register_op("TTSparseLengthsSum", inputs=5, outputs=4)
def tt_sparse_lengths_sum(ctx: OpContext) -> Outputs:
    """[core0, core1, core2, INDICES, LENGTHS] -> [OUTPUT, core0_output, core1_output,
    indices]: per-segment sums of TT embedding rows."""
    factor_i, factor_j, ranks, emb_size = _sls_args(ctx)
    indices = np.asarray(host(ctx.inputs[3]))
    lengths = np.asarray(host(ctx.inputs[4]))
    if indices.ndim != 1:
        raise ctx.fail("INDICES must be a vector")
    if lengths.ndim != 1:
        raise ctx.fail("LENGTHS must be a vector")
    digits = _digits(indices.astype(np.int64), factor_i)
    segments = _segment_ids(ctx, lengths.astype(np.int64), indices.size)
    chain = _core_slices(ctx, 0, digits, ranks, factor_j).reshape(
        indices.size, factor_j[0], ranks[1])
    partial = [chain]
    for k in (1, 2):
        chain = np.matmul(chain, _core_slices(ctx, k, digits, ranks, factor_j))
        chain = chain.reshape(indices.size, -1, ranks[k + 1])
        partial.append(chain)
    rows = chain.reshape(indices.size, -1)
    if rows.shape[1] != emb_size:
        raise ctx.fail(f"emb_size is {emb_size}, but the cores make rows of prod(factor_j) * "
                       f"ranks[3] = {rows.shape[1]} values")
    out = np.zeros((lengths.size, emb_size), np.float32)
    np.add.at(out, segments, rows.astype(np.float32))
    return out, partial[0].astype(np.float32), partial[1].astype(np.float32), digits


@register_gradient("TTSparseLengthsSum")
def _tt_sls_gradient(g: GradientBuilder) -> None:
    g.add("TTSparseLengthsSumGradient",
          [g.I(0), g.I(1), g.I(2), g.I(4), g.O(1), g.O(2), g.O(3), g.GO(0)],
          [g.GI(0), g.GI(1), g.GI(2)])


def _scatter_rows(core: np.ndarray, picked: np.ndarray,
                  grads: np.ndarray) -> np.ndarray:
    """Per-index core-slice gradients summed into a zero tensor shaped like ``core``."""
    total = np.zeros(core.shape, np.float32)
    flat = total.reshape(core.shape[0], -1)
    np.add.at(flat, picked, grads.reshape(picked.size, -1))
    return total


@register_op("TTSparseLengthsSumGradient", inputs=8, outputs=3)
def tt_sparse_lengths_sum_gradient(ctx: OpContext) -> Outputs:
    """[core0, core1, core2, LENGTHS, core0_output, core1_output, indices, dY] ->
    [dCore0, dCore1, dCore2]."""
    core0, core1, core2, lengths, out0, out1, digits, dy = (
        np.asarray(host(v)) for v in ctx.inputs)
    count = digits.shape[0]
    if digits.ndim != 2 or digits.shape[1] != 3:
        raise ctx.fail(f"indices ({ctx.input_name(6)!r}) must be [n, 3], got "
                       f"{list(digits.shape)}")
    if core0.ndim != 4 or core1.ndim != 4 or core2.ndim != 4:
        raise ctx.fail("core0, core1 and core2 must be 4-D [factor_i, rank, factor_j, rank]")
    seg = _segment_ids(ctx, lengths.reshape(-1).astype(np.int64), count)
    if dy.ndim != 2 or (seg.size and int(seg.max()) >= dy.shape[0]):
        raise ctx.fail(f"dY ({ctx.input_name(7)!r}) must have one row per segment, got "
                       f"{list(dy.shape)}")
    d2_out = dy[seg].astype(np.float32)                         # [n, emb]
    r1 = out1.shape[1]
    a1 = out1.reshape(count, r1, -1)                            # [n, K1, r2]
    g2 = d2_out.reshape(count, r1, -1)                          # [n, K1, j2 r3]
    d_core2 = np.matmul(a1.transpose(0, 2, 1), g2)              # [n, r2, j2 r3]
    slices2 = core2.reshape(core2.shape[0], -1)[digits[:, 2]].reshape(
        count, core2.shape[1], -1)
    g1 = np.matmul(g2, slices2.transpose(0, 2, 1))              # [n, K1, r2]
    k0 = out0.shape[1]
    a0 = out0.reshape(count, k0, -1)                            # [n, K0, r1]
    g1 = g1.reshape(count, k0, -1)                              # [n, K0, j1 r2]
    d_core1 = np.matmul(a0.transpose(0, 2, 1), g1)              # [n, r1, j1 r2]
    slices1 = core1.reshape(core1.shape[0], -1)[digits[:, 1]].reshape(
        count, core1.shape[1], -1)
    g0 = np.matmul(g1, slices1.transpose(0, 2, 1))              # [n, K0, r1]
    return (_scatter_rows(core0, digits[:, 0], g0),
            _scatter_rows(core1, digits[:, 1], d_core1),
            _scatter_rows(core2, digits[:, 2], d_core2))
