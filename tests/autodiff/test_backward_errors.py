"""Version checks, StopGradient, missing gradients and the Python gradient registry."""

from __future__ import annotations

import pytest
from _autodiff_testops import assert_ops, op

from dpgraph import core
from dpgraph.autodiff import GetBackwardPass, GradientRegistry
from dpgraph.errors import (
    GradientError,
    NoGradientError,
    OperatorSchemaError,
    StopGradientError,
)
from dpgraph.ir.device import DeviceOption
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2


# --- SSA versions ----------------------------------------------------------------------------
def test_use_output_after_output_was_overwritten() -> None:
    ops = [op("UseOutput", "in", "hidden"), op("Direct", "hidden", "hidden"),
           op("UseOutput", "hidden", "out"), op("Direct", "out", "sink")]
    with pytest.raises(RuntimeError, match="version") as info:
        GetBackwardPass(ops, {"sink": "sink_grad"})
    assert isinstance(info.value, GradientError)
    assert "'hidden'" in str(info.value) and "UseOutput" in str(info.value)


def test_use_input_after_input_was_overwritten() -> None:
    ops = [op("UseInput", "in", "out"), op("Direct", "in", "in")]
    with pytest.raises(GradientError, match="version"):
        GetBackwardPass(ops, {"out": "out_grad"})


def test_gradient_version_mismatch() -> None:
    ops = [op("Direct", "x", "x"), op("Direct", "y", "x"), op("Direct", "x", "y")]
    with pytest.raises(RuntimeError, match="version") as info:
        GetBackwardPass(ops, {"y": "y_grad"})
    assert "x_grad" in str(info.value)


def test_gradient_op_reading_an_unrelated_blob_is_refused() -> None:
    registry = GradientRegistry()

    @registry.RegisterGradient("PyReadsOther")
    def _reads_other(fwd: caffe2_pb2.OperatorDef, g_output: list) -> tuple:
        grad = CreateOperator("PyReadsOtherGradient", [g_output[0], "unrelated"], ["x_grad"])
        return [grad], ["x_grad"]

    ops = [op("PyReadsOther", "x", "y")]
    with pytest.raises(GradientError, match="'unrelated'"):
        registry.GetBackwardPass(ops, {"y": "y_grad"})


# --- StopGradient ----------------------------------------------------------------------------
def test_stop_gradient_stops_propagation() -> None:
    ops = [op("Direct", "in", "hidden"), op("StopGradient", "hidden", "hidden2"),
           op("Direct", "hidden2", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", "hidden2_grad")])
    assert grad_map == {"out": "out_grad", "hidden2": "hidden2_grad"}


def test_orphan_stop_gradient_output_is_a_value_error() -> None:
    ops = [op("Direct", "in", "hidden"), op("StopGradient", "hidden", "auto_blob"),
           op("Direct", "hidden", "out")]
    with pytest.raises(ValueError, match="auto_blob") as info:
        GetBackwardPass(ops, {"out": "out_grad"})
    assert isinstance(info.value, StopGradientError)


def test_in_place_stop_gradient() -> None:
    ops = [op("Direct", "in", "hidden"), op("StopGradient", "hidden", "hidden"),
           op("Direct", "hidden", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", "hidden_grad")])
    assert grad_map == {"out": "out_grad"}


def test_stop_gradient_with_multi_use_operators() -> None:
    ops = [op("Direct", "in", "hidden"), op("Direct", "hidden", "hidden2"),
           op("StopGradient", "hidden", "hidden3"), op("Direct", ["hidden2", "hidden3"], "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert_ops(grad_ops, [("DirectGradient", "out_grad", ["hidden2_grad", "hidden3_grad"]),
                          ("DirectGradient", "hidden2_grad", "hidden_grad"),
                          ("DirectGradient", "hidden_grad", "in_grad")])
    assert grad_map == {"out": "out_grad", "hidden2": "hidden2_grad",
                        "hidden3": "hidden3_grad", "hidden": "hidden_grad", "in": "in_grad"}


# --- missing gradients -----------------------------------------------------------------------
def test_op_without_gradient_names_op_blob_and_similar_types() -> None:
    ops = [op("Direct", "in", "hidden"), op("Directt", "hidden", "out")]
    with pytest.raises(NoGradientError) as info:
        GetBackwardPass(ops, {"out": "out_grad"})
    message = str(info.value)
    assert "Directt" in message and "'out'" in message and "Did you mean" in message
    assert "Direct," in message or "Direct?" in message


def test_op_without_gradient_is_fine_when_no_gradient_reaches_it() -> None:
    ops = [op("Directt", "in", "side"), op("Direct", "in", "out")]
    grad_ops, grad_map = GetBackwardPass(ops, {"out": "out_grad"})
    assert [o.type for o in grad_ops] == ["DirectGradient"]
    assert "side" not in grad_map


def test_declared_no_gradient_op_stops_the_gradient() -> None:
    registry = GradientRegistry()
    registry.NoGradient("Directt")
    ops = [op("Direct", "in", "hidden"), op("Directt", "hidden", "out")]
    grad_ops, grad_map = registry.GetBackwardPass(ops, {"out": "out_grad"})
    assert grad_ops == [] and dict(grad_map) == {"out": "out_grad"}


def test_unregistered_op_needing_a_gradient() -> None:
    ops = [op("NotAnOpAtAll", "in", "out")]
    with pytest.raises(NoGradientError, match="NotAnOpAtAll.*not even a registered"):
        GetBackwardPass(ops, {"out": "out_grad"})


def test_incorrect_operator_fails_schema_check() -> None:
    ops = [CreateOperator("Mul", ["x"], ["y"])]
    with pytest.raises(GradientError, match="did not pass schema checking.*Mul takes 2 inputs"):
        GetBackwardPass(ops, ["y"])


def test_zero_gradient_is_always_visited() -> None:
    ops = [op("TestTwoOutputs", "x", ["y", "cell"]), op("ZeroGradient", "cell", [])]
    grad_ops, grad_map = GetBackwardPass(ops, {"y": "y_grad"})
    assert_ops(grad_ops, [("ConstantFill", "cell", "cell_grad"),
                          ("TestTwoOutputsGradient", ["y_grad", "cell_grad"], "x_grad")])
    assert grad_map["cell"] == "cell_grad"


def test_missing_cell_gradient_without_zero_gradient_raises() -> None:
    ops = [op("TestTwoOutputs", "x", ["y", "cell"])]
    with pytest.raises(GradientError, match="'cell' has no gradient"):
        GetBackwardPass(ops, {"y": "y_grad"})


def test_constant_fill_with_dynamic_shape_input_creates_no_sum() -> None:
    ops = [op("Direct", "x", "x2"), op("ConstantFill", "x2", "x3", value=1.0),
           op("Add", ["x2", "x3"], "y")]
    grad_ops, grad_map = GetBackwardPass(ops, ["y"])
    assert "Sum" not in [o.type for o in grad_ops]
    # x2's gradient is y's (pass-through Add) or AddGradient's x2_grad (final Caffe2 Add)
    assert grad_map["x"] == "x_grad" and grad_map["x2"] in ("y_autogen_grad", "x2_grad")


# --- accumulation errors ---------------------------------------------------------------------
def test_mixed_dense_and_sparse_gradients_are_refused() -> None:
    ops = [op("Gather", ["x2", "x1"], "x4"), op("Direct", "x2", "x5"),
           op("Direct", ["x4", "x5"], "y")]
    with pytest.raises(GradientError, match="x2.*mix of sparse and dense"):
        GetBackwardPass(ops, {"y": "y_grad"})


def test_gradients_on_different_devices_are_refused() -> None:
    ops = [op("Direct", "in", "h1", DeviceOption(caffe2_pb2.CUDA, 0)),
           op("Direct", "in", "h2", DeviceOption(caffe2_pb2.CUDA, 1)),
           op("Direct", ["h1", "h2"], "out")]
    with pytest.raises(GradientError, match="same device option") as info:
        GetBackwardPass(ops, {"out": "out_grad"})
    assert "gpu_0" in str(info.value) and "gpu_1" in str(info.value)


def test_bad_ys_type() -> None:
    with pytest.raises(TypeError, match="ys should"):
        GetBackwardPass([op("Direct", "in", "out")], "out")


# --- Python registry -------------------------------------------------------------------------
def test_python_registered_maker_is_used_without_stamping() -> None:
    registry = GradientRegistry()
    gpu = DeviceOption(caffe2_pb2.CUDA, 1)

    @registry.RegisterGradient("PyOnlyOp")
    def _py_grad(fwd: caffe2_pb2.OperatorDef, g_output: list) -> tuple:
        grad = CreateOperator("PyOnlyOpGradient", [g_output[0]], [fwd.input[0] + "_grad"])
        return grad, [fwd.input[0] + "_grad"]

    ops = [op("PyOnlyOp", "x", "y", gpu, alpha=2.0)]
    grad_ops, grad_map = registry.GetBackwardPass(ops, {"y": "y_grad"})
    assert_ops(grad_ops, [("PyOnlyOpGradient", "y_grad", "x_grad")])
    assert not grad_ops[0].is_gradient_op and not grad_ops[0].HasField("device_option")
    assert list(grad_ops[0].arg) == []
    assert grad_map["x"] == "x_grad"
    with pytest.raises(OperatorSchemaError, match="'PyOnlyOp' is already registered"):
        registry.RegisterGradient("PyOnlyOp")(_py_grad)


def test_get_gradient_for_op_prefers_the_schema_maker() -> None:
    registry = GradientRegistry()
    registry.RegisterGradient("Direct")(lambda fwd, g: ([], [None]))
    grad_ops, g_input = registry.GetGradientForOp(op("Direct", "a", "b"), ["b_grad"])
    assert_ops(grad_ops, [("DirectGradient", "b_grad", "a_grad")])
    assert g_input == ["a_grad"]


def test_core_facade_exports() -> None:
    assert hasattr(core.GradientRegistry, "RegisterGradient")
    ops, g_input = core.GradientRegistry.GetGradientForOp(op("Direct", "a", "b"), ["b_grad"])
    assert g_input == ["a_grad"] and ops[0].is_gradient_op
    grad_ops, _ = core.IR([op("Direct", "a", "b")]).GetBackwardPass({"b": "b_grad"})
    assert len(grad_ops) == 1
