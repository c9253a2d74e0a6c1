"""The fast paths of compressed gradients and buckets: vectorised casts bitwise equal to the
numpy definitions (NaN payloads included), kernels writing into their previous output
arrays, the zero-copy bucket pack, and the bfloat16 wire marking of cross-host Allreduces."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

from dpgraph import brew, core, data_parallel_model, model_helper, workspace
from dpgraph.errors import CollectiveError
from dpgraph.ops import compress

pytest.importorskip("torch", reason="the vectorised casts use torch")

LARGE = 3 * compress._CHUNK + 12345  # several chunks, the torch path


def _bits(count: int, seed: int = 5) -> np.ndarray:
    """Every kind of float32: random bit patterns (NaNs with payloads, infinities,
    subnormals) and ordinary values."""
    rs = np.random.RandomState(seed)
    specials = np.array([0x7FC00001, 0xFFA00000, 0x7F800001, 0x7F800000, 0xFF800000, 1, 0x80000001,
                         0x477FF000, 0x47800000, 0x3F808000, 0x3F818000], np.uint32)
    raw = rs.randint(0, 2 ** 32, size=count // 2, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([specials.view(np.float32), raw.view(np.float32),
                           rs.randn(count - count // 2 - specials.size).astype(np.float32)])


def _same_bits(got: np.ndarray, expected: np.ndarray) -> None:
    width = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got.view(width), expected.view(width))


@pytest.mark.parametrize("count", [100, LARGE])
def test_casts_are_bitwise_the_numpy_definitions(count: int) -> None:
    x = _bits(count)
    assert np.isnan(x).any() and np.isinf(x).any()
    with np.errstate(all="ignore"):
        half = x.astype(np.float16)
    _same_bits(compress.to_float16(x), half)
    _same_bits(compress.from_float16(half), half.astype(np.float32))
    bf = compress._numpy_round_to_bfloat16(x)
    _same_bits(compress.round_to_bfloat16(x), bf)
    words = compress.to_bfloat16_bits(x)
    np.testing.assert_array_equal(words, (bf.view(np.uint32) >> 16).astype(np.uint16))
    _same_bits(compress.from_bfloat16_bits(words), bf)


def test_casts_write_into_out_even_in_place() -> None:
    x = _bits(LARGE, seed=9)
    expected = compress._numpy_round_to_bfloat16(x)
    out = x.copy()
    assert compress.round_to_bfloat16(out, out=out) is out
    _same_bits(out, expected)
    half = np.empty(x.shape, np.float16)
    assert compress.to_float16(x, out=half) is half
    with pytest.raises(ValueError, match="expected"):
        compress.to_float16(x, out=np.empty(3, np.float16))


def _run_twice(ops: list[Any], feeds: dict[str, np.ndarray], output: str
               ) -> tuple[np.ndarray, np.ndarray, bool]:
    workspace.ResetWorkspace()
    net = core.Net("fast_paths")
    net.Proto().op.extend(ops)
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    first_value = workspace.FetchBlob(output)
    ws = _runtime_workspace()
    first_array = weakref.ref(ws._blobs[output])  # a strong reference would block the reuse
    workspace.RunNet(net.Name())
    return first_value, workspace.FetchBlob(output), ws._blobs[output] is first_array()


def _runtime_workspace() -> Any:
    from dpgraph.runtime import api

    return api.current()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compress_kernels_reuse_their_output_arrays(dtype: str) -> None:
    from dpgraph.runtime.operator import RuntimeOpContext

    if not hasattr(RuntimeOpContext, "reusable_output"):
        pytest.skip("this runtime does not offer output reuse (the kernels allocate)")
    x = _bits(LARGE, seed=3)
    x = x[np.isfinite(x)][: 2 * compress._CHUNK]
    ops = [core.CreateOperator("GradientCompress", ["g"], ["y"], dtype=dtype),
           core.CreateOperator("GradientDecompress", ["y"], ["back"], dtype=dtype)]
    first, second, reused = _run_twice(ops, {"g": x}, "y")
    assert reused
    _same_bits(first, second)
    ws = _runtime_workspace()
    expected = compress.dequantize(compress.quantize(x, dtype), dtype)
    _same_bits(ws._blobs["back"], expected)


def test_pack_copies_nothing_when_the_gradients_are_its_views() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.float32)
    workspace.ResetWorkspace()
    workspace.FeedBlob("a", a)
    workspace.FeedBlob("b", b)
    pack = core.CreateOperator("GradientBucketPack", ["a", "b"], ["bucket"])
    unpack = core.CreateOperator("GradientBucketUnpack", ["bucket", "a", "b"], ["a", "b"])
    workspace.RunOperatorOnce(pack)
    workspace.RunOperatorOnce(unpack)
    ws = _runtime_workspace()
    bucket = ws._blobs["bucket"]
    assert ws._blobs["a"].base is bucket and ws._blobs["b"].base is bucket
    workspace.RunOperatorOnce(pack)  # the views are in place: the bucket itself comes back
    assert ws._blobs["bucket"] is bucket
    np.testing.assert_array_equal(bucket, np.concatenate([a.ravel(), b]))
    workspace.FeedBlob("a", a + 1)  # a fresh gradient: copied into a bucket again
    workspace.RunOperatorOnce(pack)
    np.testing.assert_array_equal(ws._blobs["bucket"], np.concatenate([a.ravel() + 1, b]))


def test_allreduce_op_checks_wire_dtype() -> None:
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator("CreateCommonWorld", [], ["cw"], size=1,
                                                  rank=0, engine="CPU"))
    workspace.FeedBlob("x", np.ones(4, np.float32))
    workspace.FeedBlob("y", np.ones(4, np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Allreduce", ["cw", "x", "y"], ["x", "y"],
                                                  wire_dtype="bfloat16", engine="CPU"))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), np.full(4, 2, np.float32))
    with pytest.raises(CollectiveError, match="wire_dtype must be one of"):
        workspace.RunOperatorOnce(core.CreateOperator("Allreduce", ["cw", "x"], ["x"],
                                                      wire_dtype="int4", engine="CPU"))


def _multihost(dtype: str, bucket_mb: Any) -> Any:
    def forward(model: Any, loss_scale: float) -> list[Any]:
        hidden = brew.relu(model, brew.fc(model, "data", "fc1", 6, 5), "relu1")
        out = brew.fc(model, hidden, "fc2", 5, 3)
        loss = model.net.AveragedLoss(model.net.SquaredL2Distance([out, "label"], "d"), "l")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    def sgd(model: Any) -> None:
        it = brew.iter(model, "ITER")
        lr = model.net.LearningRate([it], "LR", base_lr=-0.1, policy="fixed")
        one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for param in model.GetParams():
            model.net.WeightedSum([param, one, model.param_to_grad[param], lr], param)

    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name=f"wire_{dtype}")
    data_parallel_model.Parallelize(
        model, lambda m: None, forward, param_update_builder_fun=sgd, devices=[0, 1],
        cpu_device=True, gradient_dtype=dtype, gradient_bucket_mb=bucket_mb,
        rendezvous={"kv_handler": "store", "shard_id": 1, "num_shards": 2, "engine": "GLOO"})
    return [op for op in model.net.Proto().op if op.type == "Allreduce"]


@pytest.mark.parametrize("bucket_mb", [None, 1.0])
def test_cross_host_bfloat16_allreduces_carry_the_wire_dtype(bucket_mb: Any) -> None:
    marked = _multihost("bfloat16", bucket_mb)
    assert marked and all(b.endswith("_bfloat16") for op in marked for b in op.input[1:])
    for op in marked:
        assert [a.s for a in op.arg if a.name == "wire_dtype"] == [b"bfloat16"]
    plain = _multihost("float16", bucket_mb)  # float16 blobs need no mark
    assert plain and not any(a.name == "wire_dtype" for op in plain for a in op.arg)
