"""muji: Caffe2's muji_test cases on virtual GPUs, plus the dispatch and op-structure
facts of caffe2-behavior-facts.md §3 / caffe2-api-facts.md §9."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from dpgraph import core, muji, workspace
from dpgraph.proto import caffe2_pb2


@pytest.fixture(autouse=True)
def _virtual_gpus() -> Iterator[None]:
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(8)
    yield
    workspace.ResetWorkspace()
    workspace.SetVirtualGpus(0)


def set_pattern(monkeypatch: pytest.MonkeyPatch, pattern: np.ndarray) -> None:
    monkeypatch.setattr(workspace, "GetGpuPeerAccessPattern", lambda: pattern)


def groups(n: int, *blocks: tuple[int, int]) -> np.ndarray:
    pattern = np.eye(n, dtype=bool)
    for lo, hi in blocks:
        pattern[lo:hi, lo:hi] = True
    return pattern


def RunningAllreduceWithGPUs(gpu_ids: Sequence[int], allreduce_function: Callable,
                             affix: str = "_reduced") -> tuple[list[Any], Any]:
    """Caffe2's muji_test helper, returning the result and the net for inspection."""
    net = core.Net("mujitest")
    for id in gpu_ids:
        net.ConstantFill([], "testblob_gpu_" + str(id), shape=[1, 2, 3, 4],
                         value=float(id + 1), device_option=muji.OnGPU(id))
    result = allreduce_function(net, ["testblob_gpu_" + str(i) for i in gpu_ids], affix,
                                gpu_ids)
    workspace.RunNetOnce(net)
    target_value = sum(gpu_ids) + len(gpu_ids)
    for idx in gpu_ids:
        blob = workspace.FetchBlob("testblob_gpu_" + str(idx) + affix)
        np.testing.assert_array_equal(blob, target_value,
                                      err_msg=f"gpu id {idx} of {gpu_ids}")
        assert blob.shape == (1, 2, 3, 4)
    return list(result), net


def added_ops(net: Any, n_fills: int) -> list[tuple[str, list[str], list[str], int]]:
    return [(op.type, list(op.input), list(op.output), op.device_option.device_id)
            for op in net.Proto().op[n_fills:]]


def r(i: int) -> str:
    return f"testblob_gpu_{i}_reduced"


def b(i: int) -> str:
    return f"testblob_gpu_{i}"


# ----------------------------------------------------------- muji_test.py cases

def test_allreduce_fallback() -> None:
    RunningAllreduceWithGPUs(list(range(workspace.NumGpuDevices())), muji.AllreduceFallback)


def test_allreduce_single_gpu() -> None:
    for i in range(workspace.NumGpuDevices()):
        result, net = RunningAllreduceWithGPUs([i], muji.Allreduce)
        assert [str(x) for x in result] == [r(i)]
        assert added_ops(net, 1) == [("Copy", [b(i)], [r(i)], i)]
        np.testing.assert_array_equal(workspace.FetchBlob(r(i)), i + 1)


def test_allreduce_with_two_gpus() -> None:
    pattern = workspace.GetGpuPeerAccessPattern()
    assert np.all(pattern[:2, :2])
    result, net = RunningAllreduceWithGPUs([0, 1], muji.Allreduce2)
    assert [str(x) for x in result] == [r(0), r(1)]
    assert added_ops(net, 2) == [("Add", [b(0), b(1)], [r(0)], 0), ("Copy", [r(0)], [r(1)], 1)]


def test_allreduce_with_four_gpus() -> None:
    result, net = RunningAllreduceWithGPUs([0, 1, 2, 3], muji.Allreduce4)
    assert [str(x) for x in result] == [r(i) for i in range(4)]
    assert added_ops(net, 4) == [
        ("Add", [b(0), b(1)], [r(0)], 0), ("Add", [b(2), b(3)], [r(2)], 2),
        ("Add", [r(0), r(2)], [r(0)], 0), ("Copy", [r(0)], [r(2)], 2),
        ("Copy", [r(0)], [r(1)], 1), ("Copy", [r(2)], [r(3)], 3),
    ]


def test_allreduce_with_four_gpus_and_two_groups() -> None:
    result, net = RunningAllreduceWithGPUs([0, 1, 2, 3], muji.Allreduce4Group2)
    assert [str(x) for x in result] == [r(i) for i in range(4)]
    assert added_ops(net, 4) == [
        ("Add", [b(0), b(1)], [r(0)], 0), ("Add", [b(2), b(3)], [r(2)], 2),
        ("Copy", [r(2)], [r(2) + "_copy"], 0), ("Add", [r(0), r(2) + "_copy"], [r(0)], 0),
        ("Copy", [r(0)], [r(2)], 2), ("Copy", [r(0)], [r(1)], 1), ("Copy", [r(2)], [r(3)], 3),
    ]


def test_allreduce_with_eight_gpus() -> None:
    result, net = RunningAllreduceWithGPUs(list(range(8)), muji.Allreduce8)
    assert [str(x) for x in result] == [r(i) for i in range(8)]
    assert added_ops(net, 8) == [
        ("Add", [b(0), b(1)], [r(0)], 0), ("Add", [b(2), b(3)], [r(2)], 2),
        ("Add", [b(4), b(5)], [r(4)], 4), ("Add", [b(6), b(7)], [r(6)], 6),
        ("Add", [r(0), r(2)], [r(0)], 0), ("Add", [r(4), r(6)], [r(4)], 4),
        ("Copy", [r(4)], [r(4) + "_copy"], 0), ("Add", [r(0), r(4) + "_copy"], [r(0)], 0),
        ("Copy", [r(0)], [r(4)], 4), ("Copy", [r(0)], [r(2)], 2), ("Copy", [r(4)], [r(6)], 6),
        ("Copy", [r(0)], [r(1)], 1), ("Copy", [r(2)], [r(3)], 3), ("Copy", [r(4)], [r(5)], 5),
        ("Copy", [r(6)], [r(7)], 7),
    ]


def test_fallback_ops() -> None:
    _, net = RunningAllreduceWithGPUs([0, 1, 2], muji.AllreduceFallback)
    tmp = r(0) + "_temp_copy"
    assert added_ops(net, 3) == [
        ("Copy", [b(0)], [r(0)], 0),
        ("Copy", [b(1)], [tmp], 0), ("Add", [tmp, r(0)], [r(0)], 0),
        ("Copy", [b(2)], [tmp], 0), ("Add", [tmp, r(0)], [r(0)], 0),
        ("Copy", [r(0)], [r(1)], 1), ("Copy", [r(0)], [r(2)], 2),
    ]


# ----------------------------------------------------------- Allreduce dispatch

def _dispatch(monkeypatch: pytest.MonkeyPatch, ids: list[int], pattern: np.ndarray) -> list:
    set_pattern(monkeypatch, pattern)
    _, net = RunningAllreduceWithGPUs(ids, muji.Allreduce)
    return added_ops(net, len(ids))


def test_dispatch_two_full(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1], groups(8, (0, 8)))
    assert [op[0] for op in ops] == ["Add", "Copy"]


def test_dispatch_two_without_peer_access(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1], np.eye(2, dtype=bool))
    assert ops[0] == ("Copy", [b(0)], [r(0)], 0)  # fallback


def test_dispatch_three_is_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1, 2], groups(8, (0, 8)))
    assert ops[1][2] == [r(0) + "_temp_copy"]


def test_dispatch_four_full(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1, 2, 3], groups(4, (0, 4)))
    assert len(ops) == 6 and not any(o[2][0].endswith("_copy") for o in ops)


def test_dispatch_four_two_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1, 2, 3], groups(4, (0, 2), (2, 4)))
    assert ops[2] == ("Copy", [r(2)], [r(2) + "_copy"], 0)


def test_dispatch_four_no_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1, 2, 3], groups(4, (0, 2)))
    assert ops[1][2] == [r(0) + "_temp_copy"]


def test_dispatch_eight_full(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, list(range(8)), groups(8, (0, 8)))
    assert len(ops) == 15 and ops[6][2] == [r(4) + "_copy"]


def test_dispatch_eight_two_groups_is_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, list(range(8)), groups(8, (0, 4), (4, 8)))
    assert ops[0] == ("Copy", [b(0)], [r(0)], 0)


def test_dispatch_without_gpus_is_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1], np.array([]))
    assert ops[0] == ("Copy", [b(0)], [r(0)], 0)


def test_dispatch_small_pattern_is_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _dispatch(monkeypatch, [0, 1, 2, 3], groups(2, (0, 2)))
    assert ops[0] == ("Copy", [b(0)], [r(0)], 0)


# ----------------------------------------------------------- other facts

def test_gpu_indices_default_and_mismatch() -> None:
    net = core.Net("muji_default")
    out = muji.Allreduce(net, ["x", "y"])
    assert [str(o) for o in out] == ["x_reduced", "y_reduced"]
    assert [op.device_option.device_id for op in net.Proto().op] == [0, 1]
    with pytest.raises(RuntimeError, match="gpu_indices length and blobs length mismatch: 1 vs 2"):
        muji.Allreduce(net, ["x", "y"], gpu_indices=[0])


def test_returns_blob_references() -> None:
    net = core.Net("muji_refs")
    for fn, n in ((muji.Allreduce2, 2), (muji.Allreduce4, 4), (muji.Allreduce4Group2, 4),
                  (muji.Allreduce8, 8), (muji.AllreduceFallback, 3)):
        out = fn(net, [f"{fn.__name__}_{i}" for i in range(n)], "_red", list(range(n)))
        assert len(out) == n
        assert all(isinstance(o, core.BlobReference) for o in out)
        assert [str(o) for o in out] == [f"{fn.__name__}_{i}_red" for i in range(n)]


def test_explicit_device_option_overrides_device_scope() -> None:
    net = core.Net("muji_scope")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
        muji.Allreduce2(net, ["a", "b"], "_r", [2, 3])
    for op, gpu in zip(net.Proto().op, (2, 3)):
        assert op.device_option.device_type == workspace.GpuDeviceType
        assert op.device_option.device_id == gpu


def test_only_add_and_copy_ops() -> None:
    net = core.Net("muji_types")
    muji.Allreduce8(net, [f"t{i}" for i in range(8)], "_reduced", list(range(8)))
    muji.AllreduceFallback(net, [f"u{i}" for i in range(5)], "_reduced", list(range(5)))
    assert {op.type for op in net.Proto().op} == {"Add", "Copy"}
    assert all(op.HasField("device_option") for op in net.Proto().op)


def test_non_contiguous_gpu_indices() -> None:
    result, net = RunningAllreduceWithGPUs([5, 2, 7], muji.Allreduce)
    assert [str(x) for x in result] == [r(5), r(2), r(7)]
    assert {op.device_option.device_id for op in net.Proto().op[3:]} == {5, 2, 7}


def test_in_place_with_empty_affix() -> None:
    """Detectron's ``reduced_affix=''``: every device's own gradient holds the sum."""
    for fn, ids in ((muji.Allreduce2, [0, 1]), (muji.Allreduce4, [0, 1, 2, 3]),
                    (muji.Allreduce4Group2, [0, 1, 2, 3]), (muji.Allreduce8, list(range(8))),
                    (muji.AllreduceFallback, [0, 1, 2])):
        workspace.ResetWorkspace()
        result, net = RunningAllreduceWithGPUs(ids, fn, affix="")
        assert [str(x) for x in result] == [b(i) for i in ids]
    net = core.Net("fallback_inplace")
    muji.AllreduceFallback(net, ["g0", "g1"], "", [0, 1])
    assert [(op.type, list(op.input), list(op.output)) for op in net.Proto().op] == [
        ("Copy", ["g1"], ["g0_temp_copy"]), ("Add", ["g0_temp_copy", "g0"], ["g0"]),
        ("Copy", ["g0"], ["g1"])]


def test_on_cpu_devices_give_same_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec allows swapping the device option to CPU; arithmetic and names hold."""
    monkeypatch.setattr(muji, "OnGPU", lambda gpu_id: muji.OnCPU())
    workspace.SetVirtualGpus(0)
    set_pattern(monkeypatch, groups(4, (0, 4)))
    result, net = RunningAllreduceWithGPUs([0, 1, 2, 3], muji.Allreduce)
    assert {op.device_option.device_type for op in net.Proto().op} == {caffe2_pb2.CPU}
    assert [str(x) for x in result] == [r(i) for i in range(4)]


def test_allreduce_on_gradients_of_a_parallel_model() -> None:
    """Detectron's ``_add_allreduce_graph``: in place on each device's gradient."""
    net = core.Net("detectron_like")
    for gpu in range(4):
        net.ConstantFill([], f"gpu_{gpu}/fc_w_grad", shape=[2], value=float(gpu),
                         device_option=muji.OnGPU(gpu))
    grads = [core.BlobReference(f"gpu_{gpu}/fc_w_grad") for gpu in range(4)]
    with core.DeviceScope(muji.OnGPU(0)):
        muji.Allreduce(net, grads, reduced_affix="")
    workspace.RunNetOnce(net)
    for gpu in range(4):
        np.testing.assert_array_equal(workspace.FetchBlob(f"gpu_{gpu}/fc_w_grad"), [6.0, 6.0])


def test_no_blobs_reduce_to_nothing() -> None:
    net = core.Net("muji_empty")
    assert muji.AllreduceFallback(net, [], "_reduced", []) == []
    assert muji.Allreduce(net, []) == []
    assert len(net.Proto().op) == 0


def test_peer_pattern_patched_through_module_global() -> None:
    """``mock.patch.object(muji.workspace, 'GetGpuPeerAccessPattern', ...)`` as Caffe2-era
    tests write it: ``muji.workspace`` is the workspace module."""
    from unittest import mock

    assert muji.workspace is workspace
    with mock.patch.object(muji.workspace, "GetGpuPeerAccessPattern",
                           return_value=groups(4, (0, 2), (2, 4))):
        _, net = RunningAllreduceWithGPUs([0, 1, 2, 3], muji.Allreduce)
    assert added_ops(net, 4)[2] == ("Copy", [r(2)], [r(2) + "_copy"], 0)
    with mock.patch("dpgraph.muji.workspace.GetGpuPeerAccessPattern",
                    return_value=np.eye(2, dtype=bool)):
        _, net = RunningAllreduceWithGPUs([0, 1], muji.Allreduce)
    assert added_ops(net, 2)[0] == ("Copy", [b(0)], [r(0)], 0)
