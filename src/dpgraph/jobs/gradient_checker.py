"""Numerical gradient checks: Caffe2's ``gradient_checker`` (GradientChecker for one op,
NetGradientChecker for whole nets).

The loss of an op check is ``sum over checked outputs of 0.5 * sum(out ** 2)``, so the
gradient fed to each checked output ``o`` is ``o`` itself; the numeric estimate is a central
difference of that loss.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.errors import GradientError, ShapeError
from dpgraph.ir.analysis import InferOpBlobDevicesAsDict
from dpgraph.ir.blob import BlobReference, GradientSlice
from dpgraph.ir.operator import CreateOperator
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as ws_api


def getGradientForOp(op: caffe2_pb2.OperatorDef) -> tuple[list[Any], list[Any]]:
    """The gradient ops of ``op`` with every output's gradient named ``<output>_grad``."""
    from dpgraph.autodiff import GRADIENT_REGISTRY

    return GRADIENT_REGISTRY.GetGradientForOp(op, [o + "_grad" for o in op.output])


def _get_grad_blob(grad_map: dict[Any, Any], input_to_check: Any) -> np.ndarray:
    grad = grad_map[input_to_check]
    if isinstance(grad, BlobReference) or isinstance(grad, str):
        return ws_api.FetchBlob(grad)
    if not isinstance(grad, GradientSlice):
        raise GradientError(f"gradient of {input_to_check!r} is {grad!r}, neither a blob nor "
                            "a GradientSlice")
    dense = "tmp_dense_grad"
    ws_api.RunOperatorOnce(CreateOperator(
        "SparseToDense", [grad.indices, grad.values, input_to_check], dense))
    return ws_api.FetchBlob(dense)


def _get_grad(net: Any, outputs: Sequence[Any], outputs_with_grad: Sequence[Any],
              input_values: dict[str, Any] | None, inputs_with_grads: Sequence[Any]
              ) -> tuple[list[Any], list[np.ndarray], Any]:
    """Run ``net`` plus its backward pass; forward outputs, input gradients and the net."""
    grad_net = net.Clone(net.Name() + "_copy")
    grad_map = grad_net.AddGradientOperators(outputs_with_grad)
    for name, value in (input_values or {}).items():
        ws_api.FeedBlob(name, value)
    for name in inputs_with_grads:
        if name not in grad_map:
            raise GradientError(f"Failed to find input {name} in gradient map {grad_map}; "
                                "it does not influence the outputs with gradients.")
    ws_api.RunNetOnce(grad_net)
    forward = [ws_api.FetchBlob(o) for o in outputs]
    grads = [_get_grad_blob(grad_map, name) for name in inputs_with_grads]
    return forward, grads, grad_net


def _assert_close(value1: Any, value2: Any, threshold: float, err_msg: str = ""
                  ) -> tuple[float, float]:
    """assert_allclose with atol = rtol = threshold; returns (mean, max) absolute delta."""
    np.testing.assert_allclose(value1, value2, atol=threshold, rtol=threshold,
                               err_msg=err_msg)
    delta = np.abs(np.asarray(value1, np.float64) - np.asarray(value2, np.float64)).flatten()
    if delta.size == 0:
        return 0.0, 0.0
    return float(np.mean(delta)), float(np.max(delta))


class NetGradientChecker:
    """Gradient checks of whole nets: against each other, or against finite differences."""

    @staticmethod
    def CompareNets(nets: Sequence[Any], outputs: Sequence[Sequence[Any]],
                    outputs_with_grad_ids: Sequence[int], inputs_with_grads: Sequence[Any],
                    input_values: dict[str, Any] | None = None, threshold: float = 0.0000001,
                    print_net_images: bool = False) -> None:
        """Assert that the nets give the same forward outputs and input gradients."""
        results = [_get_grad(net, net_outputs, [net_outputs[i] for i in outputs_with_grad_ids],
                             input_values, inputs_with_grads)
                   for net, net_outputs in zip(nets, outputs)]
        first_results, first_grads, _ = results[0]
        for index, (net_results, net_grads, _) in enumerate(results[1:], start=1):
            if len(net_results) != len(first_results):
                raise GradientError(f"net {index} has {len(net_results)} outputs, net 0 has "
                                    f"{len(first_results)}")
            for idx, (value0, value) in enumerate(zip(first_results, net_results)):
                _assert_close(value0, value, threshold, err_msg=(
                    f"Different forward pass results for output id {idx}. Corresponding "
                    f"output blobs: {outputs[0][idx]} and {outputs[index][idx]}"))
            for blob, grad0, grad in zip(inputs_with_grads, first_grads, net_grads):
                _assert_close(grad0, grad, threshold,
                              err_msg=f"Different gradients for input {blob}")

    @staticmethod
    def Check(net: Any, outputs_with_grad: Sequence[Any], input_values: dict[str, Any],
              input_to_check: Any, step_size: float = 0.0001, threshold: float = 0.05,
              print_net: bool = True) -> tuple[float, float]:
        """Compare the analytic gradient of ``sum(outputs_with_grad)`` with respect to
        ``input_to_check`` with central differences; returns (mean, max) delta."""
        _, grads, full_net = _get_grad(net, [], outputs_with_grad, input_values,
                                       [input_to_check])
        analytic = grads[0]
        base = np.asarray(input_values[input_to_check])

        def loss(value: np.ndarray) -> float:
            ws_api.FeedBlob(input_to_check, value)
            ws_api.RunNetOnce(full_net)
            return float(sum(np.asarray(ws_api.FetchBlob(o), np.float64).sum()
                             for o in outputs_with_grad))

        estimate = np.zeros_like(base)
        for dim in range(base.size):
            plus, minus = base.copy(), base.copy()
            plus.flat[dim] += step_size
            minus.flat[dim] -= step_size
            estimate.flat[dim] = (loss(plus) - loss(minus)) / step_size / 2
        ws_api.FeedBlob(input_to_check, base)
        err_msg = f"Error in gradient check for net_copy {net.Name()}"
        if print_net:
            err_msg += f": {net.Proto()}"
        return _assert_close(analytic, estimate, threshold, err_msg)


class GradientChecker:
    """Checks one operator's gradient ops against central differences.

    Args:
        stepsize: the finite-difference step.
        threshold: atol and rtol of the comparison.
        device_option: the op's device (default: CPU).
        workspace_name: the workspace the check runs in (created, reset afterwards).
        input_device_options: ``{input name: DeviceOption}`` overrides for feeding.
    """

    def __init__(self, stepsize: float, threshold: float,
                 device_option: caffe2_pb2.DeviceOption | None = None,
                 workspace_name: str = "gradient_check",
                 input_device_options: dict[str, Any] | None = None) -> None:
        self._stepsize = stepsize
        self._threshold = threshold
        self._device_option = device_option or caffe2_pb2.DeviceOption()
        self._workspace_name = workspace_name
        self._input_device_options = input_device_options or {}

    def GetLossAndGrad(self, op: caffe2_pb2.OperatorDef, grad_ops: Sequence[Any],
                       inputs: Sequence[np.ndarray], input_names: Sequence[str],
                       input_to_check: int, grad_name: Any, outputs_with_grads: Sequence[int]
                       ) -> tuple[float, np.ndarray]:
        """Feed ``inputs``, run the op and its gradient ops; the loss and the gradient."""
        for name, value in zip(input_names, inputs):
            ws_api.FeedBlob(name, value,
                            self._input_device_options.get(name, self._device_option))
        ws_api.RunOperatorOnce(op)
        loss = 0.0
        for idx in outputs_with_grads:
            name = op.output[idx]
            value = ws_api.FetchBlob(name)
            loss += float((np.asarray(value, np.float64) ** 2).sum())
            ws_api.FeedBlob(name + "_grad", value, self._device_option)
        ws_api.RunOperatorsOnce(grad_ops)
        if isinstance(grad_name, GradientSlice):
            return loss / 2.0, self._dense_slice(grad_name, inputs[input_to_check])
        return loss / 2.0, ws_api.FetchBlob(grad_name)

    def _dense_slice(self, grad: GradientSlice, x: np.ndarray) -> np.ndarray:
        ws_api.FeedBlob("zeros", np.zeros_like(x, dtype=np.float32))
        ws_api.FeedBlob("ones", np.ones(1, dtype=np.float32))
        values_cpu, indices_cpu = str(grad.values) + "_cpu", str(grad.indices) + "_cpu"
        ws_api.RunOperatorOnce(CreateOperator("EnsureCPUOutput", grad.values, values_cpu,
                                              device_option=self._device_option))
        ws_api.RunOperatorOnce(CreateOperator("EnsureCPUOutput", grad.indices, indices_cpu,
                                              device_option=self._device_option))
        ws_api.RunOperatorOnce(CreateOperator(
            "ScatterWeightedSum", ["zeros", "ones", indices_cpu, values_cpu, "ones"], "zeros"))
        return ws_api.FetchBlob("zeros")

    def CheckSimple(self, op: caffe2_pb2.OperatorDef, inputs: list[np.ndarray],
                    input_to_check: int, outputs_with_grads: Sequence[int],
                    grad_ops: Sequence[Any] | None = None,
                    input_device_options: dict[str, Any] | None = None,
                    ensure_outputs_are_inferred: bool = False
                    ) -> tuple[bool, np.ndarray, np.ndarray]:
        """Check the gradient of input ``input_to_check``; ``(ok, grad, grad_estimate)``.

        Only the first and last 3 elements are differentiated numerically unless the
        environment sets ``CAFFE2_FULL_GRAD_CHECK=1`` (the others copy the analytic value).
        """
        old_ws = ws_api.CurrentWorkspace()
        own_ws = self._workspace_name != old_ws
        if own_ws:
            ws_api.SwitchWorkspace(self._workspace_name, True)
        try:
            return self._check(op, inputs, input_to_check, outputs_with_grads, grad_ops,
                               input_device_options, ensure_outputs_are_inferred)
        finally:
            if own_ws:
                ws_api.ResetWorkspace()
                ws_api.SwitchWorkspace(old_ws)

    def _check(self, op: caffe2_pb2.OperatorDef, inputs: list[np.ndarray],
               input_to_check: int, outputs_with_grads: Sequence[int],
               grad_ops: Sequence[Any] | None, input_device_options: dict[str, Any] | None,
               ensure_outputs_are_inferred: bool) -> tuple[bool, np.ndarray, np.ndarray]:
        op.device_option.CopyFrom(self._device_option)
        if grad_ops is None:
            grad_ops, g_input = getGradientForOp(op)
            grad_name = g_input[input_to_check]
        else:
            grad_name = op.input[input_to_check] + "_grad"
        if grad_name is None:
            raise GradientError(f"{op.type}: input {input_to_check} ({op.input[input_to_check]})"
                                " has no gradient; check an input the op differentiates.")
        devices = input_device_options or InferOpBlobDevicesAsDict(op)[0]
        for name, value in zip(op.input, inputs):
            ws_api.FeedBlob(name, value, devices.get(name, self._device_option))
        args = (op, grad_ops, inputs, op.input, input_to_check, grad_name, outputs_with_grads)
        _, grad = self.GetLossAndGrad(*args)
        x = inputs[input_to_check]
        estimate = np.zeros_like(x)
        if estimate.shape != grad.shape:
            raise ShapeError(f"Mismatched gradient shapes: estimated ({estimate.shape}), grad "
                             f"({grad.shape}) for {op.type} input {op.input[input_to_check]}")
        if ensure_outputs_are_inferred:
            _assert_inferred(op, grad_ops)
        full = os.getenv("CAFFE2_FULL_GRAD_CHECK") == "1"
        size = x.size
        for dim in range(size):
            if not full and 3 <= dim < size - 3:
                estimate.flat[dim] = grad.flat[dim]
                continue
            x.flat[dim] += self._stepsize
            pos_loss, _ = self.GetLossAndGrad(*args)
            x.flat[dim] -= self._stepsize * 2
            neg_loss, _ = self.GetLossAndGrad(*args)
            x.flat[dim] += self._stepsize
            estimate.flat[dim] = (pos_loss - neg_loss) / self._stepsize / 2
        fail = ~np.isclose(grad, estimate, atol=self._threshold, rtol=self._threshold)
        if np.any(fail):
            idx = np.flatnonzero(fail)
            print("Failed. [idx, grad, grad_estimate] are:")
            print(np.vstack([idx, grad.flat[idx], estimate.flat[idx]]).T)
            return False, grad, estimate
        return True, grad, estimate


def _assert_inferred(op: caffe2_pb2.OperatorDef, grad_ops: Sequence[Any]) -> None:
    """Shape/type inference of the forward + gradient ops agrees with the fetched blobs."""
    net = caffe2_pb2.NetDef()
    net.op.extend([op, *grad_ops])
    shapes, types = ws_api.InferShapesAndTypes([net])
    for blob in {b for g in grad_ops for b in g.output}:
        if blob not in shapes or not ws_api.HasBlob(blob):
            continue
        value = np.asarray(ws_api.FetchBlob(blob))
        if list(shapes[blob]) != list(value.shape):
            raise ShapeError(f"{op.type}: inferred shape {list(shapes[blob])} of {blob!r} "
                             f"differs from the computed {list(value.shape)}")
