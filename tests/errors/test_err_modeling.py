"""Misuse of ModelHelper, brew helpers, autodiff and optimizers: typed errors (ModelError
is an AssertionError as in Caffe2), messages naming the helper/blob and the fix, and the
model exactly as before the failing call."""

from __future__ import annotations

from typing import Any

import pytest
from _error_checks import expect_error

from dpgraph import brew, memonger, model_helper, optimizer
from dpgraph.errors import (
    BlobNameError,
    GradientError,
    HelperError,
    MemongerError,
    ModelConfigError,
    ModelError,
    ModelStateError,
    NoGradientError,
)
from dpgraph.modeling.initializers import Initializer


def fingerprint(model: Any) -> dict[str, Any]:
    return {
        "net": model.net.Proto().SerializeToString(),
        "init": model.param_init_net.Proto().SerializeToString(),
        "params": [str(p) for p in model.params],
        "param_to_grad": {str(k): str(v) for k, v in model.param_to_grad.items()},
        "gradient_ops_added": model.gradient_ops_added,
        "attrs": sorted(vars(model)),
    }


def fc_model(name: str, with_loss: bool = True) -> tuple[Any, Any]:
    model = model_helper.ModelHelper(name=name)
    fc = brew.fc(model, "data", "fc", dim_in=3, dim_out=4)
    return model, (model.net.AveragedLoss(fc, "loss") if with_loss else fc)


def unchanged(model: Any, call: Any, *args: Any) -> BaseException:
    before = fingerprint(model)
    error = expect_error(call, *args)
    assert fingerprint(model) == before
    return error


@pytest.mark.parametrize("kwargs, fragment", [
    ({"dim_in": 0, "dim_out": 4}, "dim_in must be a positive integer, got 0"),
    ({"dim_in": 3, "dim_out": -4}, "dim_out must be a positive integer, got -4"),
    ({"dim_in": "3", "dim_out": 4}, "got '3'"),
])
def test_brew_fc_with_bad_dims(kwargs: dict[str, Any], fragment: str) -> None:
    model = model_helper.ModelHelper(name="err_fc")
    unchanged(model, lambda: brew.fc(model, "data", "fc", **kwargs), ModelConfigError,
              (AssertionError, ValueError), "brew.fc", fragment)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"kernel": 3, "order": "NCWH"}, "'NCWH'"),
    ({"kernel": 0}, "kernel must be a positive integer"),
    ({"kernel": 3, "group": 2}, "dim_in=3 is not divisible by group=2"),
])
def test_brew_conv_with_bad_order_kernel_or_group(kwargs: dict[str, Any], fragment: str) -> None:
    model = model_helper.ModelHelper(name="err_conv")
    unchanged(model, lambda: brew.conv(model, "data", "c", dim_in=3, dim_out=4, **kwargs),
              ModelConfigError, (AssertionError, ValueError), "brew.conv", fragment)


@pytest.mark.parametrize("weight_init", ["XavierFill", ("XavierFill",), (3, {})])
def test_brew_fc_with_a_malformed_initializer(weight_init: Any) -> None:
    model = model_helper.ModelHelper(name="err_init")
    unchanged(model, lambda: brew.fc(model, "data", "fc", 3, 4, weight_init=weight_init),
              ModelConfigError, (AssertionError, ValueError), "(op_name, kwargs)",
              repr(weight_init))


def test_unknown_brew_helper() -> None:
    model = model_helper.ModelHelper(name="err_helper")
    unchanged(model, lambda: brew.fcc(model, "data", "fc", 3, 4), HelperError,
              (AttributeError, AssertionError), "fcc")


def test_create_param_twice_with_another_shape() -> None:
    model = model_helper.ModelHelper(name="err_param")
    model.create_param("w", shape=[3, 4], initializer=Initializer("XavierFill"))
    unchanged(model, lambda: model.create_param("w", shape=[5, 4],
                                                initializer=Initializer("XavierFill")),
              ModelConfigError, AssertionError, "w", "[3, 4]", "[5, 4]", "another blob_out")
    model, _ = fc_model("err_fc_twice", with_loss=False)
    unchanged(model, lambda: brew.fc(model, "data", "fc", dim_in=5, dim_out=4),
              ModelConfigError, AssertionError, "fc_w", "[4, 5]")


def test_add_gradient_operators_twice() -> None:
    model, loss = fc_model("err_grad_twice")
    model.AddGradientOperators([loss])
    unchanged(model, lambda: model.AddGradientOperators([loss]), ModelStateError,
              (AssertionError, RuntimeError), "AddGradientOperators twice",
              "'err_grad_twice'", "new ModelHelper")


def test_failed_add_gradient_operators_can_be_retried() -> None:
    """A loss through an op without a gradient fails; the model is untouched, so a fixed
    call (here on the real loss) succeeds afterwards."""
    model, loss = fc_model("err_grad_retry")
    accuracy = model.net.Accuracy(["fc", "label"], "accuracy")
    unchanged(model, lambda: model.AddGradientOperators([accuracy]), NoGradientError,
              RuntimeError, "Accuracy", "'accuracy'", "StopGradient")
    grads = model.AddGradientOperators([loss])
    assert "fc_w" in {str(k) for k in grads} and model.gradient_ops_added


def test_add_gradient_operators_on_unknown_or_bad_losses() -> None:
    model, _ = fc_model("err_grad_unknown")
    unchanged(model, lambda: model.AddGradientOperators(["lossss"]), GradientError,
              RuntimeError, "'lossss'", model.net.Name(), "loss blob")
    unchanged(model, lambda: model.AddGradientOperators([3]), BlobNameError, TypeError,
              "int 3")


def test_get_devices_before_parallelize() -> None:
    model, _ = fc_model("err_devices")
    unchanged(model, model.GetDevices, ModelError, AssertionError, "data_parallel_model")


def test_optimizer_misuse_leaves_the_model_unchanged() -> None:
    model, loss = fc_model("err_opt")
    unchanged(model, lambda: optimizer.build_sgd(model, base_learning_rate=0.1),
              ModelStateError, AssertionError, "AddGradientOperators first")
    model.AddGradientOperators([loss])
    unchanged(model, lambda: optimizer.build_sgd(model, base_learning_rate=-0.1),
              ModelConfigError, AssertionError, "SgdOptimizer", "positive base learning rate",
              "-0.1")


def test_sparse_gradient_with_an_optimizer_that_has_no_sparse_update() -> None:
    model = model_helper.ModelHelper(name="err_sparse")
    table = model.create_param("emb", shape=[10, 4], initializer=Initializer("XavierFill"))
    rows = model.net.Gather([table, "idx"], "rows")
    model.AddGradientOperators([model.net.AveragedLoss(rows, "loss")])
    unchanged(model, lambda: optimizer.build_rms_prop(model, base_learning_rate=0.1),
              ModelConfigError, AssertionError, "RmsPropOptimizer", "sparse")


def test_memonger_on_something_that_is_not_a_net() -> None:
    expect_error(lambda: memonger.share_grad_blobs("notanet", ["b"], set(), ""),
                 MemongerError, AssertionError, "Net or NetDef", "str")
