"""Caffe2's ``muji``: all-reduce of one blob per GPU with Add and Copy ops only.

Every op carries an explicit device option (overriding any DeviceScope); the reduced blob
of ``blob`` is named ``str(blob) + reduced_affix`` (``''`` reduces in place, as Detectron
does).  ``Allreduce`` picks a tree from the number of blobs and the peer-access pattern.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpgraph import workspace as workspace  # a module global, as in Caffe2 (tests patch it)
from dpgraph.errors import DeviceError
from dpgraph.ir.blob import BlobReference
from dpgraph.ir.device import CPU, DeviceOption
from dpgraph.proto import caffe2_pb2


def _gpu_type() -> int:
    return int(getattr(workspace, "GpuDeviceType", caffe2_pb2.PROTO_CUDA))


def OnGPU(gpu_id: int) -> caffe2_pb2.DeviceOption:
    """The device option of GPU ``gpu_id``."""
    return DeviceOption(_gpu_type(), gpu_id)


def OnCPU() -> caffe2_pb2.DeviceOption:
    """The CPU device option."""
    return DeviceOption(CPU)


def _op(net: Any, op_type: str, inputs: Sequence[Any], output: Any,
        device: caffe2_pb2.DeviceOption) -> BlobReference:
    """Append one op with exact blob names (no name scope) and return its output."""
    op = caffe2_pb2.OperatorDef(type=op_type)
    op.input.extend(str(b) for b in inputs)
    op.output.append(str(output))
    op.device_option.CopyFrom(device)
    for blob in op.input:
        if not net.BlobIsDefined(blob):
            net.AddExternalInput(blob)
    net.extend_ops([op])
    return BlobReference(str(output), net)


def _reduced(blobs: Sequence[Any], affix: str) -> list[str]:
    return [str(b) + affix for b in blobs]


def Allreduce(net: Any, blobs: Sequence[Any], reduced_affix: str = "_reduced",
              gpu_indices: Sequence[int] | None = None) -> list[BlobReference]:
    """All-reduce ``blobs`` (blob i on GPU ``gpu_indices[i]``); returns the reduced blobs."""
    if gpu_indices is None:
        gpu_indices = list(range(len(blobs)))
    if len(gpu_indices) != len(blobs):
        raise DeviceError(
            f"gpu_indices length and blobs length mismatch: {len(gpu_indices)} vs "
            f"{len(blobs)} (blobs {[str(b) for b in blobs]}, gpu_indices "
            f"{list(gpu_indices)}); pass one GPU index per blob."
        )
    pattern = _peer_pattern()

    def full(lo: int, hi: int) -> bool:
        return bool(pattern.shape[0] >= hi and pattern[lo:hi, lo:hi].all())

    count = len(blobs)
    if count == 2 and full(0, 2):
        return Allreduce2(net, blobs, reduced_affix, gpu_indices)
    if count == 4 and full(0, 4):
        return Allreduce4(net, blobs, reduced_affix, gpu_indices)
    if count == 4 and full(0, 2) and full(2, 4):
        return Allreduce4Group2(net, blobs, reduced_affix, gpu_indices)
    if count == 8 and full(0, 8):
        return Allreduce8(net, blobs, reduced_affix, gpu_indices)
    return AllreduceFallback(net, blobs, reduced_affix, gpu_indices)


def _peer_pattern() -> np.ndarray:
    pattern = np.asarray(workspace.GetGpuPeerAccessPattern(), dtype=bool)
    return pattern if pattern.ndim == 2 else np.zeros((0, 0), dtype=bool)


def Allreduce2(net: Any, blobs: Sequence[Any], reduced_affix: str,
               gpu_indices: Sequence[int]) -> list[BlobReference]:
    """Add on the first GPU, Copy to the second."""
    a, b = blobs
    gpu_a, gpu_b = gpu_indices
    a_r, b_r = _reduced(blobs, reduced_affix)
    a_reduced = _op(net, "Add", [a, b], a_r, OnGPU(gpu_a))
    b_reduced = _op(net, "Copy", [a_reduced], b_r, OnGPU(gpu_b))
    return [a_reduced, b_reduced]


def Allreduce4(net: Any, blobs: Sequence[Any], reduced_affix: str,
               gpu_indices: Sequence[int]) -> list[BlobReference]:
    """(a+b), (c+d), then a+c; broadcast a->c, a->b, c->d."""
    return _allreduce4(net, blobs, reduced_affix, gpu_indices, copy_c_to_a=False)


def Allreduce4Group2(net: Any, blobs: Sequence[Any], reduced_affix: str,
                     gpu_indices: Sequence[int]) -> list[BlobReference]:
    """Like Allreduce4, but c+d is copied to a's GPU (``<c_r>_copy``) before adding."""
    return _allreduce4(net, blobs, reduced_affix, gpu_indices, copy_c_to_a=True)


def _allreduce4(net: Any, blobs: Sequence[Any], reduced_affix: str,
                gpu_indices: Sequence[int], copy_c_to_a: bool) -> list[BlobReference]:
    """The 4-GPU tree of Allreduce4; with ``copy_c_to_a`` (two peer groups, as in
    Allreduce4Group2) c+d travels to a's GPU through an explicit Copy before the add."""
    a, b, c, d = blobs
    gpu_a, gpu_b, gpu_c, gpu_d = gpu_indices
    a_r, b_r, c_r, d_r = _reduced(blobs, reduced_affix)
    a_reduced = _op(net, "Add", [a, b], a_r, OnGPU(gpu_a))
    c_reduced = _op(net, "Add", [c, d], c_r, OnGPU(gpu_c))
    c_for_a = (_op(net, "Copy", [c_reduced], str(c_reduced) + "_copy", OnGPU(gpu_a))
               if copy_c_to_a else c_reduced)
    a_reduced = _op(net, "Add", [a_reduced, c_for_a], a_reduced, OnGPU(gpu_a))
    c_reduced = _op(net, "Copy", [a_reduced], c_reduced, OnGPU(gpu_c))
    b_reduced = _op(net, "Copy", [a_reduced], b_r, OnGPU(gpu_b))
    d_reduced = _op(net, "Copy", [c_reduced], d_r, OnGPU(gpu_d))
    return [a_reduced, b_reduced, c_reduced, d_reduced]


def Allreduce8(net: Any, blobs: Sequence[Any], reduced_affix: str,
               gpu_indices: Sequence[int]) -> list[BlobReference]:
    """Pairs, then (0,2) and (4,6), then 4's result copied to GPU 0 and added; broadcast
    back down the same tree."""
    names = _reduced(blobs, reduced_affix)
    reduced: list[Any] = [None] * 8
    for i in (0, 2, 4, 6):
        reduced[i] = _op(net, "Add", [blobs[i], blobs[i + 1]], names[i], OnGPU(gpu_indices[i]))
    for i in (0, 4):
        reduced[i] = _op(net, "Add", [reduced[i], reduced[i + 2]], reduced[i],
                         OnGPU(gpu_indices[i]))
    copy4 = _op(net, "Copy", [reduced[4]], str(reduced[4]) + "_copy", OnGPU(gpu_indices[0]))
    reduced[0] = _op(net, "Add", [reduced[0], copy4], reduced[0], OnGPU(gpu_indices[0]))
    reduced[4] = _op(net, "Copy", [reduced[0]], reduced[4], OnGPU(gpu_indices[4]))
    for i in (2, 6):
        reduced[i] = _op(net, "Copy", [reduced[i - 2]], reduced[i], OnGPU(gpu_indices[i]))
    for i in (0, 2, 4, 6):
        reduced[i + 1] = _op(net, "Copy", [reduced[i]], names[i + 1], OnGPU(gpu_indices[i + 1]))
    return reduced


def AllreduceFallback(net: Any, blobs: Sequence[Any], reduced_affix: str,
                      gpu_indices: Sequence[int]) -> list[BlobReference]:
    """Copy every blob to the first GPU and add there, then copy the sum back."""
    if not blobs:  # nothing to reduce (e.g. ``range(NumGpuDevices())`` without GPUs)
        return []
    reduced: list[Any] = [None] * len(blobs)
    if reduced_affix != "":
        reduced[0] = _op(net, "Copy", [blobs[0]], str(blobs[0]) + reduced_affix,
                         OnGPU(gpu_indices[0]))
    else:
        reduced[0] = BlobReference(str(blobs[0]), net)
    temp_name = str(reduced[0]) + "_temp_copy"
    for i in range(1, len(blobs)):
        temp = _op(net, "Copy", [blobs[i]], temp_name, OnGPU(gpu_indices[0]))
        reduced[0] = _op(net, "Add", [temp, reduced[0]], reduced[0], OnGPU(gpu_indices[0]))
    for i in range(1, len(blobs)):
        reduced[i] = _op(net, "Copy", [reduced[0]], str(blobs[i]) + reduced_affix,
                         OnGPU(gpu_indices[i]))
    return reduced


__all__ = ["Allreduce", "Allreduce2", "Allreduce4", "Allreduce4Group2", "Allreduce8",
           "AllreduceFallback", "OnCPU", "OnGPU"]
