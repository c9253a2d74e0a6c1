"""Mix-in test cases every optimizer builder is checked with (Caffe2's ``optimizer_test_util``).

A test class mixes one or both bases into a ``unittest.TestCase`` and supplies
``build_optimizer(model, **kwargs)`` (returning the optimizer) and
``check_optimizer(optimizer)``; it may set ``self._skip_gpu`` in ``build_optimizer``::

    class TestSgd(OptimizerTestBase, LRModificationTestBase, TestCase):
        def build_optimizer(self, model, **kwargs):
            self._skip_gpu = False
            return build_sgd(model, base_learning_rate=0.1, **kwargs)

:class:`OptimizerTestBase` learns a linear model whose exact weights are known
(``[2, 6, 5, 0, 1]``) with a dense FC and with a sparse ``Gather`` of duplicated indices;
:class:`LRModificationTestBase` checks global-norm gradient clipping and lr injection.
"""

from __future__ import annotations

import unittest
from typing import Any

import numpy as np

from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.device import CUDA, DeviceOption
from dpgraph.ir.scope import DeviceScope
from dpgraph.modeling.brew import brew
from dpgraph.modeling.cnn import CNNModelHelper
from dpgraph.modeling.initializers import Initializer, PseudoFP16Initializer
from dpgraph.modeling.model_helper import ModelHelper
from dpgraph.modeling.optimizer.build import get_lr_injection, set_lr_injection
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as ws
from dpgraph.runtime.devices import NumGpuDevices

FLOAT = caffe2_pb2.TensorProto.FLOAT
FLOAT16 = caffe2_pb2.TensorProto.FLOAT16
#: The weights the linear models are trained towards.
PERFECT_MODEL = (2.0, 6.0, 5.0, 0.0, 1.0)
ITERATIONS = 2000
#: Each weight of the sparse model is reachable through this many feature indices.
DUPLICATION = 2


def _dataset(columns: int, dtype: Any = np.float32) -> np.ndarray:
    """20 rows of random 0/1 features, the same ones every run (seed 123)."""
    np.random.seed(123)
    return np.random.randint(2, size=(20, columns)).astype(dtype)


def _add_loss(model: Any, out: Any) -> Any:
    """Squared distance to ``label``, averaged into ``avg_loss``; returns the grad map."""
    distance = model.SquaredL2Distance([out, "label"])
    loss = model.AveragedLoss(distance, "avg_loss")
    return model.AddGradientOperators([loss])


def _feed_row(data: np.ndarray, label: np.ndarray, row: int) -> None:
    ws.FeedBlob("data", data[row])
    ws.FeedBlob("label", label[row])


def _start(model: Any) -> None:
    ws.RunNetOnce(model.param_init_net)
    ws.CreateNet(model.net, True)


def _run(model: Any) -> None:
    ws.RunNet(model.net.Proto().name)


class OptimizerTestBase:
    """Abstract mix-in (not a TestCase, not named ``Test*``): dense, GPU-placed and sparse
    training of a known linear model must reach its weights to 1e-2."""

    _skip_gpu = False

    def _createDense(self, dtype: int = FLOAT) -> tuple[Any, np.ndarray, np.ndarray,
                                                        np.ndarray]:
        """``fc`` (5 -> 1, axis 0, constant-filled) and its loss; returns
        ``(model, perfect_model, data, label)``."""
        perfect_model = np.array(PERFECT_MODEL, dtype=np.float32)
        half = dtype == FLOAT16
        data = _dataset(perfect_model.size, np.float16 if half else np.float32)
        label = np.dot(data, perfect_model)[:, np.newaxis]
        initializer = PseudoFP16Initializer if half else Initializer
        model = ModelHelper(name="test", arg_scope={"order": "NCHW"})
        out = brew.fc(model, "data", "fc", perfect_model.size, 1, ("ConstantFill", {}),
                      ("ConstantFill", {}), axis=0, WeightInitializer=initializer,
                      BiasInitializer=initializer)
        if half:
            out = model.HalfToFloat(out, out + "_fp32")
        grad_map = _add_loss(model, out)
        self.assertIsInstance(grad_map["fc_w"], BlobReference)  # type: ignore[attr-defined]
        return model, perfect_model, data, label

    def testDense(self) -> None:
        model, perfect_model, data, label = self._createDense()
        optimizer = self.build_optimizer(model)  # type: ignore[attr-defined]
        _feed_row(data, label, 0)
        _start(model)
        for _ in range(ITERATIONS):
            _feed_row(data, label, np.random.randint(data.shape[0]))
            _run(model)
        np.testing.assert_allclose(perfect_model[np.newaxis, :], ws.FetchBlob("fc_w"),
                                   atol=1e-2)
        self.check_optimizer(optimizer)  # type: ignore[attr-defined]

    def testGPUDense(self, dtype: int = FLOAT) -> None:
        """The optimizer is built over a model with GPU ops and a CPU tail; unless the
        test sets ``_skip_gpu`` the net must run once."""
        if NumGpuDevices() == 0:
            raise unittest.SkipTest("No gpu support")
        with DeviceScope(DeviceOption(CUDA, 0)):
            model, _perfect, data, label = self._createDense(dtype)
            if dtype == FLOAT16:
                model.CopyGPUToCPU(model.HalfToFloat("fc", "fc_fp32_for_host"), "fc_cpu")
            else:
                model.CopyGPUToCPU("fc", "fc_cpu")
            _feed_row(data, label, 0)
        brew.fc(model, "fc_cpu", "fc2", dim_in=1, dim_out=10, axis=0)
        self.build_optimizer(model)  # type: ignore[attr-defined]
        if self._skip_gpu:
            return
        _start(model)
        _run(model)

    def testSparse(self) -> None:
        """``w`` (5 zeros) read through ``Gather`` with every weight behind two feature
        indices, so a row may count a weight twice; int32 and int64 indices."""
        perfect_model = np.array(PERFECT_MODEL, dtype=np.float32)
        data = _dataset(perfect_model.size * DUPLICATION)
        label = np.dot(data, np.repeat(perfect_model, DUPLICATION))
        model = CNNModelHelper("NCHW", name="test")
        w = model.param_init_net.ConstantFill([], "w", shape=[perfect_model.size], value=0.0)
        model.params.append(w)
        picked = model.net.Gather([w, "indices"], "gather")
        grad_map = _add_loss(model, model.ReduceFrontSum(picked, "sum"))
        self.assertIsInstance(grad_map["w"], GradientSlice)  # type: ignore[attr-defined]
        optimizer = self.build_optimizer(model)  # type: ignore[attr-defined]
        ws.CreateBlob("indices")
        ws.CreateBlob("label")
        feature_of = np.repeat(np.arange(perfect_model.size), DUPLICATION)
        for indices_type in (np.int32, np.int64):
            _start(model)
            for _ in range(ITERATIONS):
                row = np.random.randint(data.shape[0])
                indices = feature_of[data[row] == 1]
                if indices.size == 0:
                    continue
                ws.FeedBlob("indices", indices.reshape(-1).astype(indices_type))
                ws.FeedBlob("label", np.array(label[row], dtype=np.float32))
                _run(model)
            np.testing.assert_allclose(perfect_model, ws.FetchBlob("w"), atol=1e-2)
        self.check_optimizer(optimizer)  # type: ignore[attr-defined]


class LRModificationTestBase:
    """Abstract mix-in: global-norm gradient clipping and learning-rate injection."""

    def _gradient_ratio_reference(self, model: Any, params: list[Any],
                                  max_gradient_norm: float) -> Any:
        """``clip / max(clip, global norm of the params' gradients)``."""
        squared = 0.0
        for param in params:
            grad = model.param_to_grad[param]
            if isinstance(grad, GradientSlice):
                grad = grad.values
            squared += float(np.linalg.norm(ws.FetchBlob(grad))) ** 2
        return max_gradient_norm / np.maximum(max_gradient_norm, np.sqrt(squared))

    def test_global_norm_based_gradient_clipping(self) -> None:
        max_gradient_norm = 1.0
        model, _perfect, data, label = self._createDense()  # type: ignore[attr-defined]
        opt = self.build_optimizer(  # type: ignore[attr-defined]
            model, max_gradient_norm=max_gradient_norm)
        params = [p for p in model.GetParams(top_scope=True)
                  if p in model.param_to_grad
                  and not isinstance(model.param_to_grad[p], GradientSlice)]
        _feed_row(data, label, 0)
        _start(model)
        self.assertIsNotNone(opt._lr_multiplier)  # type: ignore[attr-defined]
        _feed_row(data, label, np.random.randint(data.shape[0]))
        _run(model)
        reference = self._gradient_ratio_reference(model, params, max_gradient_norm)
        norm_ratio = ws.FetchBlob("norm_clipped_grad_update/norm_ratio")
        np.testing.assert_almost_equal(norm_ratio, reference)
        self.assertTrue(reference < 1.0,  # type: ignore[attr-defined]
                        "Bad test, gradient not being scaled.")

    def test_lr_injection(self) -> None:
        model, _perfect, data, label = self._createDense()  # type: ignore[attr-defined]
        opt = self.build_optimizer(  # type: ignore[attr-defined]
            model, max_gradient_norm=1, allow_lr_injection=True)
        _feed_row(data, label, 0)
        _start(model)
        self.assertIsNotNone(opt._lr_multiplier)  # type: ignore[attr-defined]
        self.assertEqual(get_lr_injection(), 1)  # type: ignore[attr-defined]
        set_lr_injection(0)
        self.assertEqual(get_lr_injection(), 0)  # type: ignore[attr-defined]
        # the injection (0) and the norm ratio both feed lr_multiplier
        _run(model)
        self.assertEqual(ws.FetchBlob("lr_multiplier"), 0)  # type: ignore[attr-defined]
