"""Compressed gradients: ``Parallelize(..., gradient_dtype=..., gradient_error_feedback=...)``.

The casts are checked against their definitions (numpy float16; bfloat16 by an independent
float64 nearest-even reference and by torch), the graph per gradient and per bucket, and
training against float32; error feedback bounds the accumulated quantisation drift.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch
from _parallel_helpers import mlp_forward, train

from dpgraph import core, data_parallel_model, model_helper, optimizer, workspace
from dpgraph.errors import ParallelizeError
from dpgraph.ops.compress import round_to_bfloat16

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38,
                     1e-40, -1e-45, 65504.0, 65520.0, 1e5, 6e-8, 1.00390625, 1.01171875,
                     1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8], dtype=np.float32)


def _values(n: int = 1500) -> np.ndarray:
    rs = np.random.RandomState(7)
    bits = rs.randint(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([SPECIALS, bits.view(np.float32), rs.randn(n).astype(np.float32)])


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 by float64 distances to both truncation neighbours, ties to even."""
    out = np.empty_like(x)
    for i, value in enumerate(x):
        if np.isnan(value) or np.isinf(value):
            out[i] = value
            continue
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        low = bits & 0xFFFF0000
        high = low + 0x10000
        down = float(np.array(low, dtype=np.uint32).view(np.float32))
        up_bits = np.array(high & 0xFFFFFFFF, dtype=np.uint32)
        up = float(up_bits.view(np.float32))
        if (high & 0x7F800000) == 0x7F800000 and not np.isfinite(up):
            up = np.inf if value > 0 else -np.inf
            # distance to "infinity" is measured to the next power-of-two step (IEEE overflow)
            gap = float(np.ldexp(1.0, 128 - 8))
            far = abs(abs(float(value)) - (abs(down) + gap))
        else:
            far = abs(float(value) - up)
        near = abs(float(value) - down)
        if near < far or (near == far and ((low >> 16) & 1) == 0):
            out[i] = down
        else:
            out[i] = up
    return out


def test_bfloat16_matches_the_nearest_even_reference_and_torch() -> None:
    x = _values()
    got = round_to_bfloat16(x)
    assert got.dtype == np.float32
    assert not (got.view(np.uint32) & 0xFFFF).any()
    np.testing.assert_array_equal(got, _bf16_reference(x))
    via_torch = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(got, via_torch)


def _run_op(op_type: str, inputs: dict[str, np.ndarray], outputs: list[str],
            **args: Any) -> list[np.ndarray]:
    workspace.ResetWorkspace()
    for name, value in inputs.items():
        workspace.FeedBlob(name, value)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **args))
    return [workspace.FetchBlob(name) for name in outputs]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compress_decompress_are_the_definitions(dtype: str) -> None:
    x = _values()
    x = x[np.isfinite(x)]
    x = x[:x.size // 2 * 2].reshape(-1, 2)
    (y,) = _run_op("GradientCompress", {"g": x}, ["y"], dtype=dtype)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16) if dtype == "float16" else _bf16_reference(x.ravel())
    assert y.dtype == (np.float16 if dtype == "float16" else np.float32)
    np.testing.assert_array_equal(y.reshape(-1), np.asarray(expected).reshape(-1))
    (back,) = _run_op("GradientDecompress", {"y": y}, ["g"], dtype=dtype)
    assert back.dtype == np.float32 and back.shape == x.shape
    np.testing.assert_array_equal(back, y.astype(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_error_feedback_op(dtype: str) -> None:
    rs = np.random.RandomState(1)
    x = rs.randn(3, 5).astype(np.float32)
    error = (1e-3 * rs.randn(15)).astype(np.float32)
    y, e = _run_op("GradientCompress", {"g": x, "e": error}, ["y", "e"], dtype=dtype)
    carried = x + error.reshape(3, 5)
    q = carried.astype(np.float16).astype(np.float32) if dtype == "float16" else \
        _bf16_reference(carried.ravel()).reshape(3, 5)
    np.testing.assert_array_equal(y.astype(np.float32), q)
    np.testing.assert_array_equal(e, carried - q)
    # an empty error blob (the init net's) means no carried error yet
    y0, e0 = _run_op("GradientCompress", {"g": x, "e": np.zeros(0, np.float32)}, ["y", "e"],
                     dtype=dtype)
    np.testing.assert_array_equal(e0, x - y0.astype(np.float32))


def test_compress_refuses_bad_inputs() -> None:
    with pytest.raises(Exception, match="dtype"):
        _run_op("GradientCompress", {"g": np.ones(2, np.float32)}, ["y"], dtype="int8")
    with pytest.raises(Exception, match="float32"):
        _run_op("GradientCompress", {"g": np.ones(2, np.float64)}, ["y"], dtype="float16")
    with pytest.raises(Exception, match="holds 3 values"):
        _run_op("GradientCompress", {"g": np.ones(2, np.float32), "e": np.ones(3, np.float32)},
                ["y", "e"], dtype="float16")


# --- the graph ----------------------------------------------------------------------------
def _types(model: Any) -> list[str]:
    return [op.type for op in model.net.Proto().op]


def test_structure_per_gradient() -> None:
    model, _ = train([0, 1], update="sgd", iters=1, gradient_dtype="float16")
    ops = list(model.net.Proto().op)
    compress = [op for op in ops if op.type == "GradientCompress"]
    decompress = [op for op in ops if op.type == "GradientDecompress"]
    assert len(compress) == len(decompress) == 2 * 4  # 2 devices x 4 gradients
    sums = [op for op in ops if op.type == "Sum"]
    assert sums and all(b.endswith("_grad_float16") for op in sums for b in op.input)
    assert workspace.FetchBlob("cpu_1/fc1_w_grad_float16").dtype == np.float16
    assert workspace.FetchBlob("cpu_1/fc1_w_grad").dtype == np.float32
    assert workspace.FetchBlob("cpu_1/fc1_w").dtype == np.float32


def test_structure_per_bucket_with_error_feedback() -> None:
    model, _ = train([0, 1], update="sgd", iters=1, gradient_dtype="bfloat16",
                     gradient_bucket_mb=1, gradient_error_feedback=True)
    compress = [op for op in model.net.Proto().op if op.type == "GradientCompress"]
    assert [list(op.input) for op in compress] == [
        [f"cpu_{d}/grad_bucket_0", f"cpu_{d}/grad_bucket_0_bfloat16_error"] for d in (0, 1)]
    init = {b for op in model.param_init_net.Proto().op for b in op.output}
    assert {"cpu_0/grad_bucket_0_bfloat16_error", "cpu_1/grad_bucket_0_bfloat16_error"} <= init


def test_nccl_bucket_moves_float16() -> None:
    _, ref = train([0, 1, 2, 3], gpu=True, update="momentum", iters=5, use_nccl=True)
    model, got = train([0, 1, 2, 3], gpu=True, update="momentum", iters=5, use_nccl=True,
                       gradient_dtype="float16", gradient_bucket_mb=1)
    nccl = [op for op in model.net.Proto().op if op.type == "NCCLAllreduce"]
    assert len(nccl) == 1 and list(nccl[0].input) == [
        f"gpu_{d}/grad_bucket_0_float16" for d in range(4)]
    assert workspace.FetchBlob("gpu_2/grad_bucket_0_float16").dtype == np.float16
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=2e-3, err_msg=name)


def test_one_device_compresses_nothing() -> None:
    model, _ = train([0], update="sgd", iters=1, gradient_dtype="float16")
    assert "GradientCompress" not in _types(model)


@pytest.mark.parametrize("dtype,atol", [("float16", 2e-3), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("gpu", [False, True])
def test_training_stays_close_to_float32(dtype: str, atol: float, gpu: bool) -> None:
    devices = [0, 1, 2, 3] if gpu else [0, 1]
    _, ref = train(devices, gpu=gpu, update="momentum", iters=10)
    _, got = train(devices, gpu=gpu, update="momentum", iters=10, gradient_dtype=dtype,
                   gradient_error_feedback=True)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=atol, err_msg=name)
        assert not np.array_equal(got[name], ref[name]) or name.endswith("_b")


@pytest.mark.parametrize("value,match", [
    ({"gradient_dtype": "int8"}, "gradient_dtype"),
    ({"gradient_dtype": "float16", "gradient_error_feedback": 1}, "gradient_error_feedback"),
    ({"gradient_error_feedback": True}, "gradient_error_feedback"),
])
def test_bad_settings_are_refused_and_model_unchanged(value: dict[str, Any], match: str) -> None:
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="compress")
    before = model.net.Proto().SerializeToString()
    with pytest.raises(ParallelizeError, match=match):
        data_parallel_model.Parallelize(
            model, lambda m: None, mlp_forward, devices=[0, 1], cpu_device=True,
            optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.1), **value)
    assert model.net.Proto().SerializeToString() == before


# --- error feedback: accumulated drift ------------------------------------------------------
def _reduced_gradient_sum(steps: int, **kwargs: Any) -> dict[str, np.ndarray]:
    """Sum over ``steps`` RunNets of the reduced gradient with frozen params (lr 0), so the
    exact gradient is the same every step."""
    from _parallel_helpers import _set_params, feed_batch

    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="drift")
    data_parallel_model.Parallelize(
        model, lambda m: None, mlp_forward, devices=[0, 1], cpu_device=True,
        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.0), **kwargs)
    feed_batch(model, [0, 1], False)
    data_parallel_model.RunInitNet(model)
    _set_params(model, [0, 1], False)
    total: dict[str, np.ndarray] = {}
    for _ in range(steps):
        data_parallel_model.RunNet(model, 1)
        for grad in model._grad_names:
            value = workspace.FetchBlob(f"cpu_0/{grad}").astype(np.float64)
            total[grad] = total.get(grad, 0) + value
    return total


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_error_feedback_reduces_accumulated_drift(dtype: str) -> None:
    steps = 16
    exact = _reduced_gradient_sum(steps)
    plain = _reduced_gradient_sum(steps, gradient_dtype=dtype)
    feedback = _reduced_gradient_sum(steps, gradient_dtype=dtype, gradient_error_feedback=True)

    def drift(got: dict[str, np.ndarray]) -> float:
        return sum(float(np.abs(got[g] - exact[g]).sum()) for g in exact)

    assert drift(plain) > 0
    # feedback removes the local casts' share of the drift; what remains is the rounding of
    # the reduction result itself (float16 sums, bfloat16 output), which no rank sees
    assert drift(feedback) < 0.7 * drift(plain), (drift(feedback), drift(plain))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_error_feedback_bounds_the_local_drift(dtype: str) -> None:
    """The same gradient compressed 64 times: without feedback the error of the sum grows
    with the steps, with it the sum stays within one step's rounding error."""
    rs = np.random.RandomState(3)
    x = rs.randn(256).astype(np.float32)
    workspace.ResetWorkspace()
    workspace.FeedBlob("g", x)
    workspace.FeedBlob("e", np.zeros(0, np.float32))
    plain_op = core.CreateOperator("GradientCompress", ["g"], ["y"], dtype=dtype)
    feedback_op = core.CreateOperator("GradientCompress", ["g", "e"], ["yf", "e"], dtype=dtype)
    steps = 64
    plain = np.zeros(256)
    feedback = np.zeros(256)
    for _ in range(steps):
        workspace.RunOperatorOnce(plain_op)
        workspace.RunOperatorOnce(feedback_op)
        plain += workspace.FetchBlob("y").astype(np.float64)
        feedback += workspace.FetchBlob("yf").astype(np.float64)
    exact = steps * x.astype(np.float64)
    one_step = np.abs(round_to_bfloat16(x) - x) if dtype == "bfloat16" else np.abs(
        x.astype(np.float16).astype(np.float32) - x)
    assert np.abs(plain - exact).sum() == pytest.approx(steps * one_step.sum(), rel=1e-6)
    # with feedback, |sum error| = |carried error| <= half a unit in the last place
    spacing = np.abs(round_to_bfloat16(x)) * 2.0 ** -7 if dtype == "bfloat16" else \
        np.spacing(np.abs(x).astype(np.float16)).astype(np.float64)
    assert (np.abs(feedback - exact) <= spacing + 1e-12).all()
    assert np.abs(feedback - exact).sum() < 0.05 * np.abs(plain - exact).sum()


# --- convergence: the digits demo ------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _float32_demo_accuracy() -> float:
    from dpgraph.demo import DemoConfig, run_demo

    return run_demo(DemoConfig(quiet=True, check_iterations=0)).accuracy


@pytest.mark.parametrize("dtype,feedback", [("float16", False), ("bfloat16", True)])
def test_digits_demo_accuracy_within_one_percent_of_float32(
        monkeypatch: pytest.MonkeyPatch, dtype: str, feedback: bool) -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn's digits data set")
    from dpgraph.demo import DemoConfig, run_demo

    config = DemoConfig(quiet=True, check_iterations=0)
    reference = _float32_demo_accuracy()
    original = data_parallel_model.Parallelize_CPU
    applied: list[Any] = []

    def compressed(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("optimizer_builder_fun") is not None:  # the training model
            kwargs.update(gradient_dtype=dtype, gradient_error_feedback=feedback)
            applied.append(args[0])
        original(*args, **kwargs)

    monkeypatch.setattr(data_parallel_model, "Parallelize_CPU", compressed)
    result = run_demo(config)
    assert applied and "GradientCompress" in _types(applied[0])
    assert reference > 0.9
    assert abs(result.accuracy - reference) <= 0.01, (result.accuracy, reference)
