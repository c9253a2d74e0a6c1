"""muji: Add/Copy all-reduce trees, run on virtual GPUs (Caffe2's muji_test cases)."""

from __future__ import annotations

import numpy as np
import pytest

from dpgraph import core, muji, workspace
from dpgraph.errors import DeviceError
from dpgraph.proto import caffe2_pb2


def run_allreduce(gpu_ids, fn, affix="_reduced"):
    net = core.Net("mujitest")
    for gpu in gpu_ids:
        net.ConstantFill([], f"testblob_gpu_{gpu}", shape=[1, 2, 3, 4], value=float(gpu + 1),
                         device_option=muji.OnGPU(gpu))
    names = [f"testblob_gpu_{gpu}" for gpu in gpu_ids]
    start = len(net.Proto().op)
    reduced = fn(net, names, affix, gpu_ids)
    workspace.RunNetOnce(net)
    target = sum(gpu_ids) + len(gpu_ids)
    for gpu in gpu_ids:
        np.testing.assert_array_equal(workspace.FetchBlob(f"testblob_gpu_{gpu}{affix}"), target)
    assert [str(r) for r in reduced] == [n + affix for n in names]
    return [(op.type, list(op.input), list(op.output), op.device_option.device_id)
            for op in net.Proto().op[start:]]


@pytest.fixture
def gpus8():
    workspace.SetVirtualGpus(8)


def test_on_gpu_on_cpu() -> None:
    assert muji.OnGPU(3).device_type == caffe2_pb2.CUDA and muji.OnGPU(3).device_id == 3
    assert muji.OnCPU().device_type == caffe2_pb2.CPU


def test_allreduce2(gpus8) -> None:
    ops = run_allreduce([0, 1], muji.Allreduce2)
    assert ops == [("Add", ["testblob_gpu_0", "testblob_gpu_1"], ["testblob_gpu_0_reduced"], 0),
                   ("Copy", ["testblob_gpu_0_reduced"], ["testblob_gpu_1_reduced"], 1)]


def test_allreduce4(gpus8) -> None:
    ops = run_allreduce([0, 1, 2, 3], muji.Allreduce4)
    r = [f"testblob_gpu_{i}_reduced" for i in range(4)]
    assert ops == [
        ("Add", ["testblob_gpu_0", "testblob_gpu_1"], [r[0]], 0),
        ("Add", ["testblob_gpu_2", "testblob_gpu_3"], [r[2]], 2),
        ("Add", [r[0], r[2]], [r[0]], 0),
        ("Copy", [r[0]], [r[2]], 2),
        ("Copy", [r[0]], [r[1]], 1),
        ("Copy", [r[2]], [r[3]], 3),
    ]


def test_allreduce4_group2(gpus8) -> None:
    ops = run_allreduce([0, 1, 2, 3], muji.Allreduce4Group2)
    r = [f"testblob_gpu_{i}_reduced" for i in range(4)]
    assert ops[2] == ("Copy", [r[2]], [r[2] + "_copy"], 0)
    assert ops[3] == ("Add", [r[0], r[2] + "_copy"], [r[0]], 0)


def test_allreduce8(gpus8) -> None:
    ops = run_allreduce(list(range(8)), muji.Allreduce8)
    r = [f"testblob_gpu_{i}_reduced" for i in range(8)]
    assert [(t, o[0], d) for t, _, o, d in ops] == [
        ("Add", r[0], 0), ("Add", r[2], 2), ("Add", r[4], 4), ("Add", r[6], 6),
        ("Add", r[0], 0), ("Add", r[4], 4),
        ("Copy", r[4] + "_copy", 0), ("Add", r[0], 0),
        ("Copy", r[4], 4), ("Copy", r[2], 2), ("Copy", r[6], 6),
        ("Copy", r[1], 1), ("Copy", r[3], 3), ("Copy", r[5], 5), ("Copy", r[7], 7),
    ]


def test_allreduce_fallback(gpus8) -> None:
    ops = run_allreduce([0, 1, 2], muji.AllreduceFallback)
    r0 = "testblob_gpu_0_reduced"
    assert ops == [
        ("Copy", ["testblob_gpu_0"], [r0], 0),
        ("Copy", ["testblob_gpu_1"], [r0 + "_temp_copy"], 0),
        ("Add", [r0 + "_temp_copy", r0], [r0], 0),
        ("Copy", ["testblob_gpu_2"], [r0 + "_temp_copy"], 0),
        ("Add", [r0 + "_temp_copy", r0], [r0], 0),
        ("Copy", [r0], ["testblob_gpu_1_reduced"], 1),
        ("Copy", [r0], ["testblob_gpu_2_reduced"], 2),
    ]


def test_fallback_in_place_with_empty_affix(gpus8) -> None:
    ops = run_allreduce([0, 1], muji.AllreduceFallback, affix="")
    assert ops[0] == ("Copy", ["testblob_gpu_1"], ["testblob_gpu_0_temp_copy"], 0)


@pytest.mark.parametrize("ids", [[0], [3], [0, 1, 2]])
def test_allreduce_single_and_odd_counts_fall_back(gpus8, ids) -> None:
    ops = run_allreduce(ids, muji.Allreduce)
    assert ops[0][0] == "Copy"


def _first_types(ids, peer=None):
    workspace.SetVirtualGpus(8, peer_access=peer)
    return [t for t, *_ in run_allreduce(ids, muji.Allreduce)]


def test_allreduce_dispatch_on_peer_access() -> None:
    assert _first_types([0, 1]) == ["Add", "Copy"]
    assert len(_first_types(list(range(4)))) == 6
    peer = np.zeros((8, 8), dtype=bool)
    peer[:2, :2] = peer[2:4, 2:4] = True
    types = _first_types(list(range(4)), peer)
    assert types[:4] == ["Add", "Add", "Copy", "Add"]  # Allreduce4Group2
    types = _first_types(list(range(8)), peer)
    assert types[0] == "Copy"  # no full access: fallback
    assert len(_first_types(list(range(8)))) == 15


def test_gpu_indices_length_mismatch() -> None:
    with pytest.raises(DeviceError, match="mismatch: 1 vs 2") as info:
        muji.Allreduce(core.Net("bad"), ["a", "b"], gpu_indices=[0])
    assert isinstance(info.value, RuntimeError)  # Caffe2 raised RuntimeError
    assert "['a', 'b']" in str(info.value) and "one GPU index per blob" in str(info.value)


def test_explicit_device_option_overrides_scope(gpus8) -> None:
    net = core.Net("scoped")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 5)), core.NameScope("ns"):
        muji.Allreduce2(net, ["x0", "x1"], "_r", [2, 3])
    assert [(list(op.input), op.device_option.device_id) for op in net.Proto().op] == [
        (["x0", "x1"], 2), (["x0_r"], 3)]
