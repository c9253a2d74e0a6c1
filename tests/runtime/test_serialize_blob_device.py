"""workspace.SerializeBlob records where the blob lives (BlobProto.tensor.device_detail)."""

from __future__ import annotations

import numpy as np

from dpgraph import core, workspace
from dpgraph.proto import caffe2_pb2


def _detail(name: str) -> caffe2_pb2.DeviceOption:
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(workspace.SerializeBlob(name))
    return proto.tensor.device_detail


def test_virtual_gpu_blob_records_its_gpu() -> None:
    workspace.SetVirtualGpus(2)
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        workspace.FeedBlob("on_gpu", np.ones(2, np.float32))
    workspace.FeedBlob("on_cpu", np.ones(2, np.float32))
    gpu = _detail("on_gpu")
    assert (gpu.device_type, gpu.device_id) == (caffe2_pb2.CUDA, 1)
    assert _detail("on_cpu").device_type == caffe2_pb2.CPU
