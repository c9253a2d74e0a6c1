"""The test-util modules Caffe2's optimizer tests import (``caffe2.python.optimizer_test_util``,
``caffe2.python.operator_test.adagrad_test_helper``): they resolve under the alias, pass for a
working optimizer and fail for a broken one."""

from __future__ import annotations

import functools
import importlib
import unittest

import numpy as np
import pytest

from dpgraph import core, optimizer, workspace
from dpgraph.compat import caffe2 as alias
from dpgraph.hypothesis_test_util import HypothesisTestCase, cpu_do
from dpgraph.operator_test.adagrad_test_helper import adagrad_sparse_test_helper, ref_adagrad
from dpgraph.optimizer_test_util import LRModificationTestBase, OptimizerTestBase
from dpgraph.test_util import TestCase


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def test_modules_resolve_under_the_alias():
    alias.install()
    try:
        util = importlib.import_module("caffe2.python.optimizer_test_util")
        helper = importlib.import_module("caffe2.python.operator_test.adagrad_test_helper")
    finally:
        alias.uninstall()
    assert util.OptimizerTestBase is OptimizerTestBase
    assert helper.ref_adagrad is ref_adagrad


class _Sgd(OptimizerTestBase, LRModificationTestBase, TestCase):
    __test__ = False  # run by the tests below, not collected by pytest
    rate = 0.1

    def build_optimizer(self, model, **kwargs):
        self._skip_gpu = False
        return optimizer.build_sgd(model, base_learning_rate=self.rate, **kwargs)

    def check_optimizer(self, opt):
        self.assertTrue(opt.get_auxiliary_parameters().shared)
        self.assertFalse(opt.get_auxiliary_parameters().local)


class _Frozen(_Sgd):
    rate = 1e-6  # learns nothing in 2000 steps


def _run(case: type, name: str) -> unittest.TestResult:
    result = unittest.TestResult()
    case(name).run(result)
    return result


@pytest.mark.parametrize("name", ["testDense", "testSparse",
                                  "test_global_norm_based_gradient_clipping",
                                  "test_lr_injection"])
def test_working_optimizer_passes(name):
    result = _run(_Sgd, name)
    assert result.wasSuccessful(), result.failures + result.errors
    if name == "test_lr_injection":
        optimizer.set_lr_injection(1)


@pytest.mark.parametrize("name", ["testDense", "testSparse"])
def test_optimizer_that_does_not_learn_fails(name):
    result = _run(_Frozen, name)
    assert len(result.failures) == 1 and "Not equal to tolerance" in result.failures[0][1]


def test_gpu_dense_skips_without_gpus():
    workspace.SetVirtualGpus(0)
    result = _run(_Sgd, "testGPUDense")
    assert len(result.skipped) == 1


def test_gpu_dense_runs_on_a_virtual_gpu():
    workspace.SetVirtualGpus(1)
    try:
        result = _run(_Sgd, "testGPUDense")
        assert result.wasSuccessful() and not result.skipped, result.errors
    finally:
        workspace.SetVirtualGpus(0)


def test_ref_adagrad_formulas():
    w, h, g = np.array([1.0, -2.0]), np.array([0.5, 0.0]), np.array([0.3, 0.1])
    lr, eps, wd = 0.2, 0.1, 0.5
    new_w, new_h, eff, upd = ref_adagrad(w, h, g, lr, eps, weight_decay=wd,
                                         output_effective_lr_and_update=True)
    g2 = g + wd * w
    np.testing.assert_allclose(new_h, h + g2 ** 2, rtol=1e-6)
    np.testing.assert_allclose(eff, lr / (np.sqrt(h + g2 ** 2) + eps), rtol=1e-6)
    np.testing.assert_allclose(upd, eff * g2, rtol=1e-6)
    np.testing.assert_allclose(new_w, w + upd, rtol=1e-6)
    assert new_w.dtype == np.float32
    row_w, row_h = ref_adagrad(w, np.float32(0.5), g, lr, eps, row_wise=True,
                               weight_decay=wd, counter_halflife=4, count=2.0)
    g_row = g + 2 * wd * w  # weight decay scaled by halflife / count
    np.testing.assert_allclose(row_h, 0.5 + np.mean(g_row ** 2), rtol=1e-6)
    half = ref_adagrad(w, h, g, lr, eps, using_fp16=True)
    assert half[0].dtype == np.float16


class _Checks(HypothesisTestCase):
    def runTest(self):  # pragma: no cover - only the assertion helpers are used
        pass


@pytest.mark.parametrize("row_wise", [False, True])
def test_sparse_helper_accepts_the_kernel_and_rejects_a_wrong_reference(row_wise):
    np.random.seed(0)
    rng = np.random.RandomState(1)
    inputs = [rng.randn(6, 3).astype(np.float32) for _ in range(3)]
    ref = functools.partial(ref_adagrad, row_wise=row_wise)
    adagrad_sparse_test_helper(_Checks(), inputs, 0.1, 0.01, None, ref, cpu_do, [],
                               row_wise=row_wise)

    def wrong(*args, **kwargs):
        new_w, new_h = ref(*args, **kwargs)
        return new_w + 1.0, new_h

    np.random.seed(0)  # the same rows are picked: at least one row is updated
    with pytest.raises(AssertionError):
        adagrad_sparse_test_helper(_Checks(), inputs, 0.1, 0.01, None, wrong, cpu_do, [],
                                   row_wise=row_wise)


def test_core_grad_map_is_checked():
    model = OptimizerTestBase._createDense(_Sgd("testDense"))[0]
    assert isinstance(model.param_to_grad[core.ScopedBlobReference("fc_w")],
                      core.BlobReference)
