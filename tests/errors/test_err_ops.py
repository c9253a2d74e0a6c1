"""Bad inputs to operator kernels: a typed OperatorError that is also the kernel's error
type (ShapeError/ArgumentError, both ValueError; and RuntimeError as Caffe2's enforce), a
message naming the op, its blobs and device and saying what to do, and outputs untouched."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _error_checks import expect_error

from dpgraph import core, workspace
from dpgraph.errors import (
    ArgumentError,
    BlobNotFoundError,
    OperatorDefError,
    OperatorError,
    ShapeError,
    UnregisteredOperatorError,
)

F32 = np.float32
SENTINEL = np.full((1,), 42.0, F32)


def run_failing(op_type: str, inputs: list[str], outputs: list[str], feeds: dict[str, Any],
                error_type: type = ShapeError, *fragments: str, **args: Any) -> BaseException:
    """Feed, run one op that must fail, and check the error and that nothing changed."""
    for name, value in feeds.items():
        workspace.FeedBlob(name, value)
    for name in outputs:
        if name not in feeds:
            workspace.FeedBlob(name, SENTINEL)
    before = {name: workspace.FetchBlob(name) for name in workspace.Blobs()}
    op = core.CreateOperator(op_type, inputs, outputs, **args)
    error = expect_error(lambda: workspace.RunOperatorOnce(op), OperatorError,
                         (error_type, RuntimeError, ValueError), op_type, "cpu_0",
                         *fragments)
    assert isinstance(error, error_type)
    after = {name: workspace.FetchBlob(name) for name in workspace.Blobs()}
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    return error


def conv_feeds(x: tuple[int, ...] = (1, 3, 8, 8), w: tuple[int, ...] = (2, 3, 3, 3),
               b: int = 2) -> dict[str, Any]:
    return {"x": np.ones(x, F32), "w": np.ones(w, F32), "b": np.ones(b, F32)}


def test_fc_with_mismatched_inner_dims() -> None:
    feeds = {"x": np.ones((2, 3), F32), "w": np.ones((4, 5), F32), "b": np.ones(4, F32)}
    run_failing("FC", ["x", "w", "b"], ["y"], feeds, ShapeError, "'x'", "(4, 5)", "axis")


def test_fc_with_wrong_bias_length() -> None:
    feeds = {"x": np.ones((2, 3), F32), "w": np.ones((4, 3), F32), "b": np.ones(5, F32)}
    run_failing("FC", ["x", "w", "b"], ["y"], feeds, ShapeError, "bias 'b'")


def test_conv_kernel_larger_than_input() -> None:
    feeds = conv_feeds(x=(1, 3, 4, 4), w=(2, 3, 5, 5))
    run_failing("Conv", ["x", "w", "b"], ["y"], feeds, ShapeError, "kernel (5, 5)",
                "larger than the padded input", "padding", kernel=5)


def test_conv_with_wrong_bias_length() -> None:
    run_failing("Conv", ["x", "w", "b"], ["y"], conv_feeds(b=3), ShapeError, "bias 'b'",
                "2 output channels", kernel=3)


@pytest.mark.parametrize("args, error_type, fragment", [
    ({"kernel": 3, "stride": 0}, ArgumentError, "stride=[0, 0]"),
    ({"kernel": 3, "pad": -1}, ArgumentError, "pads=[-1, -1, -1, -1]"),
    ({"kernel": 3, "order": "NCWH"}, ArgumentError, "'NCWH'"),
    ({"kernel": 5}, ShapeError, "does not match kernel"),
])
def test_conv_with_bad_geometry_arguments(args: dict[str, Any], error_type: type,
                                          fragment: str) -> None:
    run_failing("Conv", ["x", "w", "b"], ["y"], conv_feeds(), error_type, fragment, **args)


def test_conv_with_channel_mismatch_or_wrong_order() -> None:
    run_failing("Conv", ["x", "w", "b"], ["y"], conv_feeds(w=(2, 4, 3, 3)), ShapeError,
                "input channels", "group=1", kernel=3)
    run_failing("Conv", ["x", "w", "b"], ["y"], conv_feeds(), ShapeError, "input channels",
                kernel=3, order="NHWC")


def test_softmax_with_loss_float_label() -> None:
    feeds = {"x": np.ones((2, 3), F32), "label": np.array([0.0, 1.0], F32)}
    run_failing("SoftmaxWithLoss", ["x", "label"], ["p", "loss"], feeds, ShapeError,
                "label 'label'", "float32", "astype(np.int32)")


def test_softmax_with_loss_label_out_of_range_or_wrong_length() -> None:
    x = np.ones((2, 3), F32)
    run_failing("SoftmaxWithLoss", ["x", "label"], ["p", "loss"],
                {"x": x, "label": np.array([0, 7], np.int32)}, ShapeError, "[0, 3)")
    run_failing("SoftmaxWithLoss", ["x", "label"], ["p", "loss"],
                {"x": x, "label": np.array([0, 1, 2], np.int32)}, ShapeError, "one per row")


@pytest.mark.parametrize("op_type, x_shape, outputs", [
    ("Accuracy", (2, 3), ["acc"]),
    ("LabelCrossEntropy", (2, 3), ["xent"]),
    ("SpatialSoftmaxWithLoss", (2, 3, 2, 2), ["p", "loss"]),
])
def test_float_labels_for_other_classification_ops(op_type: str, x_shape: tuple[int, ...],
                                                  outputs: list[str]) -> None:
    label_shape = (x_shape[0], *x_shape[2:])
    feeds = {"x": np.full(x_shape, 1 / 3, F32), "label": np.zeros(label_shape, F32)}
    run_failing(op_type, ["x", "label"], outputs, feeds, ShapeError, "integer class ids")


def test_concat_and_split_mismatches() -> None:
    run_failing("Concat", ["a", "b"], ["y", "split"],
                {"a": np.ones((2, 3), F32), "b": np.ones((3, 3), F32)}, ShapeError,
                "[(2, 3), (3, 3)]", axis=1)
    run_failing("Split", ["a"], ["y", "z"], {"a": np.ones((2, 3), F32)}, ShapeError,
                "split sizes [1, 1]", "sum to 3", axis=1, split=[1, 1])


def test_gather_out_of_range_and_float_indices() -> None:
    data = np.ones((4, 3), F32)
    run_failing("Gather", ["d", "i"], ["y"], {"d": data, "i": np.array([0, 9], np.int32)},
                ShapeError, "[0, 4)", "[0, 9]")
    run_failing("Gather", ["d", "i"], ["y"], {"d": data, "i": np.array([0.0, 1.0], F32)},
                ShapeError, "int32 or int64", "float32")


def test_sparse_update_with_float_indices() -> None:
    feeds = {"g": np.ones((2, 3), F32), "m": np.ones((4, 3), F32), "lr": np.ones(1, F32),
             "p": np.ones((4, 3), F32), "i": np.array([0.0, 1.0], F32)}
    run_failing("SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["g", "m", "p"],
                feeds, ShapeError, "int32 or int64")


def test_reshape_to_incompatible_shape() -> None:
    feeds = {"d": np.ones((4, 3), F32)}
    run_failing("Reshape", ["d"], ["y", "old"], feeds, ShapeError, "[5, -1]", "12 elements",
                shape=[5, -1])
    run_failing("Reshape", ["d"], ["y", "old"], feeds, ArgumentError, "at most one -1",
                shape=[-1, -1])


@pytest.mark.parametrize("op_type", ["MomentumSGDUpdate", "FP32MomentumSGDUpdate"])
def test_momentum_sgd_update_with_mismatched_shapes(op_type: str) -> None:
    feeds = {"g": np.ones((4, 3), F32), "m": np.ones((4, 2), F32), "lr": np.ones(1, F32),
             "p": np.ones((4, 3), F32)}
    run_failing(op_type, ["g", "m", "lr", "p"], ["g", "m", "p"], feeds, ShapeError,
                "'g' (4, 3)", "'m' (4, 2)", "same shape")


def test_dense_optimizer_does_not_broadcast_a_wrong_gradient() -> None:
    feeds = {"w": np.ones((4, 3), F32), "m1": np.zeros((4, 3), F32),
             "m2": np.zeros((4, 3), F32), "g": np.ones(3, F32), "lr": np.ones(1, F32),
             "it": np.zeros(1, np.int64)}
    run_failing("Adam", ["w", "m1", "m2", "g", "lr", "it"], ["w", "m1", "m2"], feeds,
                ShapeError, "'g' (3,)", "same shape")


def test_elementwise_shapes_that_do_not_broadcast() -> None:
    feeds = {"a": np.ones((2, 3), F32), "b": np.ones((3, 3), F32)}
    run_failing("Add", ["a", "b"], ["y"], feeds, ShapeError, "'a' (2, 3)", "'b' (3, 3)",
                "broadcast=1")
    run_failing("Sum", ["a", "b"], ["y"], feeds, ShapeError, "'b'", "(3, 3)", "one shape")
    run_failing("Add", ["a", "c"], ["y"], {**feeds, "c": np.ones(2, F32)}, ShapeError,
                "broadcast dimension mismatch", broadcast=1)


def test_learning_rate_with_unknown_policy() -> None:
    error = run_failing("LearningRate", ["it"], ["lr"], {"it": np.zeros(1, np.int64)},
                        ShapeError, "'bogus'", "use one of", base_lr=0.1, policy="bogus")
    assert "fixed" in str(error)


def test_missing_input_blob_names_blob_and_how_to_fix() -> None:
    run_failing("Relu", ["nope"], ["y"], {}, BlobNotFoundError, "'nope'", "FeedBlob")


def test_unknown_operator_type_suggests_the_right_one() -> None:
    workspace.FeedBlob("x", np.ones(2, F32))
    op = core.CreateOperator("Rellu", ["x"], ["y"])
    expect_error(lambda: workspace.RunOperatorOnce(op), UnregisteredOperatorError,
                 (AttributeError, RuntimeError), "'Rellu'", "Did you mean: Relu")
    assert not workspace.HasBlob("y")


def test_wrong_number_of_inputs_found_at_net_creation() -> None:
    net = core.Net("err_arity")
    net.FC(["x"], ["y"])
    expect_error(lambda: workspace.CreateNet(net), OperatorDefError, (RuntimeError, ValueError),
                 "FC takes 3 inputs, got 1", "'x'")
    assert workspace.Nets() == []


def test_operator_error_carries_op_blobs_device_and_cause() -> None:
    """The executor's wrapping names the op, each input's shape, dtype and device, and keeps
    the kernel's error chained and the op's identity as attributes."""
    workspace.FeedBlob("a", np.ones((2, 3), F32))
    op = core.CreateOperator("Transpose", ["a"], ["y"], axes=[0, 0])
    error = expect_error(lambda: workspace.RunOperatorOnce(op), OperatorError, ArgumentError,
                         "Transpose", "a ([2, 3] float32 on cpu_0)", "permutation")
    assert isinstance(error.__cause__, ArgumentError)
    assert isinstance(error, OperatorError)
    assert (error.op_type, error.op_index, error.device) == ("Transpose", 0, "cpu_0")


def test_raw_numpy_failure_gets_a_hint_naming_op_and_blobs() -> None:
    """Kernels without their own checks (here a gradient op fed mismatched blobs) fail inside
    numpy; the executor's wrapping still names the op, blobs and device and says what to do,
    and types numpy's failure as a ShapeError."""
    feeds = {"y": np.ones((2, 3), F32), "dy": np.ones((5, 7), F32)}
    error = run_failing("ReluGradient", ["y", "dy"], ["dx"], feeds, ValueError,
                        "y ([2, 3] float32 on cpu_0)", "dy ([5, 7] float32 on cpu_0)",
                        "hint:", "forward Relu op", "OPERATORS.lookup('ReluGradient')")
    # numpy's bare ValueError no longer leaks as the cause: it becomes a ShapeError (that
    # keeps numpy's error chained for debugging)
    assert isinstance(error, ShapeError) and isinstance(error.__cause__, ShapeError)
    assert type(error.__cause__.__cause__) is ValueError
