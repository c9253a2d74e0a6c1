"""Gelu, Mish, Softsign, Cbrt, Log1p, Reciprocal: forward against numpy references, gradient
ops as Caffe2 wires them, gradients against finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgraph.ir.operator import CreateOperator
from dpgraph.ops.testing import build_gradient, check_gradient, run_op

RNG = np.random.default_rng(3)
_ERF = np.vectorize(math.erf)


def _gelu(x: np.ndarray) -> np.ndarray:
    return x * 0.5 * (1 + _ERF(x / math.sqrt(2)))


def _fast_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


CASES = {
    "Gelu": (_gelu, {}, ["Y_grad", "X"]),
    "Mish": (lambda x: x * np.tanh(np.log1p(np.exp(x))), {}, ["X", "Y", "Y_grad"]),
    "Softsign": (lambda x: x / (1 + np.abs(x)), {}, ["X", "Y_grad"]),
    "Cbrt": (np.cbrt, {}, ["Y_grad", "Y"]),
    "Log1p": (np.log1p, {}, ["X", "Y_grad"]),
    "Reciprocal": (lambda x: 1 / x, {}, ["Y", "Y_grad"]),
}


def _input(op_type: str) -> np.ndarray:
    x = RNG.standard_normal((3, 4))
    if op_type in ("Log1p", "Reciprocal", "Cbrt"):
        x = np.abs(x) + 0.5  # away from log1p's pole, 1/x's and cbrt's infinite slope at 0
    return x.astype(np.float32)


@pytest.mark.parametrize("op_type", sorted(CASES))
def test_forward_gradient_wiring_and_numeric_gradient(op_type: str) -> None:
    reference, args, grad_inputs = CASES[op_type]
    x = _input(op_type)
    op = CreateOperator(op_type, ["X"], ["Y"], **args)
    (y,) = run_op(op, [x])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    ops, g_in = build_gradient(op, ["Y_grad"])
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (f"{op_type}Gradient", grad_inputs, ["X_grad"])]
    check_gradient(op, [x.astype(np.float64)])


def test_fast_gelu_and_its_gradient() -> None:
    x = RNG.standard_normal((5,)).astype(np.float32)
    op = CreateOperator("Gelu", ["X"], ["Y"], fast_gelu=1)
    np.testing.assert_allclose(run_op(op, [x])[0], _fast_gelu(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)
    check_gradient(op, [x.astype(np.float64)])
