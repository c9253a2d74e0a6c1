"""Caffe2's ``device_checker``: run an op or net on several device options and check that
every device gives the outputs of the first one."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph.ir.analysis import InferOpBlobDevicesAsDict
from dpgraph.proto import caffe2_pb2
from dpgraph.runtime import api as ws_api

CHECK_WORKSPACE = "_device_check_"


def _report(results: list[list[Any]], names: Sequence[str], threshold: float) -> bool:
    """Compare each device's results with device 0's; print and count mismatches."""
    success = True
    for i in range(1, len(results)):
        for j, name in enumerate(names):
            x, y = np.asarray(results[i][j]), np.asarray(results[0][j])
            if x.dtype.kind in "SUO" or y.dtype.kind in "SUO":
                same = x.shape == y.shape and bool(np.all(x == y))
            else:
                same = x.shape == y.shape and np.allclose(x, y, atol=threshold,
                                                          rtol=threshold)
            if not same:
                print(f"Failure in checking device option {i} and output {name}. The "
                      "outputs are:")
                print(x.flatten())
                print(y.flatten())
                if x.shape == y.shape and x.dtype.kind not in "SUO":
                    print(np.max(np.abs(x - y)))
                success = False
    return success


class DeviceChecker:
    """Checks that ops and nets compute the same values on every device option."""

    def __init__(self, threshold: float,
                 device_options: Sequence[caffe2_pb2.DeviceOption]) -> None:
        self._threshold = threshold
        self._device_options = list(device_options)

    def CheckSimple(self, op: caffe2_pb2.OperatorDef, inputs: Sequence[Any],
                    outputs_to_check: Sequence[int],
                    input_device_options: dict[str, Any] | None = None) -> bool:
        """Run ``op`` on each device (in workspace ``_device_check_``) and compare the
        outputs at ``outputs_to_check``; True if they all match device 0's."""
        op = copy.deepcopy(op)
        old = ws_api.CurrentWorkspace()
        results: list[list[Any]] = []
        ws_api.SwitchWorkspace(CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                op.device_option.CopyFrom(device_option)
                devices = input_device_options or InferOpBlobDevicesAsDict(op)[0]
                for name, value in zip(op.input, inputs):
                    ws_api.FeedBlob(name, np.array(value), devices.get(name, device_option))
                ws_api.RunOperatorOnce(op)
                results.append([ws_api.FetchBlob(op.output[i]) for i in outputs_to_check])
                ws_api.ResetWorkspace()
        finally:
            ws_api.SwitchWorkspace(old)
        return _report(results, [op.output[i] for i in outputs_to_check], self._threshold)

    def CheckNet(self, net: caffe2_pb2.NetDef, inputs: dict[str, Any] | None = None,
                 blobs_to_check: Sequence[str] | None = None,
                 ignore: Any = None) -> bool:
        """Run the NetDef on each device (setting its ops' device options in place) and
        compare ``blobs_to_check`` (default: every op output not in ``ignore``)."""
        inputs = inputs or {}
        ignore = set(ignore or ())
        if blobs_to_check is None:
            blobs_to_check = [o for op in net.op for o in op.output]
        blobs_to_check = [b for b in blobs_to_check if b not in ignore]
        old = ws_api.CurrentWorkspace()
        results: list[list[Any]] = []
        ws_api.SwitchWorkspace(CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                for name, value in inputs.items():
                    ws_api.FeedBlob(name, value, device_option)
                for op in net.op:
                    op.device_option.CopyFrom(device_option)
                ws_api.RunNetOnce(net)
                results.append([ws_api.FetchBlob(b) for b in blobs_to_check])
        finally:
            ws_api.SwitchWorkspace(old)
        return _report(results, blobs_to_check, self._threshold)


__all__ = ["DeviceChecker"]
