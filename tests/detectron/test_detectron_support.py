"""What Detectron needs around its operators: the ops-library lookup and dyndep, the per-GPU
memory report, and every caffe2.python name its detectron/ and tools/ call."""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpgraph import core, dyndep, utils, workspace
from dpgraph.errors import OpsLibraryError
from dpgraph.proto import caffe2_pb2

DETECTRON_LIB = "libcaffe2_detectron_ops_gpu.so"


def detectron_lookup() -> str:
    """Detectron's get_detectron_ops_lib(), restated: the first <prefix>/<subdir>/<lib> that
    exists, prefixes /usr/local, sys.prefix, sys.exec_prefix and sys.path in order."""
    for prefix in ["/usr/local", sys.prefix, sys.exec_prefix, *sys.path]:
        for subdir in ("lib", "torch/lib"):
            path = os.path.join(prefix, subdir, DETECTRON_LIB)
            if os.path.exists(path):
                return path
    raise Exception("Detectron ops lib not found")


def test_detectron_lookup_finds_dpgraph_marker_and_init_accepts_it() -> None:
    path = detectron_lookup()
    assert Path(path).is_dir() and (Path(path) / "README.txt").is_file()
    assert dyndep.MARKER_PREFIX in sys.path
    dyndep.InitOpsLibrary(path)
    assert path in dyndep.GetLoadedLibraries() and path in dyndep.GetImportedOpsLibraries()


def test_marker_is_not_loadable() -> None:
    with pytest.raises(OSError):
        ctypes.CDLL(detectron_lookup())


@pytest.mark.parametrize("name", [
    "/usr/local/lib/libcaffe2_detectron_ops_gpu.so", "libcaffe2_detectron_ops.so",
    "/x/build/libcaffe2_detectron_custom_ops_gpu.so", "caffe2_detectron_custom_ops",
    "@/caffe2/caffe2/contrib/nccl:nccl_ops", "/opt/lib/libcaffe2_gloo_gpu.so",
    "@/caffe2/caffe2/distributed:file_store_handler_ops",
])
def test_init_ops_library_accepts_provided_libraries(name: str) -> None:
    dyndep.InitOpsLibrary(name, trigger_lazy=False)
    assert name in dyndep.GetLoadedLibraries()


def test_init_ops_library_refuses_unknown_and_names_missing_ops(monkeypatch,
                                                               tmp_path: Path) -> None:
    unknown = tmp_path / "libmy_ops.so"
    unknown.write_bytes(b"")
    with pytest.raises(OpsLibraryError, match="libmy_ops.so.*cannot load C\\+\\+"):
        dyndep.InitOpsLibrary(str(unknown))
    patterns = [(p, ops + ("NotARealDetectronOp",)) if p.match("caffe2_detectron_ops_gpu")
                else (p, ops) for p, ops in dyndep._LIBRARIES]
    monkeypatch.setattr(dyndep, "_LIBRARIES", tuple(patterns))
    with pytest.raises(OpsLibraryError, match="NotARealDetectronOp"):
        dyndep.InitOpsLibrary("/y/lib/libcaffe2_detectron_ops_gpu.so")
    assert "/y/lib/libcaffe2_detectron_ops_gpu.so" not in dyndep.GetLoadedLibraries()


def test_create_ops_library_marker(tmp_path: Path) -> None:
    target = tmp_path / "build" / "libcaffe2_detectron_custom_ops_gpu.so"
    assert dyndep.CreateOpsLibraryMarker(str(target)) == str(target)
    assert target.is_dir() and "not a shared library" in (target / "README.txt").read_text()
    dyndep.CreateOpsLibraryMarker(str(target))  # idempotent
    with pytest.raises(OpsLibraryError, match="does not provide"):
        dyndep.CreateOpsLibraryMarker(str(tmp_path / "libother_ops.so"))
    real = tmp_path / "lib" / "libcaffe2_detectron_ops_gpu.so"
    real.parent.mkdir()
    real.write_bytes(b"\x7fELF")
    with pytest.raises(OpsLibraryError, match="is a file"):
        dyndep.CreateOpsLibraryMarker(str(real))
    out = subprocess.run([sys.executable, "-m", "dpgraph.dyndep", "marker",
                          str(tmp_path / "m" / "libcaffe2_detectron_ops.so")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "m" / "libcaffe2_detectron_ops.so").is_dir()


def test_gpu_memory_usage_stats_count_bytes_per_virtual_gpu() -> None:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(2)
    try:
        workspace.FeedBlob("gpu_1/a", np.zeros(1000, np.float32),
                           core.DeviceOption(caffe2_pb2.CUDA, 1))
        workspace.FeedBlob("gpu_0/b", np.zeros(20, np.int32),
                           core.DeviceOption(caffe2_pb2.CUDA, 0))
        workspace.FeedBlob("cpu_blob", np.zeros(500, np.float32))
        stats = utils.GetGPUMemoryUsageStats()
        np.testing.assert_array_equal(stats["total_by_gpu"], [80, 4000])
        np.testing.assert_array_equal(stats["max_by_gpu"], [80, 4000])
        assert stats["total"] == 4080 and stats["max_total"] == 4080
        workspace.FeedBlob("gpu_1/a", np.zeros(10, np.float32),
                           core.DeviceOption(caffe2_pb2.CUDA, 1))
        stats = utils.GetGPUMemoryUsageStats()
        np.testing.assert_array_equal(stats["total_by_gpu"], [80, 40])
        np.testing.assert_array_equal(stats["max_by_gpu"], [80, 4000])  # the peak stays
        assert int(np.max(stats["max_by_gpu"][:2])) == 4000  # what Detectron logs as mem
    finally:
        workspace.ResetWorkspace()


# Every caffe2.python name Detectron's detectron/ and tools/ use (from reading its source).
DETECTRON_NAMES = {
    "caffe2.python.workspace": ["Blobs", "CreateBlob", "CreateNet", "FeedBlob", "FetchBlob",
                                "FetchBlobs", "GetCUDAVersion", "GetCuDNNVersion", "GlobalInit",
                                "HasBlob", "NumCudaDevices", "RegisteredOperators",
                                "ResetWorkspace", "RunNet", "RunNetOnce", "RunOperatorOnce"],
    "caffe2.python.core": ["BlobReference", "CreateOperator", "DeviceOption", "DeviceScope",
                           "InjectDeviceCopiesAmongNets", "NameScope", "Net",
                           "ScopedBlobReference", "ScopedName"],
    "caffe2.python.muji": ["Allreduce", "OnGPU"],
    "caffe2.python.memonger": ["share_grad_blobs"],
    "caffe2.python.net_drawer": ["GetPydotGraph", "GetPydotGraphMinimal"],
    "caffe2.python.utils": ["GetGPUMemoryUsageStats", "MakeArgument",
                            "Caffe2TensorToNumpyArray"],
    "caffe2.python.dyndep": ["InitOpsLibrary"],
    "caffe2.python.scope": ["_NAMESCOPE_SEPARATOR"],
    "caffe2.python.cnn": ["CNNModelHelper"],
    "caffe2.python.gradient_checker": ["GradientChecker"],
    "caffe2.python.modeling.initializers": ["Initializer"],
    "caffe2.python.modeling.parameter_info": ["ParameterTags"],
    "caffe2.python.predictor_constants": ["predictor_constants"],
    "caffe2.proto.caffe2_pb2": ["CPU", "CUDA", "DeviceOption", "NetDef", "TensorProto"],
}


def test_every_caffe2_python_name_detectron_uses_exists() -> None:
    from dpgraph.compat import caffe2 as alias

    alias.install()
    missing = [f"{module}.{name}" for module, names in DETECTRON_NAMES.items()
               for name in names if not hasattr(importlib.import_module(module), name)]
    assert not missing
    from caffe2.python.modeling.parameter_info import ParameterTags

    assert ParameterTags.WEIGHT and ParameterTags.BIAS


def test_tensor_conversions_round_trip() -> None:
    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.int32),
                  np.array([[1.5]], np.float64)):
        tensor = utils.NumpyArrayToCaffe2Tensor(array, "t")
        assert tensor.name == "t" and list(tensor.dims) == list(array.shape)
        back = utils.Caffe2TensorToNumpyArray(tensor)
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back, array)

    class LegacyBlob:  # Caffe 1 BlobProto fields
        num, channels, height, width, data = 1, 2, 1, 3, list(range(6))

    assert utils.CaffeBlobToNumpyArray(LegacyBlob()).shape == (1, 2, 1, 3)


def test_init_ops_library_triggers_lazy_imports(monkeypatch) -> None:
    from dpgraph.runtime import c_api

    calls: list[str] = []
    monkeypatch.setattr(c_api, "_LAZY_IMPORTS", [lambda: calls.append("lazy")])
    dyndep.InitOpsLibrary("libcaffe2_detectron_ops_gpu.so", trigger_lazy=False)
    assert calls == []
    dyndep.InitOpsLibrary("libcaffe2_detectron_ops_gpu.so")
    assert calls == ["lazy"]
