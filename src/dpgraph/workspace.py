"""Caffe2's ``workspace`` module: the current workspace, blobs, nets, plans and devices.

A thin facade over :mod:`dpgraph.runtime`; ``has_gpu_support``, ``has_cuda_support`` and
``has_hip_support`` are evaluated on access, so they follow :func:`SetVirtualGpus`.
"""

from typing import Any

from dpgraph.export.predictor import WorkspacePredictor as Predictor
from dpgraph.ir.device import CUDA
from dpgraph.ir.net import operator_tracebacks
from dpgraph.ir.scope import CurrentNameScope as GetNameScope
from dpgraph.runtime import c_api as C
from dpgraph.runtime import devices as _devices
from dpgraph.runtime.api import (
    BenchmarkNet,
    Blobs,
    CreateBlob,
    CurrentWorkspace,
    DeserializeBlob,
    FeedBlob,
    FetchBlob,
    FetchBlobs,
    FetchInt8Blob,
    GetNetName,
    GlobalInit,
    HasBlob,
    InferShapesAndTypes,
    Nets,
    RegisteredOperators,
    ResetBlob,
    ResetWorkspace,
    RootFolder,
    RunNet,
    RunNetOnce,
    RunOperatorMultiple,
    RunOperatorOnce,
    RunOperatorsOnce,
    RunPlan,
    SerializeBlob,
    StringifyBlobName,
    StringifyNetName,
    StringifyProto,
    Workspaces,
    blobs,
)
from dpgraph.runtime.c_api import (
    CreateNet,
    FillRandomNetworkInputs,
    GetBlobSizeBytes,
    RunPlanInBackground,
    SwitchWorkspace,
    WorkspaceGuard,
)
from dpgraph.runtime.devices import (
    GetCUDAVersion,
    GetCuDNNVersion,
    GetDeviceProperties,
    GetGPUMemoryInfo,
    GetGpuPeerAccessPattern,
    NumGpuDevices,
    SetVirtualGpus,
)
from dpgraph.runtime.immediate import (
    FeedImmediate,
    FetchImmediate,
    ImmediateBlobs,
    IsImmediate,
    RunOperatorImmediate,
    StartImmediate,
    StopImmediate,
    immediate_root_folder,
)
from dpgraph.runtime.net_transforms import ApplyTransform, ApplyTransformIfFaster
from dpgraph.runtime.numa import get_blob_numa_node as GetBlobNUMANode
from dpgraph.runtime.numa import get_num_numa_nodes as GetNumNUMANodes
from dpgraph.runtime.numa import is_numa_enabled as IsNUMAEnabled
from dpgraph.runtime.op_cost import GetOperatorCost

#: Caffe2's ``workspace.Workspace`` is the binding's workspace class (``C.Workspace``).
Workspace = C.Workspace
GpuDeviceType = CUDA
NumCudaDevices = NumGpuDevices
GetCudaPeerAccessPattern = GetGpuPeerAccessPattern  # Caffe2 2018 name


def __getattr__(name: str) -> Any:
    if name in ("has_gpu_support", "has_cuda_support"):
        return _devices.NumGpuDevices() > 0
    if name == "has_hip_support":
        return False
    if name == "_immediate_root_folder":
        return immediate_root_folder()
    if name == "has_fbgemm":  # Save can write float tensors as bfloat16
        from dpgraph.ir.blob_size import HAS_BFLOAT16

        return HAS_BFLOAT16
    raise AttributeError(f"module 'dpgraph.workspace' has no attribute {name!r}")


__all__ = [
    "ApplyTransform", "ApplyTransformIfFaster", "C", "FillRandomNetworkInputs",
    "GetBlobSizeBytes", "GetOperatorCost", "RunPlanInBackground", "FeedImmediate",
    "GetBlobNUMANode", "GetNumNUMANodes", "IsNUMAEnabled",
    "FetchImmediate", "ImmediateBlobs", "RunOperatorImmediate",
    "BenchmarkNet", "Blobs", "CreateBlob", "FetchInt8Blob", "GetGPUMemoryInfo", "IsImmediate",
    "StartImmediate", "StopImmediate", "CreateNet", "CurrentWorkspace", "DeserializeBlob",
    "FeedBlob", "FetchBlob", "FetchBlobs", "GetCUDAVersion", "GetCuDNNVersion",
    "GetCudaPeerAccessPattern", "GetDeviceProperties",
    "GetGpuPeerAccessPattern", "GetNameScope", "GetNetName", "GlobalInit", "GpuDeviceType",
    "HasBlob", "InferShapesAndTypes", "Nets", "NumCudaDevices", "NumGpuDevices", "Predictor",
    "RegisteredOperators", "ResetBlob", "ResetWorkspace", "RootFolder", "RunNet",
    "RunNetOnce", "RunOperatorMultiple", "RunOperatorOnce", "RunOperatorsOnce", "RunPlan",
    "SerializeBlob",
    "SetVirtualGpus", "StringifyBlobName", "StringifyNetName", "StringifyProto",
    "SwitchWorkspace", "Workspace", "WorkspaceGuard", "Workspaces", "blobs",
    "operator_tracebacks",
]
