"""The logic of Caffe2's blob-monitoring net modifiers (``modeling.compute_norm_for_blobs``,
``modeling.compute_statistics_for_blobs``): per listed blob, a float copy, one summary op,
a ``Print`` every ``logging_frequency`` runs (none when it is below 1) and, with
``modify_output_record``, an output-record field ``<blob><suffix>``.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

import dpgraph.ops.lp_norm  # noqa: F401 - registers LpNorm
from dpgraph.errors import ModelConfigError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.device import CPU, DeviceOption
from dpgraph.ir.scope import DeviceScope
from dpgraph.jobs import schema
from dpgraph.modeling.net_modifier import NetModifier
from dpgraph.proto import caffe2_pb2


def add_output_field(net: Any, name: str, blob: Any, shape: tuple[int, ...]) -> None:
    """Expose ``blob`` (float32 of ``shape``) as field ``name`` of the net's output record."""
    scalar = schema.Scalar((np.float32, shape), blob)
    if net.output_record() is None:
        net.set_output_record(schema.Struct((name, scalar)))
    else:
        net.AppendOutputRecordField(name, scalar)


class BlobMonitor(NetModifier):
    """Shared loop: subclasses set ``_field_name_suffix`` and implement :meth:`summarize`."""

    _field_name_suffix = ""
    _output_shape: tuple[int, ...] = (1,)

    def __init__(self, blobs: Any, logging_frequency: int) -> None:
        self._blobs = list(blobs)
        self._logging_frequency = logging_frequency

    def field_name_suffix(self) -> str:
        return self._field_name_suffix

    @abc.abstractmethod
    def summarize(self, net: Any, blob: Any) -> tuple[Any, str]:
        """Add the ops computing this monitor's summary of ``blob``; return it and the name
        its output field starts with."""

    def modify_net(self, net: Any, init_net: Any = None, grad_map: Any = None,
                   blob_to_device: Any = None, modify_output_record: bool = False) -> None:
        blob_to_device = blob_to_device or {}
        for name in self._blobs:
            blob = BlobReference(name)
            if not net.BlobIsDefined(blob):
                raise ModelConfigError(f"blob {blob} is not defined in net {net.Name()}: "
                                       "list blobs the net produces")
            with DeviceScope(blob_to_device.get(blob, DeviceOption(CPU))):
                summary, label = self.summarize(net, blob)
                if self._logging_frequency >= 1:
                    net.Print(summary, [], every_n=self._logging_frequency)
                if modify_output_record:
                    add_output_field(net, label + self._field_name_suffix, summary,
                                     self._output_shape)

    @staticmethod
    def _float(net: Any, blob: Any) -> Any:
        return net.Cast(blob, net.NextScopedBlob(prefix=str(blob) + "_float"),
                        to=caffe2_pb2.TensorProto.FLOAT)


class ComputeNormForBlobs(BlobMonitor):
    """``<blob>_l<p>_norm`` (``_averaged_l<p>_norm`` with compute_averaged_norm): LpNorm of
    the blob (the squared L2 norm for p=2), or of its row ``row_index``."""

    def __init__(self, blobs: Any, logging_frequency: int, p: int = 2,
                 compute_averaged_norm: bool = False, row_index: int | None = None) -> None:
        super().__init__(blobs, logging_frequency)
        if p not in (1, 2):
            raise ModelConfigError(f"ComputeNormForBlobs: p must be 1 or 2, got {p}")
        self._p = p
        self._compute_averaged_norm = compute_averaged_norm
        self.row_index = row_index
        averaged = "averaged_" if compute_averaged_norm else ""
        self._field_name_suffix = f"_{averaged}l{p}_norm"

    def summarize(self, net: Any, blob: Any) -> tuple[Any, str]:
        if self.row_index is not None and self.row_index >= 0:
            blob = net.Slice([blob], net.NextScopedBlob(prefix=f"{blob}_row_{self.row_index}"),
                             starts=[self.row_index, 0], ends=[self.row_index + 1, -1])
        norm_name = net.NextScopedBlob(prefix=str(blob) + self._field_name_suffix)
        norm = net.LpNorm(self._float(net, blob), norm_name, p=self._p,
                          average=self._compute_averaged_norm)
        net.StopGradient(norm, net.NextScopedBlob(str(norm_name) + "_stop_gradient"))
        return norm, str(blob)


class ComputeStatisticsForBlobs(BlobMonitor):
    """``<blob>_summary``: Summarize's [min, max, mean, unbiased std] of the blob."""

    _field_name_suffix = "_summary"
    _output_shape = (4,)

    def summarize(self, net: Any, blob: Any) -> tuple[Any, str]:
        name = net.NextScopedBlob(prefix=str(blob) + self._field_name_suffix)
        return net.Summarize(self._float(net, blob), name, to_file=0), str(blob)
