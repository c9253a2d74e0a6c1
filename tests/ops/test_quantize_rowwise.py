"""Row-wise quantization, quantized lookups, Percentile/BisectPercentile and the stochastic
quantizer: byte layouts and rounding against references written from Caffe2's formulas,
bitwise agreement between the N-bit and "fake" 8-bit paths, typed errors, shapes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph.errors import ShapeError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import run_op

RNG = np.random.default_rng(5)
F32 = np.float32


def _run(op_type: str, inputs: list, outputs: int = 1, **args):
    names = [f"i{k}" for k in range(len(inputs))]
    op = CreateOperator(op_type, names, [f"o{k}" for k in range(outputs)], **args)
    return run_op(op, inputs)


def _one(op_type: str, inputs: list, **args):
    return _run(op_type, inputs, **args)[0]


# --- references (per element, from the formulas) ---------------------------------------------
def _ref_fused_8bit(row: np.ndarray) -> bytes:
    lo, hi = F32(row.min()), F32(row.max())
    span = F32(hi - lo)
    scale, inverse = F32(span / F32(255)), F32(F32(255) / F32(span + F32(1e-8)))
    codes = bytes(int(np.rint(F32(F32(v - lo) * inverse))) for v in row)
    return codes + struct.pack("<ff", scale, lo)


def _ref_nbit(row: np.ndarray, bits: int) -> tuple[list[int], float, float]:
    bias = F32(np.float16(row.min()))
    span = F32(F32(row.max()) - bias)
    scale = F32(1) if span == 0 else F32(np.float16(span / F32((1 << bits) - 1)))
    codes = [min(max(int(np.rint(F32(F32(v - bias) * F32(F32(1) / scale)))), 0),
                 (1 << bits) - 1) for v in row]
    return codes, float(scale), float(bias)


def _ref_pack(codes: list[int], bits: int) -> bytes:
    per = 8 // bits
    return bytes(sum(c << (k * bits) for k, c in enumerate(codes[i:i + per]))
                 for i in range(0, len(codes), per))


# --- conversions -----------------------------------------------------------------------------
def test_fused_8bit_bytes_round_half_to_even_and_nd_shapes() -> None:
    x = np.array([[0.0, 2.5, 3.5, 255.0], [-1.0, 0.25, 7.0, 3.0]], dtype=F32)
    q = _one("FloatToFused8BitRowwiseQuantized", [x])
    assert q.dtype == np.uint8 and q.shape == (2, 12)
    assert q[0, :4].tolist() == [0, 2, 4, 255]  # lrintf: 2.5 -> 2, 3.5 -> 4
    for r in range(2):
        assert q[r].tobytes() == _ref_fused_8bit(x[r])
    cube = RNG.normal(size=(2, 3, 5)).astype(F32)
    q3 = _one("FloatToFused8BitRowwiseQuantized", [cube])
    assert q3.shape == (2, 3, 13)
    assert q3.reshape(6, 13)[4].tobytes() == _ref_fused_8bit(cube.reshape(6, 5)[4])
    back = _one("Fused8BitRowwiseQuantizedToFloat", [q3])
    scale = (cube.max(-1) - cube.min(-1)) / 255
    assert back.dtype == F32 and back.shape == cube.shape
    assert (np.abs(back - cube) <= scale[..., None] * 0.51 + 1e-6).all()


def test_half_inputs_and_half_scale_bias_variants() -> None:
    x = RNG.uniform(-3, 3, size=(4, 6)).astype(F32)
    q = _one("HalfFloatToFused8BitRowwiseQuantized", [x.astype(np.float16)])
    assert q.tobytes() == _one("FloatToFused8BitRowwiseQuantized",
                               [x.astype(np.float16).astype(F32)]).tobytes()
    half = _one("Fused8BitRowwiseQuantizedToHalfFloat", [q])
    assert half.dtype == np.float16 and half.shape == (4, 6)
    qh = _one("FloatToFused8BitRowwiseQuantizedHalfScaleBias", [x])
    assert qh.shape == (4, 10)
    for r in range(4):
        codes, scale, bias = _ref_nbit(x[r], 8)
        assert qh[r].tobytes() == bytes(codes) + struct.pack("<ee", scale, bias)
    out = _one("Fused8BitRowwiseQuantizedHalfScaleBiasToFloat", [qh])
    # Caffe2 declares ...HalfScaleBiasToHalfFloat's output float32 too
    out_h = _one("Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat", [qh])
    assert out.dtype == out_h.dtype == F32 and np.array_equal(out, out_h)
    assert np.abs(out - x).max() < 0.02
    qhh = _one("HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias", [x.astype(np.float16)])
    assert qhh.shape == (4, 10)


@pytest.mark.parametrize("bits", [4, 2])
def test_nbit_packing_scale_bias_and_round_trip(bits: int) -> None:
    x = RNG.uniform(-2, 5, size=(3, 8)).astype(F32)
    x[2] = 1.5  # constant row: scale 1, codes 0
    q = _one(f"FloatToFused{bits}BitRowwiseQuantized", [x])
    assert q.shape == (3, 8 * bits // 8 + 4)
    for r in range(3):
        codes, scale, bias = _ref_nbit(x[r], bits)
        assert q[r].tobytes() == _ref_pack(codes, bits) + struct.pack("<ee", scale, bias)
    assert struct.unpack("<e", q[2, -4:-2].tobytes())[0] == 1.0
    back = _one(f"Fused{bits}BitRowwiseQuantizedToFloat", [q])
    for r in range(3):
        codes, scale, bias = _ref_nbit(x[r], bits)
        np.testing.assert_allclose(back[r], np.array(codes) * scale + bias, rtol=1e-6)
    halves = _one(f"Fused{bits}BitRowwiseQuantizedToHalf", [q])
    assert halves.dtype == np.float16
    np.testing.assert_array_equal(halves, back.astype(np.float16))
    from_half = _one(f"HalfToFused{bits}BitRowwiseQuantized", [x.astype(np.float16)])
    assert from_half.shape == q.shape
    with pytest.raises(ShapeError, match="multiple of"):
        _one(f"FloatToFused{bits}BitRowwiseQuantized", [x[:, :7]])


def test_dtype_and_width_errors_name_the_op() -> None:
    with pytest.raises(ShapeError, match="FloatToFused8BitRowwiseQuantized.*float32"):
        _one("FloatToFused8BitRowwiseQuantized", [np.ones((2, 3))])
    with pytest.raises(ShapeError, match="at least 8"):
        _one("Fused8BitRowwiseQuantizedToFloat", [np.zeros((2, 5), np.uint8)])


def _greedy_ref(row: np.ndarray, bits: int) -> tuple[float, float]:
    """The greedy search, one row, scalar float32 steps."""
    def loss(lo, hi):
        codes, scale, bias = _ref_nbit_range(row, lo, hi, bits)
        return float(np.sqrt(np.sum((row - (np.array(codes, F32) * F32(scale)
                                            + F32(bias))) ** 2, dtype=F32)))
    xmin, xmax = F32(row.min()), F32(row.max())
    step = F32((xmax - xmin) / F32(200))
    thr = F32(F32(168) * step)
    cur_min, cur_max = xmin, xmax
    best = cur = loss(xmin, xmax)
    while cur_min + thr < cur_max:
        left, right = loss(F32(cur_min + step), cur_max), loss(cur_min, F32(cur_max - step))
        if cur < left and cur < right and cur < best:
            best, xmin, xmax = cur, cur_min, cur_max
        if left < right:
            cur_min, cur = F32(cur_min + step), left
        else:
            cur_max, cur = F32(cur_max - step), right
    return xmin, xmax


def _ref_nbit_range(row, lo, hi, bits):
    bias = F32(np.float16(lo))
    span = F32(F32(hi) - bias)
    scale = F32(1) if span == 0 else F32(np.float16(span / F32((1 << bits) - 1)))
    codes = np.clip(np.rint((row - bias) * (F32(1) / scale)), 0, (1 << bits) - 1)
    return codes, scale, bias


def test_greedy_engine_matches_the_search_and_lowers_the_error() -> None:
    from dpgraph.ops._rowwise_greedy import greedy_range
    x = RNG.normal(size=(5, 16)).astype(F32)
    x[:, 0] = 9.0  # an outlier the search trims
    lo, hi = greedy_range(x, 4)
    for r in range(5):
        ref_lo, ref_hi = _greedy_ref(x[r], 4)
        assert (lo[r], hi[r]) == (ref_lo, ref_hi)
    plain = _one("Fused4BitRowwiseQuantizedToFloat", [_one("FloatToFused4BitRowwiseQuantized",
                                                            [x])])
    greedy = _one("Fused4BitRowwiseQuantizedToFloat", [
        _one("FloatToFused4BitRowwiseQuantized", [x], engine="GREEDY")])
    err_plain = np.linalg.norm(x - plain, axis=1)
    err_greedy = np.linalg.norm(x - greedy, axis=1)
    assert (err_greedy <= err_plain * 1.0001).all() and (err_greedy < err_plain).any()


@pytest.mark.parametrize("engine", ["", "GREEDY"])
def test_fake_nbit_twin_sums_bitwise_like_the_packed_table(engine: str) -> None:
    x = RNG.uniform(size=(6, 8)).astype(F32)
    packed = _one("FloatToFused4BitRowwiseQuantized", [x], engine=engine)
    fake = _one("FloatToFused4BitFakeRowwiseQuantized", [x], engine=engine)
    assert fake.shape == (6, 16) and fake[:, :8].max() <= 15
    idx = np.array([1, 5, 5, 0, 3], np.int64)
    lens = np.array([2, 0, 3], np.int32)
    w = RNG.uniform(size=5).astype(F32)
    for kind, extra in (("Sum", []), ("WeightedSum", [w]), ("Mean", [])):
        a = _one(f"SparseLengths{kind}Fused4BitRowwise", [packed, *extra, idx, lens])
        b = _one(f"SparseLengths{kind}Fused8BitRowwise", [fake, *extra, idx, lens])
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ShapeError, match="matrix"):
        _one("FloatToFused4BitFakeRowwiseQuantized", [x.reshape(2, 3, 8)])


# --- lookups ---------------------------------------------------------------------------------
def _dequantized(table: np.ndarray) -> np.ndarray:
    return _one("Fused8BitRowwiseQuantizedToFloat", [table]).astype(np.float64)


def test_fused_8bit_lookups_against_a_float64_reference() -> None:
    x = RNG.normal(size=(7, 5)).astype(F32)
    table = _one("FloatToFused8BitRowwiseQuantized", [x])
    deq = _dequantized(table)
    idx = np.array([6, 0, 0, 2, 4, 1], np.int32)
    lens = np.array([3, 0, 2, 1], np.int32)
    w = RNG.uniform(size=6).astype(F32)
    seg = np.repeat(np.arange(4), lens)
    ref = np.zeros((4, 5))
    np.add.at(ref, seg, deq[idx] * w[:, None])
    out = _one("SparseLengthsWeightedSumFused8BitRowwise", [table, w, idx, lens])
    assert out.dtype == F32 and out.shape == (4, 5)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    ref_sum = np.zeros((4, 5))
    np.add.at(ref_sum, seg, deq[idx])
    mean = _one("SparseLengthsMeanFused8BitRowwise", [table, idx, lens])
    np.testing.assert_allclose(mean, ref_sum / np.maximum(lens, 1)[:, None], rtol=1e-5,
                               atol=1e-6)
    assert not mean[1].any()
    with pytest.raises(ShapeError, match="out of bounds: 7"):
        _one("SparseLengthsSumFused8BitRowwise", [table, np.array([7], np.int64),
                                                  np.array([1], np.int32)])
    with pytest.raises(ShapeError, match="sum of lengths"):
        _one("SparseLengthsSumFused8BitRowwise", [table, idx, lens + 1])
    gathered = _one("GatherFused8BitRowwise", [table, idx])
    np.testing.assert_array_equal(gathered, deq[idx].astype(F32))


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_rowwise_sparse_lookup_equals_the_full_table(bits: int) -> None:
    x = RNG.uniform(size=(6, 8)).astype(F32)
    full = _one(f"FloatToFused{bits}BitRowwiseQuantized", [x])
    mapping = np.array([0, -1, 1, -1, 2, 3], np.int32)
    full[mapping == -1] = 0  # pruned rows add nothing
    pruned = full[mapping != -1]
    idx = np.array([0, 1, 5, 3, 2, 4, 4], np.int64)
    lens = np.array([3, 2, 0, 2], np.int32)
    w = RNG.uniform(size=7).astype(F32)
    name = f"Fused{bits}BitRowwise"
    np.testing.assert_array_equal(
        _one(f"SparseLengthsSum{bits}BitRowwiseSparse", [pruned, idx, lens, mapping]),
        _one(f"SparseLengthsSum{name}", [full, idx, lens]))
    np.testing.assert_array_equal(
        _one(f"SparseLengthsWeightedSum{bits}BitRowwiseSparse", [pruned, w, idx, lens, mapping]),
        _one(f"SparseLengthsWeightedSum{name}", [full, w, idx, lens]))
    np.testing.assert_array_equal(  # pruned rows still count in the mean
        _one(f"SparseLengthsMean{bits}BitRowwiseSparse", [pruned, idx, lens, mapping]),
        _one(f"SparseLengthsMean{name}", [full, idx, lens]))
    np.testing.assert_array_equal(  # mapping [0]: not pruned
        _one(f"SparseLengthsSum{bits}BitRowwiseSparse", [full, idx, lens,
                                                          np.array([0], np.int32)]),
        _one(f"SparseLengthsSum{name}", [full, idx, lens]))
    new_idx, new_lens, new_w = _run("SparseLengthsSumSparseLookup", [idx, lens, mapping, w], 3)
    assert new_idx.dtype == np.int64 and new_idx.tolist() == [0, 3, 1, 2, 2]
    assert new_lens.dtype == np.int32 and new_lens.tolist() == [2, 1, 0, 2]
    np.testing.assert_array_equal(new_w, w[[0, 2, 4, 5, 6]])
    np.testing.assert_array_equal(
        _one(f"SparseLengthsWeightedSum{name}", [pruned, new_w, new_idx, new_lens]),
        _one(f"SparseLengthsWeightedSum{name}", [full, w, idx, lens]))


def test_unfused_8bits_rowwise_quantize_and_lookups() -> None:
    x = np.array([[0.0, 2.5, 3.5, 255.0], [9.0, 9.0, 9.0, 9.0], [1.0, -1.0, 0.5, 0.0]], F32)
    codes, sb = _run("FloatToRowwiseQuantized8Bits", [x], 2)
    assert codes.dtype == np.uint8 and sb.dtype == F32 and sb.shape == (3, 2)
    assert codes[0].tolist() == [0, 3, 4, 255]  # half away from zero: 2.5 -> 3
    assert codes[1].tolist() == [0, 0, 0, 0] and sb[1].tolist() == [1.0, 9.0]
    back = _one("Rowwise8BitQuantizedToFloat", [codes, sb])
    np.testing.assert_allclose(back[1], 9.0)
    assert np.abs(back - x).max() <= sb[:, 0].max() / 2 + 1e-6
    table = RNG.integers(0, 7, size=(5, 2, 3)).astype(np.uint8)
    scale_bias = RNG.uniform(size=(5, 2)).astype(F32)
    idx = np.array([4, 0, 0, 3], np.int64)
    lens = np.array([1, 0, 3], np.int32)
    w = RNG.uniform(size=4).astype(F32)
    rows = table.reshape(5, -1) * scale_bias[:, :1] + scale_bias[:, 1:]
    seg = np.repeat(np.arange(3), lens)
    ref = np.zeros((3, 6))
    np.add.at(ref, seg, rows[idx] * w[:, None])
    ref /= np.maximum(lens, 1)[:, None]
    out = _one("SparseLengthsWeightedMean8BitsRowwise", [table, w, idx, lens, scale_bias])
    assert out.shape == (3, 2, 3)
    np.testing.assert_allclose(out.reshape(3, 6), ref, rtol=1e-5)
    with pytest.raises(ShapeError, match="scale_bias"):
        _one("SparseLengthsSum8BitsRowwise", [table, idx, lens, scale_bias[:4]])


# --- percentiles -----------------------------------------------------------------------------
def test_percentile_doc_example_interpolation_and_shape() -> None:
    x = np.array([[3, 5, 3], [5, 1, 6]], F32)
    table = np.array([[3, 0.2], [5, 0.5], [1, 0.3], [3, 0.6]], F32)
    out = _one("Percentile", [x, table, np.array([2, 1, 1], np.int32)])
    np.testing.assert_allclose(out, [[0.2, 1.0, 0.6], [0.5, 0.3, 1.0]])
    mid = _one("Percentile", [np.array([[4.0], [0.0]], F32), np.array([[2, 0.2], [6, 0.6]], F32),
                              np.array([2], np.int32)])
    np.testing.assert_allclose(mid, [[0.4], [0.0]], rtol=1e-6)
    with pytest.raises(ShapeError, match="Sum of lengths"):
        _one("Percentile", [x, table, np.array([2, 1, 2], np.int32)])
    from dpgraph import core, workspace
    net = core.Net("pct_shapes")
    net.Percentile(["x", "t", "l"], ["p"])
    workspace.FeedBlob("x", x)
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes["p"] == [2, 3] and types["p"] == core.DataType.FLOAT


def test_bisect_percentile_doc_example() -> None:
    args = dict(percentile_raw=[1.0, 2.0, 3.0, 4.0, 0.1, 0.4],
                percentile_mapping=[0.15, 0.55, 0.9, 1.0, 0.3, 0.7],
                percentile_lower=[0.1, 0.3, 0.9, 1.0, 0.2, 0.6],
                percentile_upper=[0.2, 0.8, 0.9, 1.0, 0.4, 0.8], lengths=[4, 2])
    x = np.array([[2.5, 0.1], [0.5, 0.25], [5.0, 0.5], [2.0, 0.05]], F32)
    out = _one("BisectPercentile", [x], **args)
    w = (F32(0.25) - F32(0.1)) / (F32(0.4) - F32(0.1) + F32(1e-10))
    np.testing.assert_allclose(out[:, 0], [0.5 * 0.8 + 0.5 * 0.9, 0.0, 1.0, 0.55], rtol=1e-6)
    np.testing.assert_allclose(out[:, 1], [0.3, (1 - w) * 0.4 + w * 0.6, 1.0, 0.0], rtol=1e-5)
    with pytest.raises(ShapeError, match="Sum of lengths"):
        _one("BisectPercentile", [x], **{**args, "lengths": [4, 1]})


def test_bisect_percentile_keeps_caffe2s_bisection_on_repeated_values() -> None:
    # lo=0, hi=4: mid 2 has R[3] == 2 (not above x) -> lo=3; mid 3 brackets x -> k=3
    args = dict(percentile_raw=[1.0, 2.0, 2.0, 2.0, 3.0],
                percentile_mapping=[0.1, 0.2, 0.3, 0.4, 0.5],
                percentile_lower=[0.1] * 5, percentile_upper=[0.5] * 5, lengths=[5])
    out = _one("BisectPercentile", [np.array([[2.0]], F32)], **args)
    assert out.tolist() == [[F32(0.4)]]


# --- stochastic quantization -----------------------------------------------------------------
def test_rand_rowwise_layout_doc_example_and_unbiased_random_mode() -> None:
    x = np.array([[0.3, -1.4, -0.6, 0.9, 1.0]], F32)
    y = _one("FloatToFusedRandRowwiseQuantized", [x], bitwidth=2, random=0)
    assert y.shape == (1, 12) and y[0, :2].tolist() == [2, 3]
    assert struct.unpack("<ff", y[0, 2:10].tobytes()) == (F32(-1.4), F32(1.0))
    # codes [2, 0, 1, 3, 3]; segments of 2: byte 0 = q0 | q2 << 2 | q4 << 4
    assert y[0, 10:].tolist() == [2 | 1 << 2 | 3 << 4, 0 | 3 << 2]
    back = _one("FusedRandRowwiseQuantizedToFloat", [y])
    np.testing.assert_allclose(back, [[0.2, -1.4, -0.6, 1.0, 1.0]], atol=1e-6)
    wide = np.tile(RNG.uniform(-1, 1, size=(1, 9)).astype(F32), (4000, 1))
    codes = _one("FloatToFusedRandRowwiseQuantized", [wide], bitwidth=1)
    mean = _one("FusedRandRowwiseQuantizedToFloat", [codes]).mean(axis=0)
    np.testing.assert_allclose(mean, wide[0], atol=0.06)
    with pytest.raises(ShapeError, match="bitwidth"):
        _one("FloatToFusedRandRowwiseQuantized", [x], bitwidth=3)


@pytest.mark.parametrize("op_type", ["FloatToFused8BitRowwiseQuantized",
                                     "SparseLengthsSumFused4BitRowwise", "Percentile",
                                     "BisectPercentile", "FloatToFusedRandRowwiseQuantized"])
def test_caffe2_no_gradient_ops_add_nothing(op_type: str) -> None:
    op = CreateOperator(op_type, ["a", "b", "c"][:1 if "Float" in op_type or "Bisect" in op_type
                                                  else 3], ["y"])
    grad_ops, g_input = build_gradient(op, ["y_grad"])
    assert list(grad_ops) == [] and all(g is None for g in g_input)


@pytest.mark.parametrize("shape", [(0, 4), (4,), (2, 0, 4)])
def test_empty_and_vector_inputs_keep_their_leading_dimensions(shape: tuple) -> None:
    x = RNG.uniform(size=shape).astype(F32)
    for quant, dequant, extra in (
            ("FloatToFused8BitRowwiseQuantized", "Fused8BitRowwiseQuantizedToFloat", 8),
            ("FloatToFused4BitRowwiseQuantized", "Fused4BitRowwiseQuantizedToFloat", -2 + 4)):
        q = _one(quant, [x])
        assert q.shape == (*shape[:-1], shape[-1] + extra)
        assert _one(dequant, [q]).shape == shape
    with pytest.raises(ShapeError, match="no columns"):
        _one("FloatToFused8BitRowwiseQuantized", [np.zeros((3, 0), F32)])
