"""gradient_checker: GradientChecker on single ops, NetGradientChecker on nets."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, workspace
from dpgraph.gradient_checker import GradientChecker, NetGradientChecker, getGradientForOp


def test_get_gradient_for_op_names_output_grads() -> None:
    op = core.CreateOperator("Relu", ["X"], ["Y"])
    ops, g_input = getGradientForOp(op)
    assert [o.type for o in ops] == ["ReluGradient"]
    assert "Y_grad" in ops[0].input
    assert str(g_input[0]) == "X_grad"


@pytest.mark.parametrize("op_type", ["Tanh", "Sigmoid", "Exp"])
def test_check_simple_passes_on_correct_gradients(op_type: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    checker = GradientChecker(stepsize=0.005, threshold=0.01)
    ok, grad, estimate = checker.CheckSimple(core.CreateOperator(op_type, ["X"], ["Y"]),
                                             [x], 0, [0])
    assert ok
    assert grad.shape == estimate.shape == x.shape
    # the checker ran in its own workspace and switched back
    assert workspace.CurrentWorkspace() == "default"
    assert not workspace.HasBlob("X")


def test_check_simple_estimate_matches_analytic_loss_gradient() -> None:
    # loss = 0.5 * sum((2x)^2) -> dloss/dx = 4x, i.e. grad of Scale(2) fed with y = 2x
    x = np.array([0.5, -1.0, 2.0], np.float32)
    op = core.CreateOperator("Scale", ["X"], ["Y"], scale=2.0)
    ok, grad, estimate = GradientChecker(0.01, 0.01).CheckSimple(op, [x], 0, [0])
    assert ok
    np.testing.assert_allclose(estimate, 4 * x, rtol=1e-3)


def test_check_simple_detects_a_wrong_gradient() -> None:
    from dpgraph.autodiff import GRADIENT_REGISTRY

    op = core.CreateOperator("Relu", ["X"], ["Y"])
    grad_ops, _ = GRADIENT_REGISTRY.GetGradientForOp(op, ["Y_grad"])
    wrong = [core.CreateOperator("Scale", ["Y_grad"], ["X_grad"], scale=3.0)]
    x = np.array([1.0, 2.0, 3.0], np.float32)
    ok, grad, estimate = GradientChecker(0.01, 0.01).CheckSimple(op, [x], 0, [0],
                                                                 grad_ops=wrong)
    assert grad_ops  # the real gradient exists; the substituted one is wrong
    assert not ok
    np.testing.assert_allclose(grad, 3 * x)
    np.testing.assert_allclose(estimate, x, rtol=1e-3)


def test_net_gradient_checker_check_and_compare() -> None:
    net = core.Net("gc_net")
    net.Mul(["X", "W"], "Y")
    net.Tanh("Y", "Z")
    rng = np.random.default_rng(1)
    values = {"X": rng.standard_normal(4).astype(np.float32),
              "W": rng.standard_normal(4).astype(np.float32)}
    mean, biggest = NetGradientChecker.Check(net, ["Z"], values, "X", step_size=1e-2,
                                             threshold=0.05, print_net=False)
    assert 0 <= mean <= biggest < 0.05
    other = core.Net("gc_net2")
    other.Mul(["W", "X"], "Y")
    other.Tanh("Y", "Z")
    NetGradientChecker.CompareNets([net, other], [["Z"], ["Z"]], [0], ["X", "W"],
                                   input_values=values, threshold=1e-6)
    broken = core.Net("gc_net3")
    broken.Add(["X", "W"], "Y")
    broken.Tanh("Y", "Z")
    with pytest.raises(AssertionError):
        NetGradientChecker.CompareNets([net, broken], [["Z"], ["Z"]], [0], ["X"],
                                       input_values=values)
