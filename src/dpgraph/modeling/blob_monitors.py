"""The logic of Caffe2's blob-monitoring net modifiers (``modeling.compute_norm_for_blobs``,
``compute_statistics_for_blobs``, ``compute_histogram_for_blobs``, ``get_entry_from_blobs``):
per listed blob, the ops of one summary,
a ``Print`` every ``logging_frequency`` runs (none when it is below 1) and, with
``modify_output_record``, an output-record field ``<blob><suffix>``.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

import dpgraph.ops.lp_norm  # noqa: F401 - registers LpNorm
import dpgraph.ops.monitoring  # noqa: F401 - registers AccumulateHistogram, NormalizeL1
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


class ComputeHistogramForBlobs(BlobMonitor):
    """``<blob>_curr_normalized_hist`` (``_acc_normalized_hist`` with accumulate): the
    blob's histogram over ``num_buckets`` buckets in [lower_bound, upper_bound) plus the
    two outer buckets, normalized to sum 1."""

    def __init__(self, blobs: Any, logging_frequency: int, num_buckets: int = 30,
                 lower_bound: float = 0.0, upper_bound: float = 1.0,
                 accumulate: bool = False) -> None:
        super().__init__(blobs, logging_frequency)
        if num_buckets <= 0 or not upper_bound > lower_bound:
            raise ModelConfigError(
                f"ComputeHistogramForBlobs needs num_buckets > 0 and upper_bound > "
                f"lower_bound, got {num_buckets}, [{lower_bound}, {upper_bound})")
        self._num_buckets = int(num_buckets)
        self._lower_bound = float(lower_bound)
        self._upper_bound = float(upper_bound)
        self._accumulate = accumulate
        kind = "acc" if accumulate else "curr"
        self._field_name_suffix = f"_{kind}_normalized_hist"
        self._output_shape = (self._num_buckets + 2,)

    def summarize(self, net: Any, blob: Any) -> tuple[Any, str]:
        curr, acc = net.AccumulateHistogram(
            [self._float(net, blob)],
            [net.NextScopedBlob(prefix=f"{blob}_curr_hist"),
             net.NextScopedBlob(prefix=f"{blob}_acc_hist")],
            num_buckets=self._num_buckets, lower_bound=self._lower_bound,
            upper_bound=self._upper_bound)
        hist = net.Cast(acc if self._accumulate else curr,
                        net.NextScopedBlob(prefix=f"{blob}_cast_hist"),
                        to=caffe2_pb2.TensorProto.FLOAT)
        name = net.NextScopedBlob(prefix=str(blob) + self._field_name_suffix)
        return net.NormalizeL1(hist, name), str(blob)


class GetEntryFromBlobs(BlobMonitor):
    """``<blob>_<i1>_<i2>``: entry [i1, i2] of a 2-D blob as a [1, 1] tensor, or with
    ``i2 = -1`` its whole row i1 (``<blob>_<i1>_all``, [1, cols])."""

    _output_shape = ()

    def __init__(self, blobs: Any, logging_frequency: int, i1: int = 0, i2: int = 0) -> None:
        super().__init__(blobs, logging_frequency)
        self._i1, self._i2 = int(i1), int(i2)
        self._field_name_suffix = (f"_{self._i1}_{self._i2}" if self._i2 >= 0
                                   else f"_{self._i1}_all")

    def modify_net(self, net: Any, init_net: Any = None, grad_map: Any = None,
                   blob_to_device: Any = None, modify_output_record: bool = False) -> None:
        if self._i1 < 0:
            raise ModelConfigError(f"GetEntryFromBlobs: row index i1 must be >= 0, got "
                                   f"{self._i1}")
        super().modify_net(net, init_net, grad_map, blob_to_device, modify_output_record)

    def summarize(self, net: Any, blob: Any) -> tuple[Any, str]:
        row = net.Slice([blob], starts=[self._i1, 0], ends=[self._i1 + 1, -1])
        name = net.NextScopedBlob(prefix=str(blob) + self._field_name_suffix)
        if self._i2 == -1:
            return net.Copy([row], [name]), str(blob)
        return net.Slice([row], name, starts=[0, self._i2], ends=[-1, self._i2 + 1]), str(blob)
