"""Feature-map merging, recsys data ops, histograms/quantiles and ranking ops: numpy
references written from the op descriptions, gradient checks and typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import dpgraph.ops  # noqa: F401  (registers every family)
from dpgraph import core, workspace
from dpgraph.errors import ShapeError
from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.gradient_builder import build_gradient
from dpgraph.ops.testing import check_gradient, numeric_gradient, run_op

RNG = np.random.default_rng(5)


def _run(op_type: str, inputs: list, outputs: int = 1, **args) -> list:
    names = [f"i{k}" for k in range(len(inputs))]
    return run_op(CreateOperator(op_type, names, [f"o{k}" for k in range(outputs)], **args),
                  inputs)


def _segments(values: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(values, np.cumsum(lengths)[:-1])


# --- feature maps -----------------------------------------------------------------------------
def test_merge_single_scalar_and_its_gradient() -> None:
    x1, p1 = np.array([1.0, 2.0, 3.0]), np.array([True, False, True])
    x2, p2 = np.array([4.0, 5.0, 6.0]), np.array([False, True, True])
    op = CreateOperator("MergeSingleScalarFeatureTensors", ["x1", "p1", "x2", "p2"],
                        ["len", "keys", "vals"], feature_ids=[7, 9])
    lengths, keys, values = run_op(op, [x1, p1, x2, p2])
    assert lengths.dtype == np.int32 and lengths.tolist() == [1, 1, 2]
    assert keys.dtype == np.int64 and keys.tolist() == [7, 9, 7, 9]
    assert values.tolist() == [1.0, 5.0, 3.0, 6.0]
    ops, grads = build_gradient(op, [None, None, "vals_grad"])
    assert [o.type for o in ops] == ["MergeSingleScalarFeatureTensorsGradient"]
    assert list(ops[0].input) == ["p1", "p2", "vals_grad"] and grads[0] == "x1_grad"
    check_gradient(op, [x1, p1, x2, p2], outputs_with_grads=(2,))
    strings = _run("MergeSingleScalarFeatureTensorsGradient",
                   [p1, p2, np.array([b"a", b"b", b"c", b"d"], object)], outputs=2)
    assert strings[0].tolist() == [b"a", b"", b"c"] and strings[1].tolist() == [b"", b"b", b"d"]


def test_merge_single_list_and_map() -> None:
    l1, v1, p1 = np.array([2, 0], np.int32), np.array([1.0, 2.0]), np.array([True, False])
    l2, v2, p2 = np.array([1, 2], np.int32), np.array([3.0, 4.0, 5.0]), np.array([True, True])
    out = _run("MergeSingleListFeatureTensors", [l1, v1, p1, l2, v2, p2], outputs=4,
               feature_ids=[1, 2])
    assert [o.tolist() for o in out] == [[2, 1], [1, 2, 2], [2, 1, 2], [1.0, 2.0, 3.0, 4.0, 5.0]]
    k1, k2 = np.array([10, 11], np.int64), np.array([20, 21, 22], np.int64)
    out = _run("MergeSingleMapFeatureTensors", [l1, k1, v1, p1, l2, k2, v2, p2], outputs=5,
               feature_ids=[1, 2])
    assert out[3].tolist() == [10, 11, 20, 21, 22]
    op = CreateOperator("MergeSingleListFeatureTensors", ["l1", "v1", "p1", "l2", "v2", "p2"],
                        ["a", "b", "c", "d"], feature_ids=[1, 2])
    check_gradient(op, [l1, v1, p1, l2, v2, p2], outputs_with_grads=(3,))


def _multi_list_reference(features: list[tuple]) -> tuple:
    """Example by example, feature input by feature input: keys and their value lists."""
    n = features[0][0].size
    keys, inner_lengths, values = [], [], []
    per_input = [(_segments(k, ln), _segments(il, ln), _segments(v, _example_sums(ln, il)))
                 for ln, k, il, v in features]
    for e in range(n):
        for k_seg, il_seg, v_seg in per_input:
            keys += k_seg[e].tolist()
            inner_lengths += il_seg[e].tolist()
            values += v_seg[e].tolist()
    lengths = sum(f[0] for f in features)
    return lengths.tolist(), keys, inner_lengths, values


def _example_sums(lengths: np.ndarray, inner: np.ndarray) -> np.ndarray:
    return np.array([s.sum() for s in _segments(inner, lengths)], dtype=np.int64)


def test_merge_multi_list_matches_reference_and_gradient() -> None:
    features = []
    for _ in range(3):
        lengths = RNG.integers(0, 3, 4).astype(np.int32)
        inner = RNG.integers(0, 3, int(lengths.sum())).astype(np.int32)
        keys = RNG.integers(0, 100, int(lengths.sum())).astype(np.int64)
        features.append((lengths, keys, inner, RNG.standard_normal(int(inner.sum()))))
    inputs = [a for f in features for a in f]
    out = _run("MergeMultiListFeatureTensors", inputs, outputs=4)
    expected = _multi_list_reference(features)
    for got, want in zip(out, expected):
        np.testing.assert_array_equal(got, want)
    names = [f"m{k}" for k in range(len(inputs))]
    op = CreateOperator("MergeMultiListFeatureTensors", names, ["a", "b", "c", "d"])
    check_gradient(op, inputs, outputs_with_grads=(3,))


def test_merge_multi_scalar_map_and_dense() -> None:
    l1, k1, v1 = np.array([1, 2], np.int32), np.array([1, 2, 3], np.int64), np.array([1., 2, 3])
    l2, k2, v2 = np.array([0, 1], np.int32), np.array([4], np.int64), np.array([4.])
    out = _run("MergeMultiScalarFeatureTensors", [l1, k1, v1, l2, k2, v2], outputs=3)
    assert [o.tolist() for o in out] == [[1, 3], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0]]
    op = CreateOperator("MergeMultiScalarFeatureTensors", ["a", "b", "c", "d", "e", "f"],
                        ["x", "y", "z"])
    check_gradient(op, [l1, k1, v1, l2, k2, v2], outputs_with_grads=(2,))
    il = np.array([1, 1, 1], np.int32)
    out = _run("MergeMultiMapFeatureTensors",
               [l1, k1, il, k1 * 10, v1, l2, k2, il[:1], k2 * 10, v2], outputs=5)
    assert out[3].tolist() == [10, 20, 30, 40]
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    presence = np.array([[True, False], [True, True]])
    out = _run("MergeDenseFeatureTensors", [x, presence], outputs=3, feature_ids=[5, 6])
    assert [o.tolist() for o in out] == [[1, 2], [5, 5, 6], [1.0, 3.0, 4.0]]


def test_merge_feature_errors() -> None:
    p = np.array([True, True])
    with pytest.raises(ShapeError, match="feature_ids"):
        _run("MergeSingleScalarFeatureTensors", [np.ones(2), p], outputs=3, feature_ids=[1, 2])
    with pytest.raises(ShapeError, match="bool"):
        _run("MergeSingleScalarFeatureTensors", [np.ones(2), np.ones(2)], outputs=3,
             feature_ids=[1])
    with pytest.raises(ShapeError, match="2 blobs per feature"):
        _run("MergeSingleScalarFeatureTensors", [np.ones(2), p, np.ones(2)], outputs=3,
             feature_ids=[1])
    with pytest.raises(ShapeError, match="ask for 3"):
        _run("MergeMultiScalarFeatureTensors",
             [np.array([3], np.int32), np.arange(3), np.ones(2)], outputs=3)


# --- recsys -----------------------------------------------------------------------------------
def test_copy_rows_to_tensor_in_place_and_gradient() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    op = CreateOperator("CopyRowsToTensor", ["X", "idx", "row"], ["X"])
    (y,) = run_op(op, [x.copy(), np.array([0, 2]), np.array([9, 8], np.float32)])
    assert y.tolist() == [[9, 8], [2, 3], [9, 8]]
    with pytest.raises(ShapeError, match="width of input tensor should match"):
        run_op(op, [x, np.array([0]), np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match="in place"):
        _run("CopyRowsToTensor", [x, np.array([0]), np.ones(2, np.float32)])
    ops, grads = build_gradient(op, ["X_grad_out"])
    assert [(o.type, list(o.input)) for o in ops] == [("CopyRowsToTensorGradient",
                                                       ["X_grad_out"])]
    (g,) = _run("CopyRowsToTensorGradient", [x])
    np.testing.assert_array_equal(g, x)


def test_data_couple_pad_empty_and_key_split() -> None:
    a, b = np.ones(2), np.zeros(3)
    out = run_op(CreateOperator("DataCouple", ["a", "b", "c"], ["a", "b"]), [a, b, a])
    assert out[0] is a and out[1] is b
    lengths = np.array([0, 2, 0, 1], np.int32)
    feats = np.array([[1, 1], [2, 2], [3, 3]], np.int64)
    names = np.array([b"x", b"y", b"z"], object)
    out = _run("PadEmptySamples", [lengths, feats, names], outputs=3)
    assert out[0].tolist() == [1, 2, 1, 1]
    assert out[1].tolist() == [[0, 0], [1, 1], [2, 2], [0, 0], [3, 3]]
    assert out[2].tolist() == [b"", b"x", b"y", b"", b"z"]
    with pytest.raises(ShapeError, match="consistent"):
        _run("PadEmptySamples", [lengths, feats[:2]], outputs=2)
    keys = np.array([2, 0, 2, 1, 0], np.int64)
    out = _run("KeySplit", [keys], outputs=3, categorical_limit=3)
    assert [o.tolist() for o in out] == [[1, 4], [3], [0, 2]] and out[0].dtype == np.int32
    with pytest.raises(ShapeError, match="lie in"):
        _run("KeySplit", [keys], outputs=2, categorical_limit=2)


def test_ngram_from_categorical() -> None:
    floats = np.array([[10.4, 0.0, 7.0], [20.0, 5.0, 8.6], [-1.0, 5.0, 9.0]], np.float32)
    (out,) = _run("NGramFromCategorical", [floats], col_ids=[0, 2],
                  categorical_limits=[2, 3], vals=[10, 20, 7, 8, 9])
    # column 0: 10 -> 0, 20 -> 1 (base 1); column 2: 7 -> 0, 8 -> 2, 9 -> 4 (base 2)
    assert out.dtype == np.int64 and out.tolist() == [0, 1 + 4, 0 + 4]  # 8.6 rounds to 9
    (half,) = _run("NGramFromCategorical", [np.array([[2.5], [-2.5]], np.float32)],
                   col_ids=[0], categorical_limits=[2], vals=[3, -3])  # round half away
    assert half.tolist() == [0, 1]
    with pytest.raises(ShapeError, match="sum\\(categorical_limits\\)"):
        _run("NGramFromCategorical", [floats], col_ids=[0], categorical_limits=[2], vals=[1])


def test_partition_gather_by_key_and_lengths_partition() -> None:
    keys = np.array([5, -3, 4, 7, 0, 2], np.int64)
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    op = CreateOperator("Partition", ["k", "d"], ["k0", "d0", "k1", "d1", "k2", "d2"],
                        pack_first_input=1)
    out = run_op(op, [keys, data])
    shard = keys % 3
    for p in range(3):
        np.testing.assert_array_equal(out[2 * p], keys[shard == p] // 3)
        np.testing.assert_array_equal(out[2 * p + 1], data[shard == p])
    (back,) = _run("GatherByKey", [keys, out[1], out[3], out[5]])
    np.testing.assert_array_equal(back, data)
    gather = CreateOperator("GatherByKey", ["k", "s0", "s1"], ["full"])
    ops, grads = build_gradient(gather, ["full_grad"])
    assert ops[0].type == "Partition" and list(ops[0].output) == [
        "_s0_grad_keys", "s0_grad", "_s1_grad_keys", "s1_grad"]
    lengths = np.array([2, 0, 4], np.int32)
    out = _run("LengthsPartition", [lengths, keys, data], outputs=9)  # 3 partitions
    assert [out[3 * p].tolist() for p in range(3)] == [[1, 0, 1], [0, 0, 2], [1, 0, 1]]
    assert out[3].dtype == np.int32
    np.testing.assert_array_equal(out[4], keys[shard == 1])
    np.testing.assert_array_equal(out[8], data[shard == 2])
    with pytest.raises(ShapeError, match="Total length"):
        _run("LengthsPartition", [lengths[:2], keys, data], outputs=6)
    with pytest.raises(ShapeError, match="multiple"):
        _run("Partition", [keys, data], outputs=3)
    assert build_gradient(op, ["k0_g", "d0_g", None, None, None, None]) == ([], [None, None])


def test_weighted_sample() -> None:
    weights = np.array([[0, 1, 0], [0, 0, 2], [3, 0, 0]], np.float32)
    values = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.float32)
    index, value = _run("WeightedSample", [weights, values], outputs=2)
    assert index.dtype == np.int32 and index.ravel().tolist() == [1, 2, 0]
    assert value.shape == (3, 1) and value.ravel().tolist() == [2, 6, 7]
    many = np.tile(np.array([[1, 3]], np.float32), (4000, 1))
    (draws,) = _run("WeightedSample", [many])
    assert 0.72 < draws.mean() < 0.78
    (none,) = _run("WeightedSample", [np.zeros((0, 3), np.float32)])
    assert none.shape == (0,)
    with pytest.raises(ShapeError, match="non-negative"):
        _run("WeightedSample", [-weights])


# --- histograms and quantiles -----------------------------------------------------------------
def test_histogram() -> None:
    x = np.array([-2.0, -2.0, 0.0, 0.0, 1.0, 2.0, 9.0, 10.0, -3.0])
    (hist,) = _run("Histogram", [x, x[:2]], bin_edges=[-2.0, 0.0, 2.0, 9.0])
    assert hist.dtype == np.int64 and hist.tolist() == [4, 3, 1]
    with pytest.raises(ShapeError, match="strictly increasing"):
        _run("Histogram", [x], bin_edges=[0.0, 0.0])
    with pytest.raises(ShapeError, match="greater than or equal to 2"):
        _run("Histogram", [x], bin_edges=[0.0])


def test_self_binning_histogram() -> None:
    x = np.array([-2.0, 0.0, 1.0, 9.0])
    edges, counts = _run("SelfBinningHistogram", [x], outputs=2, num_bins=2)
    np.testing.assert_allclose(edges, [-2.0, -2 + 11.0011 / 2, -2 + 11.0011])
    assert counts.tolist() == [3, 1, 0]
    edges, counts = _run("SelfBinningHistogram", [x], outputs=2, num_bins=2,
                         bin_spacing="logarithmic", logspace_start=1e-4)
    assert edges[0] == pytest.approx(1e-4) and counts.tolist() == [2, 2, 0]
    edges, counts = _run("SelfBinningHistogram", [np.ones(3, np.float32)], outputs=2,
                         num_bins=3)
    assert edges.dtype == np.float32 and counts.tolist() == [3, 0, 0, 0]
    edges, counts = _run("SelfBinningHistogram", [np.zeros(0)], outputs=2, num_bins=1)
    assert edges.tolist() == [0, 0] and counts.tolist() == [0, 0]


def test_quantile() -> None:
    x = RNG.standard_normal(1001)
    (q,) = _run("Quantile", [x[:500], x[500:]], quantile=0.3, tol=1e-6)
    values = np.abs(x)
    assert np.sum(values <= q[0]) >= np.ceil(0.3 * values.size)
    assert np.sum(values <= q[0] * (1 - 3e-6)) <= np.ceil(0.3 * values.size)
    (low,) = _run("Quantile", [x], quantile=0.0, abs=0)
    assert low[0] == x.min() and low.dtype == np.float64
    with pytest.raises(ShapeError, match="same type"):
        _run("Quantile", [x, x.astype(np.float32)], quantile=0.5)


# --- ranking ----------------------------------------------------------------------------------
def _lambda_reference(y: np.ndarray, r: np.ndarray) -> tuple[float, np.ndarray]:
    """LambdaRank with 2^r gains, 1/log2(rank+2) discounts, idcg normalisation."""
    n = y.size
    gain = 2.0 ** r
    disc_y, disc_r = np.empty(n), np.empty(n)
    disc_y[np.argsort(-y)] = 1 / np.log2(np.arange(n) + 2)
    disc_r[np.argsort(-r, kind="stable")] = 1 / np.log2(np.arange(n) + 2)
    idcg = max(float(gain @ disc_r), 1e-5)
    loss, dy = 0.0, np.zeros(n)
    for i in range(n):
        for j in range(n):
            if r[i] == r[j]:
                continue
            w = abs((gain[i] - gain[j]) * (disc_y[i] - disc_y[j]))
            s = 1.0 if r[i] > r[j] else -1.0
            loss += w * np.log1p(np.exp(-s * (y[i] - y[j])))
            dy[i] -= w * s / (1 + np.exp(s * (y[i] - y[j])))
    return loss / idcg, dy / idcg


def test_lambda_rank_ndcg_and_gradient() -> None:
    y = RNG.random(9).astype(np.float32)
    r = np.array([0, 2, 1, 1, 0, 0, 0, 0, 3], np.float32)
    r[4:6] = 0  # second session: all zero relevance
    lengths = np.array([4, 2, 3], np.int32)
    loss, dy = _run("LambdaRankNdcg", [y, r, lengths], outputs=2)
    for s, (lo, hi) in enumerate([(0, 4), (4, 6), (6, 9)]):
        if not r[lo:hi].any():
            assert loss[s] == 0 and not dy[lo:hi].any()
            continue
        ref_loss, ref_dy = _lambda_reference(y[lo:hi].astype(np.float64), r[lo:hi])
        assert loss[s] == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose(dy[lo:hi], ref_dy, rtol=1e-5, atol=1e-6)
    op = CreateOperator("LambdaRankNdcg", ["y", "r", "len"], ["loss", "dy"])
    # the cached dy is half the loss gradient (each unordered pair is counted twice)
    numeric = numeric_gradient(op, [y.astype(np.float64), r, lengths], 0,
                               {0: np.ones(3)}, eps=1e-4)
    np.testing.assert_allclose(2 * dy, numeric, rtol=2e-2, atol=1e-3)
    ops, grads = build_gradient(op, ["loss_grad", None])
    assert [(o.type, list(o.input)) for o in ops] == [
        ("LambdaRankNdcgGradient", ["y", "len", "dy", "loss_grad"])]
    dloss = np.array([2.0, 3.0, -1.0], np.float32)
    (back,) = _run("LambdaRankNdcgGradient", [y, lengths, dy, dloss])
    np.testing.assert_allclose(back, np.repeat(dloss, lengths) * dy, rtol=1e-6)
    ndcg_loss, _ = _run("LambdaRankNdcg", [y, r, lengths], outputs=2, use_ndcg_as_loss=1,
                        use_idcg_normalization=1)
    assert np.all((ndcg_loss >= -1e-6) & (ndcg_loss <= 1 + 1e-6))
    with pytest.raises(ShapeError, match="sum to"):
        _run("LambdaRankNdcg", [y, r, lengths[:2]], outputs=2)


def test_session_margin_loss_and_gradient() -> None:
    pred = RNG.random(7).astype(np.float32)
    label = np.array([1, 0, 2, 2, 0, 1, 0], np.float32)
    lengths = np.array([4, 3], np.int32)
    margin = 0.3
    loss, dpred = _run("SessionMarginLoss", [pred, label, lengths], outputs=2, margin=margin)
    for s, (lo, hi) in enumerate([(0, 4), (4, 7)]):
        p, l = pred[lo:hi].astype(np.float64), label[lo:hi]
        n, ref = hi - lo, 0.0
        for i in range(n):
            for j in range(i + 1, n):
                if l[i] != l[j]:
                    ref += max(0.0, margin - np.sign(l[i] - l[j]) * (p[i] - p[j])) / n
        assert loss[s] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    op = CreateOperator("SessionMarginLoss", ["p", "l", "len"], ["loss", "dp"], margin=margin)
    check_gradient(op, [pred, label, lengths], inputs_to_check=[0], eps=1e-4)


def test_ap_meter_buffers_across_runs() -> None:
    def ap(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
        result = []
        for k in range(scores.shape[1]):
            truth = labels[np.argsort(-scores[:, k], kind="stable"), k]
            precision = np.cumsum(truth) / np.arange(1, truth.size + 1)
            result.append(precision[truth == 1].sum() / max(1, truth.sum()))
        return np.array(result)

    scores = RNG.random((6, 2)).astype(np.float32)
    labels = RNG.integers(0, 2, (6, 2)).astype(np.int32)
    (out,) = _run("APMeter", [scores, labels], buffer_size=4)
    np.testing.assert_allclose(out, ap(scores[2:], labels[2:]), rtol=1e-6)
    workspace.ResetWorkspace()
    net = core.Net("apm")
    net.APMeter(["s", "l"], ["ap"], buffer_size=10)
    workspace.FeedBlob("s", scores[:3])
    workspace.FeedBlob("l", labels[:3])
    workspace.CreateNet(net)
    workspace.RunNet(net)
    workspace.FeedBlob("s", scores[3:])
    workspace.FeedBlob("l", labels[3:])
    workspace.RunNet(net)  # the op instance keeps the first three rows
    np.testing.assert_allclose(workspace.FetchBlob("ap"), ap(scores, labels), rtol=1e-6)
    workspace.ResetWorkspace()


def test_weighted_multi_sampling_draws_from_the_cdf() -> None:
    cdf = np.array([0.0, 0.0, 1.0, 1.0, 3.0], np.float32)  # mass on index 2 (1/3) and 4 (2/3)
    (idx,) = run_op(CreateOperator("WeightedMultiSampling", ["w"], ["i"], num_samples=3000),
                    [cdf])
    assert idx.dtype == np.int32 and idx.shape == (3000,)
    assert set(np.unique(idx)) == {2, 4}
    assert abs((idx == 4).mean() - 2 / 3) < 0.05
    (shaped,) = run_op(CreateOperator("WeightedMultiSampling", ["w", "s"], ["i"]),
                       [cdf, np.zeros((2, 3))])
    assert shaped.shape == (2, 3)
    (empty,) = run_op(CreateOperator("WeightedMultiSampling", ["w"], ["i"], num_samples=4),
                      [np.zeros(0, np.float32)])
    assert empty.shape == (0,)
    with pytest.raises(ShapeError, match="num_samples"):
        run_op(CreateOperator("WeightedMultiSampling", ["w", "s"], ["i"], num_samples=2),
               [cdf, np.zeros(2)])
